"""The README as a landing page: short, its pictures and links present, the pictures made
again by the script it names (`python -m app.screenshots`, in Chromium)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from agent.testing import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_short_and_opens_with_what_it_is_and_the_two_commands():
    assert len(README.splitlines()) < 200
    body = README.split("\n---\n", 1)[1]  # after the Space's front matter
    first_screen = body[:body.index("## ")]
    assert "Run the app" in first_screen and "Run the tests:" in first_screen
    assert first_screen.index("Watch search agents") < first_screen.index("Run the app")


def test_every_picture_and_link_in_the_readme_and_docs_exists():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            assert (page.parent / target).exists(), f"{page.name}: {target}"
    for picture in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README):
        assert (ROOT / picture).stat().st_size > 10_000, picture


@pytest.mark.slow
@pytest.mark.browser
def test_the_screenshot_script_makes_the_pictures_again(tmp_path):
    from tests.browser import require_chromium

    require_chromium()
    done = subprocess.run([sys.executable, "-m", "app.screenshots", "--out", str(tmp_path),
                           "--widths", "1000"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("ask-1000.png", "curves-1000.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000, name
    bad = subprocess.run([sys.executable, "-m", "app.screenshots", "--widths", "wide"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "give whole numbers" in bad.stderr
