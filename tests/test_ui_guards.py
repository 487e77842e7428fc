"""The studio under bad input and hostile visitors: an exposed studio hands out no server
paths, wrong-typed API calls name the field, exports leave nothing behind, Compare refuses
an empty model and shows a failed load, the Evaluate tab's seeds and incomplete runs.

The apps run in this process on loopback behind the Gradio API client; the backend is the
scripted test double (the real-path twin: tests/test_ui_render.py runs a tiny Qwen2), the
retriever the real in-process bm25s one.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from agent.backends.base import ModelLoadError
from agent.testing import free_port
from app.ui.access import Access, is_loopback
from app.ui.context import Studio
from app.ui.evaluate_tab import evaluate_sample, incomplete_note, run_dir_for
from app.ui.inputs import InputError
from app.ui.model_pool import ModelPool, ModelStatus, run_model
from tests.scripted_backend import ScriptedBackend
from tests.test_evaluator import scripted, write_fixture

ANSWER = "<think> known </think>\n<answer> Stanley Kubrick </answer>"
REGISTERED = "SEGAgentRL/LLDS-A-GRPO-Qwen2.5-3B-Base-MA"


def load_app_module():
    import app.__main__ as studio_main

    return studio_main


class Factory:
    """A backend factory that records what it was asked to load."""

    def __init__(self):
        self.loaded: list[str] = []

    def __call__(self, model: str):
        self.loaded.append(model)
        if model.startswith("bad/"):
            raise ModelLoadError(f"{model} is not in the local Hugging Face cache (test)")
        return ScriptedBackend([ANSWER])


def launch(factory, retriever, access: Access | None = None):
    from app.ui import build_app, launch_options

    demo = build_app(factory, retriever, default_model="test/llds", baseline_model="test/grpo",
                     access=access)
    port = free_port()
    demo.launch(**launch_options(port=port, prevent_thread_lock=True, quiet=True))
    return demo, f"http://127.0.0.1:{port}/"


def chat_text(chat) -> str:
    parts = []
    for message in chat:
        content = message["content"]
        for part in content if isinstance(content, list) else [content]:
            parts.append(part["text"] if isinstance(part, dict) and "text" in part
                         else str(part))
        parts.append(str((message.get("metadata") or {}).get("title", "")))
    return " ".join(parts)


ASK_DEFAULTS = (True, 0.7, 1.0, 4, 3, 500, True)


def studio_with(backend, retriever, access: Access | None = None) -> Studio:
    return Studio(pool=ModelPool(lambda model: backend), retriever=retriever,
                  access=access or Access())


# The access policy -----------------------------------------------------------------------
def test_loopback_is_told_from_exposed_hosts():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.5", "example.org", ""))
    assert not Access.for_launch("127.0.0.1", share=False).restricted
    assert Access.for_launch("127.0.0.1", share=True).restricted
    assert Access.for_launch("0.0.0.0", share=False).restricted
    assert not Access.for_launch("0.0.0.0", share=False, allow_local_paths=True).restricted


def test_app_flags_make_the_policy():
    studio_main = load_app_module()
    _, local = studio_main.studio_plan(studio_main.parse_args(["--model", "m/x"]))
    assert not local.restricted
    args = studio_main.parse_args(["--host", "0.0.0.0", "--model", "/srv/models/mine",
                                   "--baseline", "org/base"])
    pair, exposed = studio_main.studio_plan(args)
    assert pair == ("org/base", "/srv/models/mine") and exposed.restricted
    assert exposed.model_problem("/srv/models/mine") is None  # named by the operator
    assert exposed.model_problem("org/base") is None
    assert exposed.model_problem(REGISTERED) is None
    assert "not one of this studio's models" in exposed.model_problem("/etc")
    assert "not one of this studio's models" in exposed.model_problem("someone/any-repo")
    assert "reads no directories" in exposed.data_dir_problem("/home")
    _, opened = studio_main.studio_plan(studio_main.parse_args(
        ["--share", "--allow-local-paths", "--model", "m/x"]))
    assert opened.exposed and opened.model_problem("/etc") is None


def test_an_exposed_pool_refuses_unlisted_models_before_loading(tiny_models, local_retriever):
    factory = Factory()
    access = Access.for_launch("0.0.0.0", False, named=("test/llds",))
    pool = ModelPool(factory, check=access.model_problem)
    from agent.loop import AgentSettings

    local_dir = str(tiny_models["scripted"])  # a real model directory on this machine
    events = list(run_model(pool, local_dir, "Who?", local_retriever, AgentSettings(),
                            cancel=__import__("threading").Event()))
    assert events == [ModelStatus(local_dir, "failed", access.model_problem(local_dir))]
    with pytest.raises(ModelLoadError, match="not one of this studio's models"):
        pool.get("attacker/any-repo")
    assert factory.loaded == [] and pool._slots == {}  # nothing loaded, no slot made
    pool.get("test/llds")
    pool.get(REGISTERED)
    assert factory.loaded == ["test/llds", REGISTERED]


def test_exposed_studio_through_the_api(tmp_path, local_retriever, monkeypatch):
    from gradio_client import Client

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLDS_DATA_DIR", str(tmp_path))
    data = write_fixture(tmp_path / "data")
    factory = Factory()
    demo, url = launch(factory, local_retriever, Access(exposed=True, named=frozenset(
        {"test/llds", "test/grpo"})))
    try:
        client = Client(url, verbose=False)
        # The exposed pickers take no free text (and the pool behind them refuses it too).
        with pytest.raises(Exception, match="not in the list of choices"):
            client.predict("Who directed 2001?", str(tmp_path), *ASK_DEFAULTS,
                           api_name="/ask")
        summary, *_ = client.predict("test/llds", "nq", 3, 0, str(data), 4,
                                    api_name="/evaluate")
        assert "reads no directories" in summary and not (tmp_path / "runs").exists()
        chat, *_ = client.predict("Who directed 2001?", "test/llds", *ASK_DEFAULTS,
                                  api_name="/ask")
        assert "Stanley Kubrick" in chat_text(chat)
        assert factory.loaded == ["test/llds"]
    finally:
        demo.close()


def test_data_errors_shown_to_visitors_of_an_exposed_studio_quote_no_record(
        tmp_path, local_retriever, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLDS_DATA_DIR", str(tmp_path))
    (tmp_path / "data" / "nq").mkdir(parents=True)
    secret = {"id": "1", "not_question": "s3cr3t-api-key", "golden_answers": ["x"]}
    (tmp_path / "data" / "nq" / "test.jsonl").write_text(json.dumps(secret) + "\n")

    studio = studio_with(scripted(), local_retriever,
                         Access(exposed=True, open=True))  # paths allowed, still exposed
    summary, *_ = evaluate_sample(studio, "m", "nq", 3, 0, str(tmp_path / "data"), 4)
    assert "Could not load nq" in summary and "s3cr3t" not in summary
    studio.access = Access()  # on loopback the operator sees the whole message
    summary, *_ = evaluate_sample(studio, "m", "nq", 3, 0, str(tmp_path / "data"), 4)
    assert "Could not load nq" in summary and "question" in summary


# Seeds and the Evaluate tab's run directory -------------------------------------------------

def test_seeds_are_bounded_integers_and_share_one_run_directory(tmp_path, monkeypatch,
                                                                local_retriever):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLDS_DATA_DIR", str(tmp_path))
    data = str(write_fixture(tmp_path / "data", n_copies=3))
    studio = studio_with(scripted(), local_retriever)
    for seed in (1, 2, 3):
        summary, table, _ = evaluate_sample(studio, "scripted-model", "nq", 3, seed, data, 4)
        assert "3 of 3 questions scored" in summary and len(table) == 3
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [
        run_dir_for("scripted-model", "nq", 4).name]
    for bad in (-1, 1.5, 1e300, 2**31, "abc", None, float("nan")):
        with pytest.raises(InputError, match="Seed"):
            evaluate_sample(studio, "scripted-model", "nq", 3, bad, data, 4)
    with pytest.raises(InputError, match="Questions"):
        evaluate_sample(studio, "scripted-model", "nq", 10**9, 0, data, 4)
    with pytest.raises(InputError, match="Benchmark"):
        evaluate_sample(studio, "scripted-model", "../../etc", 3, 0, data, 4)
    assert len(list((tmp_path / "runs").iterdir())) == 1


def test_two_models_with_one_base_name_get_two_run_directories():
    assert run_dir_for("/a/model", "nq", 4) != run_dir_for("/b/model", "nq", 4)
    assert run_dir_for("/a/model", "nq", 4).name.startswith("ui-model-")


class _DownRetriever:
    """A retriever whose server is gone: every search fails."""

    def search(self, queries, topk=3):
        raise ConnectionError("retriever at http://127.0.0.1:9 refused the connection")


def test_an_incomplete_run_says_so_and_that_rerunning_resumes(tmp_path, monkeypatch,
                                                              local_retriever):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLDS_DATA_DIR", str(tmp_path))
    data = str(write_fixture(tmp_path / "data"))
    studio = studio_with(scripted(), _DownRetriever())
    summary, table, _ = evaluate_sample(studio, "scripted-model", "nq", 4, 0, data, 4)
    assert "Incomplete" in summary and "4 of 4 questions ended in an error" in summary
    assert "refused the connection" in summary and "resume" in summary
    assert "0 of 4 questions scored" in summary
    studio.retriever = local_retriever  # the server is back: the same button resumes
    summary, *_ = evaluate_sample(studio, "scripted-model", "nq", 4, 0, data, 4)
    assert "Incomplete" not in summary and "4 of 4 questions scored" in summary


def test_why_a_run_stopped_shows_a_quoted_markdown_image_as_text():
    note = incomplete_note([], "the run stopped on ![x](http://127.0.0.1:9/x.png) <b>")
    assert "![" not in note and "<b>" not in note and "x](http://127.0.0.1:9/x.png)" in note


# Wrong-typed API calls -------------------------------------------------------------------
def test_wrong_typed_api_calls_name_the_field(tmp_path, local_retriever, monkeypatch):
    from gradio_client import Client

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLDS_DATA_DIR", str(tmp_path))
    demo, url = launch(Factory(), local_retriever)
    try:
        client = Client(url, verbose=False)
        cases = [(("Who?", "test/llds", True, "hot", 1.0, 4, 3, 500, True), "/ask",
                  "Temperature: expected a number"),
                 (("Who?", "test/llds", "yes", 0.7, 1.0, 4, 3, 500, True), "/ask", "Greedy"),
                 (("Who?", "test/llds", True, 0.7, 1.0, 2.5, 3, 500, True), "/ask", "Max turns"),
                 (("Who?", 42, True, 0.7, 1.0, 4, 3, 500, True), "/ask", "Model: expected text"),
                 (("Who?", "test/grpo", "test/llds", True, 0.7, "all", 4, 3, 500, True),
                  "/compare", "Top-p"),
                 (("test/llds", "nq", 3, "zero", "", 4), "/evaluate", "Seed")]
        for args, api, field in cases:
            with pytest.raises(Exception, match=field):
                client.predict(*args, api_name=api)
    finally:
        demo.close()


# A question no tokenizer can encode ----------------------------------------------------------
def call_raw(url: str, api: str, *args) -> tuple[str, object]:
    """The REST API called with the body a browser's JSON.stringify sends (a lone surrogate
    as the escape \\ud800, which gradio_client cannot send): the last event's name and data."""
    import re

    import httpx

    body = json.dumps({"data": list(args)}).encode("ascii")
    posted = httpx.post(f"{url}gradio_api/call/{api}", content=body, timeout=30,
                        headers={"Content-Type": "application/json"})
    stream = httpx.get(f"{url}gradio_api/call/{api}/{posted.json()['event_id']}", timeout=60)
    name, data = re.findall(r"event: (\w+)\ndata: (.*)", stream.text)[-1]
    return name, json.loads(data)


