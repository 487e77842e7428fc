"""The studio in a real Chromium: the app runs in this process on loopback, with the scripted
backend (a test double) behind a backend factory and the real in-process bm25s retriever."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent.backends.base import ModelLoadError
from agent.testing import free_port
from retriever.doc import Doc
from tests.browser import ARTIFACTS, open_details, require_chromium
from tests.scripted_backend import ScriptedBackend

pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_chromium()

EVIL = Doc("evil", '"Evil <script>window.pwned=1</script> page"\nBody with <b>tags</b>.', 9.0)
IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")


def script(question: str, turn: int) -> str:
    """What the scripted model writes: a search, then an answer; a long think when slow;
    the question's Markdown image in its thoughts, query and answer when it has one."""
    if image := IMAGE.search(question):
        if turn == 0:
            return f"<think> see {image[0]} </think>\n<search> image test {image[0]} </search>"
        return f"<think> {image[0]} </think>\n<answer> Leonardo {image[0]} </answer>"
    if "slowly" in question:
        return "<think> " + " ".join(f"step{i}" for i in range(400)) + " </think>"
    if turn == 0:
        query = "script test" if "script" in question else "2001: A Space Odyssey director"
        return (f"<think> I should look it up <b>now</b>. </think>\n<search> {query} "
                "</search>")
    return "<think> The documents say Stanley Kubrick. </think>\n<answer> Stanley Kubrick " \
           "</answer>"


class Retriever:
    """The real bm25s retriever; the query "script test" gets a hostile document too, and
    "image test" one with the query's Markdown image in its title and text."""

    def __init__(self):
        from retriever.client import LocalRetriever

        self.real = LocalRetriever(engine="bm25s")

    def search(self, queries, topk=3):
        results = self.real.search(queries, topk)
        for query, docs in zip(queries, results, strict=True):
            if query == "script test":
                docs.insert(0, EVIL)
            if query.startswith("image test") and (image := IMAGE.search(query)):
                docs.insert(0, Doc("img", f'"Painting {image[0]}"\nBody {image[0]}', 9.0))
        return results


def backend_factory(model: str):
    if model.startswith("bad/"):
        raise ModelLoadError(f"{model} is not in the local Hugging Face cache (test)")
    return ScriptedBackend(script, delay=0.03)


@pytest.fixture(scope="module")
def app_url():
    from app.ui import build_app, launch_options

    demo = build_app(backend_factory, Retriever(), default_model="test/llds",
                     baseline_model="test/grpo")
    port = free_port()
    demo.launch(**launch_options(port=port, prevent_thread_lock=True, quiet=True))
    yield f"http://127.0.0.1:{port}/"
    demo.close()


class ImageHost(ThreadingHTTPServer):
    """A loopback server that records every path asked of it (and answers 404)."""

    def __init__(self):
        self.hits: list[str] = []
        host = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # the name http.server calls
                host.hits.append(self.path)
                self.send_error(404)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def image_host():
    host = ImageHost()
    threading.Thread(target=host.serve_forever, daemon=True).start()
    yield host
    host.shutdown()
    host.server_close()


@pytest.fixture
def page(browser, app_url):
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    page = context.new_page()
    page.goto(app_url)
    page.locator("#ask-button").wait_for()
    yield page
    context.close()


def expand(chat, title: str) -> None:
    """Open a finished (collapsed) panel by its title."""
    chat.get_by_role("button", name=title).first.click()


def ask(page, question: str) -> None:
    page.locator("#ask-question textarea").fill(question)
    page.locator("#ask-button").click()


def test_ask_shows_search_panel_documents_and_answer(page):
    from playwright.sync_api import expect

    chat = page.locator("#ask-chat")
    ask(page, "Who directed 2001: A Space Odyssey?")
    expect(chat).to_contain_text("Search: 2001: A Space Odyssey director", timeout=30_000)
    expect(chat).to_contain_text("Answer: Stanley Kubrick", timeout=30_000)
    expand(chat, "Search: 2001: A Space Odyssey director")
    expect(chat).to_contain_text("1. 2001: A Space Odyssey")  # the top document's title
    expect(page.locator("#ask-stats")).to_contain_text("1 search")
    expect(page.locator("#ask-export")).to_contain_text(".jsonl")
    page.screenshot(path=str(ARTIFACTS / "ask.png"), full_page=True)


