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


def open_tab(page, name: str) -> None:
    """Click a tab as a visitor does: in the tab bar, or in its "More tabs" menu where a
    narrow window (390 px) has folded it."""
    page.locator("#ask-button").wait_for()
    tab = page.get_by_role("tab", name=name)
    if tab.is_visible():
        tab.click()
        return
    page.get_by_role("button", name="More tabs").click()
    page.locator(".overflow-dropdown button", has_text=name).click()


def open_details(page) -> str:
    """Open the Training-curves tab's folded details, as a visitor does, and read them."""
    from playwright.sync_api import expect

    details = page.locator("#curves-details")
    if not details.is_visible():
        page.locator("#curves-details-box").get_by_text("Details:").click()
    expect(details).to_be_visible()
    return details.inner_text()