def test_a_lone_surrogate_question_gets_a_message_and_the_next_question_works(local_retriever):
    demo, url = launch(Factory(), local_retriever)
    try:
        question = "\ud800 who painted the mona lisa"
        event, (chat, *_) = call_raw(url, "ask", question, "test/llds", *ASK_DEFAULTS)
        assert event == "complete"
        assert "lone surrogate" in chat_text(chat) and "Please retype" in chat_text(chat)
        event, (chat, *_) = call_raw(url, "ask", "who painted the mona lisa", "test/llds",
                                     *ASK_DEFAULTS)
        assert event == "complete" and "Stanley Kubrick" in chat_text(chat)
        event, (chat_a, chat_b, *_) = call_raw(url, "compare", question, "test/grpo",
                                               "test/llds", *ASK_DEFAULTS)
        assert "lone surrogate" in chat_text(chat_a) and "lone surrogate" in chat_text(chat_b)
        event, message = call_raw(url, "ask", "who painted it", "test/\udc00", *ASK_DEFAULTS)
        assert event == "error" and "Model: " in str(message) and "surrogate" in str(message)
    finally:
        demo.close()


# Exports leave no temporary folder -------------------------------------------------------
def test_ask_exports_leave_no_folder_in_the_temp_directory(tmp_path, local_retriever,
                                                            monkeypatch):
    from gradio_client import Client

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    demo, url = launch(Factory(), local_retriever)
    try:
        client = Client(url, verbose=False, download_files=str(tmp_path / "downloads"))
        for _ in range(2):
            _, _, _, files, _ = client.predict("Who directed 2001?", "test/llds",
                                                  *ASK_DEFAULTS, api_name="/ask")
            texts = [Path(f).read_text(encoding="utf-8") for f in files]
            assert any('"event": "Run"' in t for t in texts)
            assert any("Stanley Kubrick" in t for t in texts)
        assert [p.name for p in temp.iterdir() if p.name.startswith("llds-trace-")] == []
    finally:
        demo.close()