def test_html_in_documents_and_model_text_shows_as_text(page):
    from playwright.sync_api import expect

    chat = page.locator("#ask-chat")
    ask(page, "Does the script test pass?")
    expect(chat).to_contain_text("Answer: Stanley Kubrick", timeout=30_000)
    expand(chat, "Search: script test")
    expand(chat, "Thought")
    expect(chat).to_contain_text("Evil <script>window.pwned=1</script> page")
    expect(chat).to_contain_text("Body with <b>tags</b>.")
    expect(chat).to_contain_text("look it up <b>now</b>.")
    assert chat.locator("script").count() == 0 and chat.locator("b", has_text="tags").count() == 0
    assert page.evaluate("window.pwned") is None
    page.screenshot(path=str(ARTIFACTS / "escaping.png"), full_page=True)


def test_markdown_images_in_question_thoughts_query_documents_and_answer_are_not_fetched(
        page, image_host):
    from playwright.sync_api import expect

    requested = []  # by any page of the context: a clicked link would open a new tab
    page.context.on("request", lambda request: requested.append(request.url)
                    if request.url.startswith(image_host.url) else None)
    chat = page.locator("#ask-chat")
    ask(page, f"Who painted it? ![pixel]({image_host.url}/x.png)")
    expect(chat).to_contain_text("Answer: Leonardo", timeout=30_000)
    # Opened by their left edge: the titles hold the url, which the chat shows as a link.
    panels = chat.get_by_role("button", name=re.compile("Search: image test|Thought"))
    for panel in panels.all():
        panel.click(position={"x": 8, "y": 8})
    expect(chat).to_contain_text("1. Painting")
    page.wait_for_timeout(500)
    page.screenshot(path=str(ARTIFACTS / "images-as-text.png"), full_page=True)
    assert requested == [] and image_host.hits == []
    assert chat.locator("img").count() == 0
    # Shown as written: the question, two thoughts, the query (a panel title), the
    # document's title and text, the answer.
    assert chat.inner_text().count(f"![pixel]({image_host.url}/x.png)") >= 7


def test_stop_ends_generation_early(page):
    from playwright.sync_api import expect

    chat = page.locator("#ask-chat")
    ask(page, "Think slowly about everything")
    expect(chat).to_contain_text("step5", timeout=30_000)
    # no_wait_after: the click is what is tested; there is no navigation to wait for.
    page.locator("#ask-stop").click(no_wait_after=True)
    expect(chat).to_contain_text("Stopped", timeout=10_000)
    # The script is 400 steps 0.03 s apart (12 s): its last step never shows once Stop has
    # cut it short (a content check, so a busy machine's timing cannot fail it).
    assert "step399" not in chat.inner_text()
    expect(page.locator("#ask-stats")).to_contain_text("stopped")
    page.screenshot(path=str(ARTIFACTS / "stop.png"), full_page=True)


def test_empty_question_gets_a_message(page):
    from playwright.sync_api import expect

    page.locator("#ask-button").click()
    expect(page.locator("#ask-chat")).to_contain_text("Please type a question")


def test_failed_model_load_is_a_message_and_other_models_still_work(page):
    from playwright.sync_api import expect

    chat = page.locator("#ask-chat")
    model = page.locator("#ask-model input")
    model.fill("bad/model")
    model.press("Enter")
    ask(page, "Who directed 2001: A Space Odyssey?")
    expect(chat).to_contain_text("could not be loaded", timeout=20_000)
    expect(chat).to_contain_text("not in the local Hugging Face cache")
    page.screenshot(path=str(ARTIFACTS / "model-failed.png"), full_page=True)
    model.fill("test/other")
    model.press("Enter")
    ask(page, "Who directed 2001: A Space Odyssey?")
    expect(chat).to_contain_text("Answer: Stanley Kubrick", timeout=30_000)


def test_compare_tab_shows_two_answers(page):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Compare").click()
    page.locator("#compare-button").click()
    for side in ("a", "b"):
        expect(page.locator(f"#compare-chat-{side}")).to_contain_text(
            "Answer: Stanley Kubrick", timeout=30_000)
    table = page.locator("#compare-table")
    expect(table).to_contain_text("Searches")
    # The summary table is written by the event after the last chat chunk: wait for both
    # sides to end rather than reading it the moment the answers appear.
    expect(table).not_to_contain_text("running", timeout=30_000)
    assert table.inner_text().count("Stanley Kubrick") == 2
    page.screenshot(path=str(ARTIFACTS / "compare.png"), full_page=True)


def test_two_tabs_at_once(browser, app_url):
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    pages = [context.new_page(), context.new_page()]
    for tab in pages:
        tab.goto(app_url)
        tab.locator("#ask-button").wait_for()
    for tab in pages:
        ask(tab, "Who directed 2001: A Space Odyssey?")
    for tab in pages:
        expect(tab.locator("#ask-chat")).to_contain_text("Answer: Stanley Kubrick",
                                                         timeout=40_000)
    pages[1].screenshot(path=str(ARTIFACTS / "two-tabs.png"), full_page=True)
    context.close()


