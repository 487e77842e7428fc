"""`python -m app.curves ...` runs `python -m curves ...` (the command's old name)."""

import sys

from curves.__main__ import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m app.curves"))
