"""Start the studio (`python app.py [flags]`, as Hugging Face Spaces run it): the same as
`python -m app`; the flags and what they do are in app/__main__.py (`--help`)."""

from app.__main__ import main

if __name__ == "__main__":
    main()
