"""A newcomer's first ten minutes in a real Chromium, clicked as a person would: the Compare
tab's untouched defaults writing degenerate output (folded), an emoji-only question (a
message before any model runs), the Ask and Compare buttons while a run goes (disabled,
saying why), and a search whose documents the model only partly read (marked).

The app runs in this process on loopback. The models are the scripted backend (a test
double) writing what the nano GRPO pair really wrote on the Compare tab's default question;
the default model is the shipped nano agent's id, so the reading check reads its real
tokenizer (assets/nano-agent) while no real model runs. The retriever is a test double
returning given documents. Screenshots go to test-artifacts/ for a person to look at.
"""

from __future__ import annotations

import re

import pytest

from agent.backends.base import ModelLoadError
from agent.models import ROOT
from agent.testing import free_port
from retriever.doc import Doc
from tests.browser import ARTIFACTS, require_chromium
from tests.scripted_backend import ScriptedBackend

pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_chromium()
if not (ROOT / "assets" / "nano-agent" / "tokenizer.json").is_file():
    pytest.skip("assets/nano-agent is not in this checkout", allow_module_level=True)

ZEROS = "2" + "0" * 485  # the nano GRPO pair's answer to "when was facebook founded"
RUN_OF_20 = re.compile(r"(\S)\1{19}")
PAIR = ("test/grpo", "test/llds")
ASK_BUSY = "Running… (Stop to ask another)"
COMPARE_BUSY = "Running… (Stop to compare again)"
CUT_NOTE = "not seen by the model (the observation is cut at 500 tokens, as Search-R1 does)"


def degenerate(closed: bool):
    """What the nano GRPO pair wrote: a search, then "2" and 485 zeros as an answer (left
    open by A, an invalid action; closed by B), then turns of zeros."""
    def script(question: str, turn: int) -> str:
        if "slowly" in question:
            return "<think> " + " ".join(f"step{i}" for i in range(400)) + " </think>"
        if "long" in question:  # the documents-cut question
            return ("<think> look </think>\n<search> long documents </search>" if turn == 0
                    else "<answer> Document 1 </answer>")
        if turn == 0:
            return "<think> I should search. </think>\n<search> facebook founded </search>"
        if turn == 1:
            return f"<think> The year. </think>\n<answer> {ZEROS}" + (" </answer>" if closed
                                                                        else "")
        return "Doc 1" + "0" * 497 + " " + "0 " * 60
    return script


class Factory:
    """A scripted backend per model; records what it was asked to load."""

    def __init__(self):
        self.loaded: list[str] = []

    def __call__(self, model: str):
        self.loaded.append(model)
        if model.startswith("bad/"):
            raise ModelLoadError(f"{model} is not in the local Hugging Face cache (test)")
        return ScriptedBackend(degenerate(closed=model == PAIR[1]), delay=0.02)


def long_doc(i: int, words: int) -> Doc:
    text = " ".join(f"word{i}x{j}" for j in range(words))
    return Doc(str(i), f'"Document {i}"\n{text}', 10.0 - i)


class Retriever:
    """Three long documents for "long documents" (the scripted backend counts a token a
    word, so the 500-token observation ends inside the second); three short ones else."""

    def search(self, queries, topk=3):
        return [[long_doc(i, 300 if "long" in q else 30) for i in range(1, topk + 1)]
                for q in queries]


@pytest.fixture(scope="module")
def factory():
    return Factory()


@pytest.fixture(scope="module")
def app_url(factory):
    from app.ui import build_app, launch_options

    demo = build_app(factory, Retriever(), default_model="nano", compare_pair=PAIR)
    port = free_port()
    demo.launch(**launch_options(port=port, prevent_thread_lock=True, quiet=True))
    yield f"http://127.0.0.1:{port}/"
    demo.close()


def open_page(browser, url: str, width: int = 1400):
    page = browser.new_context(viewport={"width": width, "height": 1100}).new_page()
    page.goto(url)
    page.locator("#ask-button").wait_for()
    return page


@pytest.fixture
def page(browser, app_url):
    page = open_page(browser, app_url)
    yield page
    page.context.close()


def ask(page, question: str) -> None:
    page.locator("#ask-question textarea").fill(question)
    page.locator("#ask-button").click()