# Compare: an empty model name, a failed load ----------------------------------------------
def test_compare_refuses_an_empty_model_and_shows_a_failed_load(tmp_path, local_retriever,
                                                                monkeypatch):
    from gradio_client import Client

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLDS_DATA_DIR", str(tmp_path))
    factory = Factory()
    demo, url = launch(factory, local_retriever)
    try:
        client = Client(url, verbose=False)
        chat_a, chat_b, *_ = client.predict("Who directed 2001?", "  ", "test/llds",
                                            *ASK_DEFAULTS, api_name="/compare")
        assert "Please pick model A" in chat_text(chat_a) and chat_b == []
        assert factory.loaded == []  # "." was never loaded
        *_, table = client.predict("Who directed 2001?", "bad/model", "test/llds",
                                   *ASK_DEFAULTS, api_name="/compare")
        ended = next(line for line in table.splitlines() if line.startswith("| Ended"))
        assert "model failed to load" in ended and "running" not in ended
        assert "answer" in ended
    finally:
        demo.close()


def test_comparison_table_of_a_failed_load():
    from app.ui import transcript as fold
    from app.ui.compare_tab import comparison_table

    failed, running = fold.Transcript(), fold.Transcript()
    failed.apply(ModelStatus("bad/model", "failed", "not cached"))
    running.apply(ModelStatus("ok/model", "loading"))
    table = comparison_table(["bad/model", "ok/model"], [failed, running])
    assert "| Ended | model failed to load | running |" in table