def test_training_curves_tab_plots_and_survives_a_bad_file(page, tmp_path):
    from playwright.sync_api import expect

    from curves.synthetic import synthetic_run, write_console

    log = write_console(tmp_path / "synthetic_grpo_lambda0.0.log",
                        [("synthetic-grpo", synthetic_run("grpo", steps=200))])
    bad = tmp_path / "not_a_log.bin"
    bad.write_bytes(bytes(range(256)) * 64)
    page.get_by_role("tab", name="Training curves").click()
    page.locator("#curves-files input[type=file]").set_input_files([str(log), str(bad)])
    messages = page.locator("#curves-messages")
    expect(messages).to_contain_text("not_a_log.bin", timeout=60_000)
    expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=60_000)
    expect(page.locator("#curves-summary")).to_contain_text("synthetic-grpo")
    page.screenshot(path=str(ARTIFACTS / "curves.png"), full_page=True)
    # Read once, the uploads are gone from the server (none left in Gradio's upload folder);
    # a changed setting re-plots from what was read.
    from gradio.utils import get_upload_folder

    from app.ui.uploads import UPLOADS

    left = [p for p in Path(get_upload_folder()).rglob("*")
            if p.name in (log.name, bad.name)]
    assert left == [] and UPLOADS.held() == 0
    page.get_by_label("Annotate phases").uncheck()
    page.locator("#curves-analyze").click()
    expect(page.locator("#curves-summary")).to_contain_text("synthetic-grpo")
    expect(page.locator("#curves-messages")).not_to_contain_text("removed")


def test_evaluate_tab_scores_a_sample(page, tmp_path, monkeypatch):
    from playwright.sync_api import expect

    from tests.test_evaluator import write_fixture

    monkeypatch.setenv("LLDS_DATA_DIR", str(tmp_path))  # the tab writes its run there
    data = write_fixture(tmp_path / "data")
    page.get_by_role("tab", name="Evaluate").click()
    expect(page.locator("#eval-table")).to_be_hidden()  # no placeholder table before a run
    page.locator("#eval-data-dir textarea").fill(str(data))
    page.locator("#eval-sample input[type=number]").fill("3")
    page.locator("#eval-sample input[type=number]").press("Enter")
    page.locator("#eval-button").click()
    # Between answers (which come in bursts), the progress line says which turn is done.
    expect(page.locator("#eval-summary")).to_contain_text("turn 1 done, 3 still searching",
                                                          timeout=60_000)
    expect(page.locator("#eval-summary")).to_contain_text("3 questions", timeout=60_000)
    expect(page.locator("#eval-summary")).to_contain_text("EM ")
    expect(page.locator("#eval-summary")).to_contain_text(str(tmp_path))  # where it went
    assert fits(page.locator("#eval-table"))
    page.screenshot(path=str(ARTIFACTS / "evaluate.png"), full_page=True)
    # The results download: the sample's records as JSON lines, its table and summary.
    box = page.locator("#eval-download")
    expect(box).to_contain_text(re.compile(r"nq-sample-3\s*\.jsonl"))
    expect(box).to_contain_text(re.compile(r"nq-sample-3-summary\s*\.md"))
    with page.expect_download() as got:
        box.locator('a[href$=".jsonl"]').first.click()
    rows = Path(got.value.path()).read_text(encoding="utf-8").splitlines()
    assert len(rows) == 3 and all("trajectory" in json.loads(r) for r in rows)
    # A failed run's message does not stay under the next run.
    summary = page.locator("#eval-summary")
    page.locator("#eval-data-dir textarea").fill(str(tmp_path / "nowhere"))
    page.locator("#eval-button").click()
    expect(summary).to_contain_text("Could not load", timeout=60_000)
    expect(box).to_be_hidden()
    page.locator("#eval-data-dir textarea").fill(str(data))
    page.locator("#eval-button").click()
    expect(summary).not_to_contain_text("Could not load", timeout=10_000)
    expect(summary).to_contain_text("3 questions", timeout=60_000)


def fits(block) -> bool:
    """A table block shows its whole table (no column cut off on the right)."""
    return block.evaluate("e => { const t = e.querySelector('table');"
                          " return t.getBoundingClientRect().right"
                          " <= e.getBoundingClientRect().right + 2; }")


