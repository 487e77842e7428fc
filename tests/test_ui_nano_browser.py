"""End to end in a real Chromium with the shipped nano agent: `python app.py` with no flags,
offline (HF_HUB_OFFLINE=1), as a user on a CPU machine starts it. A question gets a search
panel with the query and its documents, and the answer, from the model itself (no scripted
backend). Runs once `assets/nano-agent` is in the checkout."""

from __future__ import annotations

import json

import pytest

from agent.testing import ROOT, free_port, start_process, stop_process
from tests.browser import ARTIFACTS, require_chromium

NANO_DIR = ROOT / "assets" / "nano-agent"
EXAMPLES = ROOT / "assets" / "ask_examples.json"
COMPARE = ROOT / "assets" / "compare_example.json"
pytestmark = [pytest.mark.browser, pytest.mark.slow]

if not (NANO_DIR / "config.json").is_file():
    pytest.skip("assets/nano-agent is not in this checkout yet", allow_module_level=True)
require_chromium()


def first_example() -> dict:
    """The first of the Ask tab's nano examples (a held-out question it answers right)."""
    if not EXAMPLES.is_file():
        pytest.fail("assets/ask_examples.json is missing: run `python -m app.ui.examples` "
                    "(it picks the held-out questions the nano agent answers)")
    return json.loads(EXAMPLES.read_text(encoding="utf-8"))["examples"][0]


@pytest.fixture(scope="module")
def studio_url():
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    # No flags: the default-model rule picks the nano agent (no GPU here, and offline).
    process = start_process(["app.py", "--port", str(port)], url, timeout=240,
                            env={"HF_HUB_OFFLINE": "1", "LLDS_MODEL": ""})
    yield url
    stop_process(process)


def test_compare_untouched_shows_the_pair_answering_its_default_as_they_really_do(
        browser, studio_url):
    """A fresh studio's Compare tab, untouched: the collapse-regime pair, labelled with what
    happened to each in training, on the question stored for that pair
    (assets/compare_example.json); both load at once and answer as measured: B (LLDS-A)
    right, A (GRPO, collapsed) not. The collapsed side is stopped by the studio's repetition
    stop (on by default), saying so, instead of writing ~2,000 tokens to the turn limit; a
    side never shows Gradio's loading dots (one that has finished would look unfinished)."""
    import time

    from playwright.sync_api import expect

    stored = json.loads(COMPARE.read_text(encoding="utf-8"))
    page = browser.new_context(viewport={"width": 1400, "height": 1100}).new_page()
    page.goto(studio_url)
    page.get_by_role("tab", name="Compare").click()
    expect(page.locator("#compare-question textarea")).to_have_value(stored["question"])
    assert "collapsed in training" in page.locator("#compare-model-a input").input_value()
    assert "did not collapse" in page.locator("#compare-model-b input").input_value()
    expect(page.locator("#ask-stop-repeats input")).to_be_checked()
    page.locator("#compare-button").click()
    table = page.locator("#compare-table")
    expect(table).to_contain_text("Ended", timeout=60_000)
    loading = page.locator('[aria-label="Loading response"]')
    deadline = time.monotonic() + 120  # a hang guard: the pair ends in seconds
    while "running" in table.inner_text() and time.monotonic() < deadline:
        assert loading.count() == 0, "a chat shows Gradio's loading dots"
        page.wait_for_timeout(200)
    expect(table).not_to_contain_text("running")
    for side in ("a", "b"):
        expect(page.locator(f"#compare-chat-{side}")).not_to_contain_text(
            "could not be loaded")
    expect(page.locator("#compare-chat-b")).to_contain_text(stored["answers"][1])
    chat_a = page.locator("#compare-chat-a")
    expect(chat_a).to_contain_text("repeated")
    expect(chat_a).to_contain_text("the published protocol would run on to the turn limit")
    lines = table.inner_text().splitlines()
    cells = [c.strip() for c in lines if c.startswith("Answer")]
    assert cells and stored["answers"][1] in cells[0]
    ended = next(c for c in lines if c.startswith("Ended"))
    assert "stopped: repeating itself" in ended and "answered" in ended, ended
    assert stored["em"] == [0, 1]
    page.screenshot(path=str(ARTIFACTS / "nano-compare.png"), full_page=True)
    page.context.close()


def test_compare_table_row_names_stay_whole_at_1000_px(browser, studio_url):
    """At 1000 px the long model labels squeezed the summary table's first column until its
    row names broke inside words ('Answe / r', 'Search / es'): each must sit on one line."""
    from playwright.sync_api import expect

    page = browser.new_context(viewport={"width": 1000, "height": 1100}).new_page()
    page.goto(studio_url)
    page.get_by_role("tab", name="Compare").click()
    page.locator("#compare-button").click()
    table = page.locator("#compare-table")
    expect(table).to_contain_text("Searches", timeout=60_000)
    expect(table).not_to_contain_text("running", timeout=120_000)
    lines = table.locator("tbody tr td:first-child").evaluate_all(
        """cells => cells.map(cell => {
            const range = document.createRange();
            range.selectNodeContents(cell);
            const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
            return [cell.innerText.trim(), tops.size];
        })""")
    assert [name for name, _ in lines] == ["Model", "Answer", "Searches", "Tokens", "Time",
                                           "Ended"]
    assert all(count == 1 for _, count in lines), lines
    page.screenshot(path=str(ARTIFACTS / "nano-compare-1000.png"), full_page=True)
    page.context.close()


def test_python_app_offline_answers_with_the_nano_agent(browser, studio_url):
    from playwright.sync_api import expect

    example = first_example()
    page = browser.new_context(viewport={"width": 1400, "height": 1100}).new_page()
    page.goto(studio_url)
    page.locator("#ask-button").wait_for()
    expect(page.locator("#ask-model-info")).to_contain_text("Not an LLDS checkpoint")
    # Warmed at start (and the page reads the status when it loads): no load on a question.
    expect(page.locator("#ask-model-status")).to_contain_text("loaded", timeout=60_000)
    page.locator("#ask-nano-examples button").first.click()  # the first example: asked
    expect(page.locator("#ask-question textarea")).to_have_value(example["question"])
    chat = page.locator("#ask-chat")
    expect(chat).to_contain_text("Search:", timeout=120_000)
    expect(chat).to_contain_text(f"Answer: {example['answer']}", timeout=120_000)
    search = chat.get_by_role("button", name="Search:").first
    query = search.inner_text().split("Search:", 1)[1].strip()
    assert query  # the model wrote a query
    search.click()
    for rank in ("1. ", "2. ", "3. "):  # the top-3 documents it got back, numbered
        expect(chat).to_contain_text(rank)
    expect(chat).to_contain_text(" · score ")
    expect(page.locator("#ask-stats")).to_contain_text("answer")
    page.screenshot(path=str(ARTIFACTS / "nano-ask.png"), full_page=True)