def test_compare_defaults_show_degenerate_output_folded(page):
    """The pre-filled question and the default pair, with the repetition stop unticked (the
    published protocol: each turn runs to its budget); "2" and 485 zeros read "2 [0 × 485]"
    in the chats (thoughts, answers, invalid turns) and in the table."""
    from playwright.sync_api import expect

    page.locator("#ask-stop-repeats input").uncheck()
    page.get_by_role("tab", name="Compare").click()
    page.locator("#compare-button").click()
    table = page.locator("#compare-table")
    expect(table).to_contain_text("2 [0 × 485]", timeout=60_000)  # B closed its answer
    for side in ("a", "b"):
        chat = page.locator(f"#compare-chat-{side}")
        expect(chat).to_contain_text("No answer within the turn limit" if side == "a"
                                     else "Answer: 2 [0 × 485]", timeout=60_000)
    chat_a = page.locator("#compare-chat-a")
    expect(chat_a).to_contain_text("Answer: 2 [0 × 485]")  # its unclosed answer
    expect(chat_a).to_contain_text("Doc 1 [0 × 497]")  # a turn of zeros: an invalid action
    for button in chat_a.get_by_role("button", name="Invalid action").all():
        button.click()
    expect(chat_a).to_contain_text("My previous action is invalid")
    for where in ("#compare-chat-a", "#compare-chat-b", "#compare-table"):
        text = page.locator(where).inner_text()
        assert not RUN_OF_20.search(text), (where, text[:300])
    page.screenshot(path=str(ARTIFACTS / "newcomer-compare-folded.png"), full_page=True)


def test_an_emoji_only_question_gets_a_message_before_any_model_runs(page, factory):
    from playwright.sync_api import expect

    before = list(factory.loaded)
    ask(page, "🚀🔥🌍")
    chat = page.locator("#ask-chat")
    expect(chat).to_contain_text("This model cannot read the question.", timeout=20_000)
    for name in ("U+1F680", "U+1F525", "U+1F30D", "Please ask in words"):
        expect(chat).to_contain_text(name)
    expect(chat).not_to_contain_text("Search:")
    assert factory.loaded == before  # no model was loaded, so none ran
    expect(page.locator("#ask-button")).to_be_enabled()
    page.screenshot(path=str(ARTIFACTS / "newcomer-emoji.png"), full_page=True)


def test_ask_is_disabled_while_a_question_runs_and_back_on_stop_and_on_failure(page):
    from playwright.sync_api import expect

    button = page.locator("#ask-button")
    expect(button).to_have_text("Ask")
    ask(page, "Think slowly about everything")
    chat = page.locator("#ask-chat")
    expect(chat).to_contain_text("step5", timeout=30_000)
    expect(button).to_be_disabled()
    expect(button).to_have_text(ASK_BUSY)  # the reason, on the button itself
    # Enter in the question box is refused out loud, not dropped in silence.
    page.locator("#ask-question textarea").fill("Another question?")
    page.locator("#ask-question textarea").press("Enter")
    expect(page.get_by_text("A question is running: press Stop to ask another")).to_be_visible(
        timeout=10_000)
    page.screenshot(path=str(ARTIFACTS / "newcomer-ask-running.png"), full_page=True)
    page.locator("#ask-stop").click(no_wait_after=True)
    expect(chat).to_contain_text("Stopped", timeout=10_000)
    expect(button).to_be_enabled(timeout=10_000)
    expect(button).to_have_text("Ask")
    assert "Another question?" not in chat.inner_text()  # the refused question never ran
    # A run that fails (its model can't load) gives the button back too.
    model = page.locator("#ask-model input")
    model.fill("bad/model")
    model.press("Enter")
    ask(page, "Who directed 2001: A Space Odyssey?")
    expect(chat).to_contain_text("could not be loaded", timeout=20_000)
    expect(button).to_be_enabled(timeout=10_000)
    expect(button).to_have_text("Ask")


def test_compare_is_disabled_while_it_runs_and_back_at_the_end(page):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Compare").click()
    button = page.locator("#compare-button")
    button.click()
    expect(button).to_be_disabled(timeout=10_000)
    expect(button).to_have_text(COMPARE_BUSY)
    expect(page.locator("#compare-table")).to_contain_text("stopped: repeating itself",
                                                           timeout=60_000)
    expect(button).to_be_enabled(timeout=10_000)
    expect(button).to_have_text("Compare")


