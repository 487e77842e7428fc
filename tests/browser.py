"""What the browser tests share: the system Chromium (skip without it, fail in CI) and where
screenshots go. The `browser` fixture itself is in conftest.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.testing import ROOT

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"  # screenshots, for a person to look at after a run


def require_chromium() -> None:
    """Skip the calling module without Chromium; in CI a missing Chromium is an error."""
    if Path(CHROMIUM).exists():
        return
    if os.environ.get("CI"):
        raise RuntimeError(f"{CHROMIUM} is missing and CI is set: `apt-get install chromium`")
    pytest.skip(f"{CHROMIUM} is missing (install Debian's chromium to run the browser tests)",
                allow_module_level=True)