def no_error_badge(page) -> None:
    """No output of the page shows Gradio's red "Error" (a handler that failed)."""
    from playwright.sync_api import expect

    expect(page.get_by_text("Error", exact=True)).to_have_count(0)
    expect(page.locator(".toast-body.error")).to_have_count(0)


def test_bundled_runs_button_plots_them_with_no_error(page):
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Training curves").click()
    summary = page.locator("#curves-summary")
    expect(summary).to_be_hidden()  # no empty table with placeholder headers before a run
    page.locator("#curves-bundled").click()
    messages = page.locator("#curves-messages")
    expect(messages).to_contain_text("What they show", timeout=60_000)
    expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=60_000)
    # each run named by its folder; the collapse regime is the experiment shown first
    expect(summary).to_contain_text("collapse/grpo-lr3e-4-seed0")
    assert fits(summary)
    page.wait_for_timeout(1500)  # the file box's own events, which used to fail, have run
    no_error_badge(page)
    details = open_details(page)
    assert "likelihood highest" in details and "set by the user" not in details
    # Every panel with a note has its plot (none cut off by the number of plot slots).
    notes = details.count("Validation scores")
    plots = page.locator(".js-plotly-plot").count()
    assert plots >= 10 and (notes == 0 or plots >= 11)
    page.locator("#curves-analyze").click()  # Analyze again: still no label "set by the user"
    page.wait_for_timeout(3000)
    expect(page.locator("#curves-details")).to_contain_text("likelihood highest",
                                                            timeout=60_000)
    assert "set by the user" not in open_details(page)
    no_error_badge(page)
    page.screenshot(path=str(ARTIFACTS / "curves-bundled.png"), full_page=True)
    # The bundled runs hold several seeds a method: drawn as a mean with a band by default;
    # "each run" draws every seed on its own.
    # (Gradient-norm spikes stay marked per run: a spike is one run's finding.)
    legend = page.locator(".js-plotly-plot .legendtext")
    one_seed = legend.filter(has_text="seed1", has_not_text="spikes")
    expect(legend.filter(has_text="seeds")).not_to_have_count(0)
    expect(one_seed).to_have_count(0)
    page.locator("#curves-seeds").get_by_text("each run").click()
    page.locator("#curves-analyze").click()
    expect(one_seed.first).to_be_visible(timeout=60_000)
    expect(legend.filter(has_text="seeds")).to_have_count(0)
    no_error_badge(page)


def test_an_example_click_asks_it(page):
    from playwright.sync_api import expect

    page.get_by_role("button", name="Who directed 2001: A Space Odyssey?").first.click()
    chat = page.locator("#ask-chat")
    expect(chat).to_contain_text("Answer: Stanley Kubrick", timeout=30_000)
    expect(page.locator("#ask-question textarea")).to_have_value(
        "Who directed 2001: A Space Odyssey?")


def test_ask_shows_one_run_its_raw_text_beside_the_checkbox_and_greedy_locks_sampling(page):
    from playwright.sync_api import expect

    temperature = page.locator("#ask-temperature input[type=range]")
    expect(temperature).to_be_disabled()  # Greedy is ticked: sampling settings don't apply
    page.get_by_label("Greedy (the paper's evaluation)").uncheck()
    expect(temperature).to_be_enabled()
    page.get_by_label("Greedy (the paper's evaluation)").check()
    chat = page.locator("#ask-chat")
    ask(page, "Does the script test pass?")
    expect(chat).to_contain_text("Answer: Stanley Kubrick", timeout=30_000)
    ask(page, "Who directed 2001: A Space Odyssey?")
    expect(chat).to_contain_text("Search: 2001: A Space Odyssey director", timeout=30_000)
    expect(page.locator("#ask-stats")).to_contain_text("answer", timeout=30_000)
    assert "script test" not in chat.inner_text()  # the earlier question is not piled above
    page.get_by_label("Show raw text (what the model saw)").check()
    raw = page.locator("#ask-raw")
    expect(raw).to_be_visible()
    box = page.get_by_label("Show raw text (what the model saw)").bounding_box()
    top = raw.bounding_box()
    assert 0 <= top["y"] - box["y"] < 150  # right under its checkbox
    text = raw.locator("textarea")
    expect(text).to_have_value(re.compile("<search> 2001: A Space Odyssey director"))
    assert text.evaluate("e => e.scrollWidth <= e.clientWidth + 2")  # long lines wrap
    page.get_by_role("button", name="Thought").first.click()
    from tests.test_ui_text import EMOJI

    assert not EMOJI.search(page.locator("body").inner_text())  # icons any font can show
    page.screenshot(path=str(ARTIFACTS / "ask-raw.png"), full_page=True)
