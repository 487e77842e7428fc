"""The README's pictures, made again by driving the studio in Chromium as a visitor would.

    python -m app.screenshots [--out docs/images] [--widths 1400]

Starts `python app.py` offline (its defaults: the nano agent, the embedded corpus) on a free
loopback port, then for each width: asks the first suggested question in the Ask tab and
opens its search (ask-<width>.png), and plots the bundled runs in the Training-curves tab
(curves-<width>.png). Needs Playwright and Debian's Chromium (`apt-get install chromium`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agent.testing import ROOT, free_port, start_process, stop_process

CHROMIUM = "/usr/bin/chromium"
WAIT_MS = 240_000  # a model's first answer on a busy 2-core machine


def ask(page, out: Path) -> None:
    from playwright.sync_api import expect

    page.locator("#ask-button").wait_for()
    expect(page.locator("#ask-model-status")).to_contain_text("loaded", timeout=WAIT_MS)
    page.locator("#ask-nano-examples button").first.click()
    chat = page.locator("#ask-chat")
    expect(chat).to_contain_text("Answer:", timeout=WAIT_MS)
    chat.get_by_role("button", name="Search:").first.click()
    expect(page.locator("#ask-stats")).to_contain_text("answered")
    page.screenshot(path=str(out))


def curves(page, out: Path) -> None:
    from playwright.sync_api import expect

    page.locator("#ask-button").wait_for()
    tab = page.get_by_role("tab", name="Training curves")
    if tab.is_visible():
        tab.click()
    else:  # a narrow window folds it into the "More tabs" menu
        page.get_by_role("button", name="More tabs").click()
        page.locator(".overflow-dropdown button", has_text="Training curves").click()
    page.locator("#curves-bundled").click()
    expect(page.locator("#curves-summary")).to_be_visible(timeout=WAIT_MS)
    # The reward panel: GRPO's collapse beside LLDS-A, with the marked run's phases.
    reward = page.locator(".js-plotly-plot").filter(has_text="Reward").first
    reward.scroll_into_view_if_needed()
    page.wait_for_timeout(1500)  # plotly lays its labels out after the first paint
    reward.screenshot(path=str(out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.screenshots",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    parser.add_argument("--widths", default="1400",
                        help="viewport widths in pixels, comma-separated")
    args = parser.parse_args(argv)
    try:
        widths = [int(w) for w in args.widths.split(",") if w.strip()]
    except ValueError:
        parser.error(f"--widths {args.widths!r}: give whole numbers, e.g. 1400,1000,390")
    if not Path(CHROMIUM).exists():
        print(f"error: {CHROMIUM} is missing: apt-get install chromium", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    studio = start_process(["app.py", "--port", str(port)], url, timeout=240,
                           env={"HF_HUB_OFFLINE": "1", "LLDS_MODEL": ""})
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM)
            for width in widths:
                for shoot in (ask, curves):
                    page = browser.new_page(viewport={"width": width, "height": 1000})
                    page.goto(url)
                    out = args.out / f"{shoot.__name__}-{width}.png"
                    shoot(page, out)
                    page.close()
                    print(out)
            browser.close()
    finally:
        stop_process(studio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