def test_the_documents_panel_marks_what_the_model_did_not_read(page):
    from playwright.sync_api import expect

    chat = page.locator("#ask-chat")
    ask(page, "Which documents are long?")
    expect(chat).to_contain_text("Answer: Document 1", timeout=30_000)
    panel = chat.get_by_role("button", name="Search: long documents")
    expect(panel).to_contain_text("3 documents · the model read 1 and part of the 2nd")
    panel.click()
    expect(chat).to_contain_text("3. Document 3 · score 7.00 · " + CUT_NOTE)
    expect(chat).to_contain_text("2. Document 2 · score 8.00 · read in part")
    text = chat.inner_text()
    # Where the cut fell: the model's last word of doc 2, then the mark, then the rest.
    read, mark, rest = text.partition("[cut here: the model read no further]")
    assert mark, text[:2000]
    last = read.split()[-1]
    assert re.fullmatch(r"word2x\d+", last) and rest.split()[0].startswith("word2x"), last
    show_the_cut(page)
    page.screenshot(path=str(ARTIFACTS / "newcomer-documents-cut.png"), full_page=True)


def show_the_cut(page) -> None:
    """Scroll the chat to the cut mark, once the opened panel has slid open."""
    from playwright.sync_api import expect

    mark = page.locator("#ask-chat strong", has_text="cut here: the model read no further")
    expect(mark).to_be_visible()
    page.wait_for_timeout(600)  # the panel's slide-open transition
    mark.scroll_into_view_if_needed()


@pytest.mark.parametrize("width", [1400, 1000])
def test_ask_and_compare_read_well_at_1400_and_1000_px(browser, app_url, width):
    """After a run, each tab fits the window (no sideways scroll) and the running button's
    label is not cut off; screenshots for a person to look at."""
    from playwright.sync_api import expect

    page = open_page(browser, app_url, width)
    ask(page, "Which documents are long?")
    expect(page.locator("#ask-chat")).to_contain_text("Answer: Document 1", timeout=30_000)
    page.locator("#ask-chat").get_by_role("button", name="Search: long documents").click()
    show_the_cut(page)
    page.screenshot(path=str(ARTIFACTS / f"newcomer-ask-{width}.png"), full_page=True)
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    page.get_by_role("tab", name="Compare").click()
    button = page.locator("#compare-button")
    button.click()
    expect(button).to_have_text(COMPARE_BUSY, timeout=10_000)
    assert button.evaluate("e => e.scrollWidth <= e.clientWidth + 1")  # the label fits
    page.screenshot(path=str(ARTIFACTS / f"newcomer-compare-running-{width}.png"),
                    full_page=True)
    expect(page.locator("#compare-table")).to_contain_text("stopped: repeating itself",
                                                           timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / f"newcomer-compare-{width}.png"), full_page=True)
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    page.context.close()


def fonts_of(page, selector: str) -> list[str]:
    """The fonts Chromium really drew an element's text with (after any fallback)."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    return [f["familyName"] for f in cdp.send("CSS.getPlatformFontsForNode",
                                              {"nodeId": node})["fonts"]]


SPLIT_WORDS = """e => {
  // Words of a header drawn on two lines (a word broken inside, "likelihoo d").
  const split = [];
  for (const th of e.querySelectorAll('th')) {
    const walker = document.createTreeWalker(th, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.textContent.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
        if (tops.size > 1) split.push(m[0]);
      }
    }
  }
  return split;
}"""


def test_the_title_is_drawn_in_one_font_and_table_headers_break_between_words(page):
    """Gradio's semibold Source Sans file holds 55 glyphs: the title took its "A" from it
    and its other letters from a fallback font. And the summary table's headers broke
    "likelihood" inside the word."""
    from playwright.sync_api import expect

    assert fonts_of(page, "h1") == ["Source Sans 3"]  # the full Source Sans Bold file
    expect(page.locator("h1")).to_have_text("LLDS Search-Agent Studio")
    page.get_by_role("tab", name="Training curves").click()
    page.locator("#curves-bundled").click()
    summary = page.locator("#curves-summary")
    expect(summary).to_contain_text("likelihood peak step", timeout=120_000)
    assert summary.evaluate(SPLIT_WORDS) == []
    summary.screenshot(path=str(ARTIFACTS / "newcomer-curves-headers.png"))
