"""The UI's pure core: events -> messages, exports, the model pool, the event pump; and the
real path (a tiny real Qwen2 model through the transformers backend) through them."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import pytest

from agent.backends.base import ModelLoadError
from agent.events import (
    AnswerGiven,
    DocumentsReturned,
    Finished,
    InvalidAction,
    SearchCalled,
    TextDelta,
    TurnStarted,
)
from agent.loop import AgentSettings
from app.ui import exports
from app.ui import transcript as fold
from app.ui.controls import settings_from_controls, validate_question
from app.ui.model_pool import ModelPool, ModelStatus, run_model
from app.ui.run_registry import RunRegistry, pump
from app.ui.transcript import Transcript, TurnPart, split_turn
from retriever.doc import Doc
from tests.scripted_backend import ScriptedBackend

DOCS = [Doc("1", '"2001: A Space Odyssey"\nA 1968 film directed by Stanley Kubrick.', 11.5),
        Doc("2", '"Evil <script>alert(1)</script>"\nText with <b>tags</b> & more.', 3.25)]


def finished(reason="answer", answer="Stanley Kubrick", **kw) -> Finished:
    return Finished(reason, kw.pop("turns", 2), kw.pop("searches", 1), kw.pop("tokens", 20),
                    1.5, "PROMPT<think>x</think>", "PROMPT", answer, **kw)


def run_events() -> list:
    return [TurnStarted(1, 5, False), TextDelta("<think> look it "), TextDelta("up </think>\n"),
            TextDelta("<search> 2001 director </search>"), SearchCalled("2001 director", 1),
            DocumentsReturned("2001 director", DOCS, "<information>...</information>", 0.25),
            TurnStarted(2, 5, False), TextDelta("<think> Kubrick. </think><answer> Stanley "),
            TextDelta("Kubrick </answer>"), AnswerGiven("Stanley Kubrick"), finished()]


def titles(messages) -> list[str]:
    return [(m.get("metadata") or {}).get("title", "") for m in messages]


# split_turn --------------------------------------------------------------------------
def test_split_turn_kinds_and_order():
    segments = split_turn("Hmm <think> a </think> b <search> q </search>")
    assert [s.kind for s in segments] == ["text", "think", "text", "search"]
    assert segments[3] == TurnPart("search", " q ")


def test_split_turn_streaming_holds_back_half_tags_and_leaves_open_segments():
    assert split_turn("<think> a </thi", streaming=True) == [TurnPart("think", " a ", False)]
    assert split_turn("<think> a </think> <sea", streaming=True) == [TurnPart("think", " a ")]
    assert split_turn("a < b", streaming=True) == [TurnPart("text", "a < b")]


def test_split_turn_keeps_stray_closing_tags_as_text():
    assert split_turn("</answer> hi") == [TurnPart("text", "</answer> hi")]


# Every event kind -----------------------------------------------------------------------
def test_turn_started_sets_the_counter_and_adds_no_message():
    t = Transcript(now=lambda: 0.0)
    t.apply(TurnStarted(2, 5, False))
    assert (t.turn, t.rounds, t.messages) == (2, 5, [])


def test_text_delta_streams_into_an_open_thought():
    t = Transcript(now=lambda: 0.0)
    t.apply(TurnStarted(1, 5, False))
    t.apply(TextDelta("<think> partial"))
    assert t.messages == [{"role": "assistant", "content": "partial",
                           "metadata": {"title": fold.THOUGHT_TITLE, "status": "pending"}}]
    t.apply(TextDelta(" thought </think>"))
    assert t.messages[0]["metadata"]["status"] == "done"
    assert t.messages[0]["content"] == "partial thought"


def test_search_panel_is_pending_then_done_with_duration_and_documents():
    t = Transcript(now=lambda: 0.0)
    for event in run_events()[:5]:
        t.apply(event)
    panel = t.messages[-1]
    assert panel["metadata"]["title"] == "Search: 2001 director"
    assert panel["metadata"]["status"] == "pending"
    t.apply(run_events()[5])
    panel = t.messages[-1]
    assert panel["metadata"]["status"] == "done"
    assert panel["metadata"]["duration"] == 0.25
    assert "**1. 2001: A Space Odyssey** · score 11.50" in panel["content"]
    assert "directed by Stanley Kubrick" in panel["content"]


def test_document_html_is_escaped_so_it_shows_as_text():
    content = fold.documents_markdown(DOCS)
    assert "<script>" not in content and "<b>" not in content
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in content
    assert "&amp; more" in content


def test_model_text_tags_never_reach_the_chat_raw():
    messages = fold.render([TurnStarted(1, 5, False),
                              TextDelta("I <information> fake </information> <img src=x>"),
                              InvalidAction("..."), finished("max_turns", None)])
    assert all("<information>" not in m["content"] and "<img" not in m["content"]
               for m in messages)


IMAGE = "![pixel](http://127.0.0.1:9/x.png)"


def image_free(markdown: str) -> bool:
    """The Markdown shows the image syntax as text: CommonMark makes no <img> of it."""
    from markdown_it import MarkdownIt

    rendered = MarkdownIt("commonmark").render(markdown)
    return "<img" not in rendered and "![" not in markdown and "pixel](http" in rendered


def image_run() -> list:
    """Messages of a run whose thought, query, documents and answer carry an image."""
    doc = Doc("img", f'"Title {IMAGE}"\nBody {IMAGE}', 1.0)
    query = f"painter {IMAGE}"
    return fold.render([
        TurnStarted(1, 5, False),
        TextDelta(f"<think> look {IMAGE} </think>\n<search> {query} </search>"),
        SearchCalled(query, 1), DocumentsReturned(query, [doc], "<information/>", 0.1),
        TurnStarted(2, 5, False), TextDelta(f"<answer> Leonardo {IMAGE} </answer>"),
        AnswerGiven(f"Leonardo {IMAGE}"), finished(answer=f"Leonardo {IMAGE}")])


@pytest.mark.parametrize("place", ["question", "thought", "query", "document", "answer"])
def test_markdown_images_in_user_model_and_corpus_text_show_as_text(place):
    messages = image_run()
    shown = {"question": fold.question_message(f"Who painted it? {IMAGE}")["content"],
             "thought": messages[0]["content"],
             "query": messages[1]["metadata"]["title"],
             "document": messages[1]["content"],
             "answer": messages[-1]["content"]}[place]
    assert "pixel](http://127.0.0.1:9/x.png)" in shown
    assert image_free(shown), shown


def test_an_image_in_an_answer_shows_as_text_in_the_comparison_table():
    from app.ui.compare_tab import comparison_table

    transcript = Transcript(now=lambda: 0.0)
    transcript.apply(AnswerGiven(f"Leonardo {IMAGE}"))
    table = comparison_table(["a", "b"], [transcript, Transcript(now=lambda: 0.0)])
    assert image_free(table), table


def test_invalid_action_is_marked():
    messages = fold.render([TurnStarted(1, 5, False), TextDelta("no tags here"),
                              InvalidAction("no tags here")])
    assert messages[0]["content"] == "no tags here"
    assert messages[1]["metadata"]["title"] == "Invalid action"


def test_answer_is_its_own_message():
    messages = fold.render(run_events())
    assert messages[-1] == {"role": "assistant",
                            "content": fold.ANSWER_PREFIX + "Stanley Kubrick"}
    assert titles(messages) == [fold.THOUGHT_TITLE, "Search: 2001 director",
                                fold.THOUGHT_TITLE, ""]


@pytest.mark.parametrize("reason,expected", [("cancelled", "Stopped"), ("max_turns", "turn limit"),
                                             ("context_full", "context is full"),
                                             ("eos", "without an answer")])
def test_finished_without_answer_says_why(reason, expected):
    messages = fold.render([TurnStarted(1, 5, False), TextDelta("<think> hm"),
                              finished(reason, None)])
    assert expected in messages[-1]["content"]
    assert messages[0]["metadata"]["status"] == "done"  # no spinner left behind


def test_finished_with_error_shows_the_error_and_closes_the_search():
    messages = fold.render([TurnStarted(1, 5, False), TextDelta("<search> q </search>"),
                              SearchCalled("q", 1),
                              finished("error", None, error="RetrieverError: down <x>")])
    assert messages[0]["metadata"]["status"] == "done"
    assert "failed" in messages[0]["content"]
    assert "RetrieverError: down &lt;x&gt;" in messages[-1]["content"]


def test_closing_round_search_is_marked_not_run():
    messages = fold.render([TurnStarted(5, 5, True), TextDelta("<search> q </search>"),
                              finished("max_turns", None)])
    assert "closing round" in messages[0]["content"]


def test_model_status_panel_updates_in_place_and_failure_is_a_message():
    t = Transcript(now=lambda: 0.0)
    t.apply(ModelStatus("org/m", "loading", "wait"))
    assert t.messages[0]["metadata"]["status"] == "pending"
    t.apply(ModelStatus("org/m", "ready", "Loaded", 2.0))
    assert len(t.messages) == 1 and t.messages[0]["metadata"]["duration"] == 2.0
    t = Transcript(now=lambda: 0.0)
    t.apply(ModelStatus("org/m", "loading"))
    t.apply(ModelStatus("org/m", "failed", "not in the cache"))
    assert len(t.messages) == 1 and "not in the cache" in t.messages[0]["content"]


def test_stats_count_turns_searches_tokens_and_rate():
    clock = iter(range(100)).__next__
    t = Transcript(now=lambda: float(clock()))
    for event in run_events()[:-1]:
        t.apply(event)
    stats = t.stats()
    assert (stats.turn, stats.rounds, stats.searches) == (2, 5, 1)
    assert stats.tokens > 0 and stats.tokens_per_second > 0
    assert stats.line().startswith("Turn 2 of 4 · 1 search · ") and "· running" in stats.line()
    t.apply(run_events()[-1])
    assert t.stats().tokens == 20 and t.stats().stop_reason == "answer"
    # Ended: how many turns it took and how it ended, in words (not "Closing turn", a code).
    assert "2 turns · 1 search · 20 tokens" in t.stats().line()
    assert t.stats().line().endswith(" · answered")
    closing = replace(t.stats(), final_round=True, stop_reason="max_turns")
    assert closing.line().startswith("2 turns") and closing.line().endswith(
        " · no answer (turn limit)")


# Exports ------------------------------------------------------------------------------
def test_trace_jsonl_merges_deltas_and_round_trips():
    text = exports.trace_jsonl(run_events(), header={"question": "q", "model": "m"})
    rows = [json.loads(line) for line in text.splitlines()]
    assert rows[0] == {"event": "Run", "question": "q", "model": "m"}
    kinds = [r["event"] for r in rows[1:]]
    assert kinds == ["TurnStarted", "TextDelta", "SearchCalled", "DocumentsReturned",
                     "TurnStarted", "TextDelta", "AnswerGiven", "Finished"]
    assert rows[4]["docs"][0]["title"] == "2001: A Space Odyssey"
    assert rows[-1]["trajectory"] == "PROMPT<think>x</think>"


def test_trace_markdown_has_the_steps_and_the_raw_text():
    text = exports.trace_markdown("Who directed 2001?", "org/m", run_events(), {"topk": 3})
    assert text.startswith("# Who directed 2001?")
    assert "**Search:** 2001 director" in text and "**Answer:** Stanley Kubrick" in text
    assert "PROMPT<think>x</think>" in text


# Session helpers ------------------------------------------------------------------------
def test_validate_question():
    assert validate_question("  ") and validate_question(None)
    assert "2,000" in validate_question("x" * 2001)
    assert validate_question("Who?") is None


def test_a_question_with_a_lone_surrogate_is_refused_with_a_message_it_can_show():
    problem = validate_question("\ud800 who painted the mona lisa")
    assert "lone surrogate" in problem and "U+D800" in problem and "position 1" in problem
    problem.encode("utf-8")  # the message itself can go to the page
    assert validate_question("\U0001F600 who painted the mona lisa") is None  # a real emoji


def test_settings_from_controls_casts_slider_floats():
    s = settings_from_controls(False, 0.7, 0.9, 3.0, 5.0, 128.0)
    assert s == AgentSettings(max_turns=3, topk=5, max_new_tokens=128, greedy=False,
                              temperature=0.7, top_p=0.9, stop_repeats=64)
    # The repetition box unticked: the published protocol, which never stops early.
    assert settings_from_controls(False, 0.7, 0.9, 3, 5, 128, False).stop_repeats == 0


def test_pool_loads_once_reports_failures_and_keeps_other_models():
    loads = []

    def factory(model):
        loads.append(model)
        if model == "bad/model":
            raise ModelLoadError("bad/model is not cached")
        return ScriptedBackend(["<answer> x </answer>"])

    pool = ModelPool(factory)
    assert pool.get("good/model") is pool.get("good/model")
    with pytest.raises(ModelLoadError):
        pool.get("bad/model")
    assert pool.status("bad/model") == ("failed", "bad/model is not cached")
    assert pool.status("good/model")[0] == "ready" and loads.count("good/model") == 1


def test_pool_drops_the_least_recently_used_idle_model():
    pool = ModelPool(lambda m: ScriptedBackend([]), max_loaded=1)
    pool.get("a/a")
    pool.get("b/b")
    assert not pool.is_loaded("a/a") and pool.is_loaded("b/b")


def test_run_model_streams_status_then_agent_events(bm25s_retriever):
    pool = ModelPool(lambda m: ScriptedBackend(["<search> Kubrick </search>",
                                                "<answer> Stanley Kubrick </answer>"]))
    events = list(run_model(pool, "x/y", "Who directed 2001?", bm25s_retriever,
                            AgentSettings(), threading.Event()))
    assert isinstance(events[0], ModelStatus) and events[1].state == "ready"
    assert isinstance(events[-1], Finished) and events[-1].answer == "Stanley Kubrick"


def test_run_model_failed_load_is_an_event_not_an_exception():
    def factory(model):
        raise ModelLoadError("offline")

    events = list(run_model(ModelPool(factory), "x/y", "q", None, AgentSettings(),
                            threading.Event()))
    assert [e.state for e in events] == ["loading", "failed"]


def test_second_run_on_a_busy_model_waits_its_turn():
    pool = ModelPool(lambda m: ScriptedBackend(["<answer> a </answer>"]))
    pool.get("x/y")
    assert pool.hold("x/y")
    events = []
    thread = threading.Thread(target=lambda: events.extend(
        run_model(pool, "x/y", "q", None, AgentSettings(), threading.Event())))
    thread.start()
    time.sleep(0.3)
    assert [e.state for e in events] == ["waiting"]
    pool.release("x/y")
    thread.join(5)
    assert isinstance(events[-1], Finished) and events[-1].answer == "a"


def test_pump_batches_and_cancels_when_closed():
    cancel = threading.Event()

    def slow():
        for i in range(1000):
            if cancel.is_set():
                return
            time.sleep(0.005)
            yield i

    batches = pump({"a": slow()}, cancel, min_interval=0.05)
    first = next(batches)
    second = next(batches)
    assert first == [("a", 0)] and len(second) > 1  # a batch gathers what arrived meanwhile
    batches.close()
    assert cancel.is_set()


def test_pump_merges_two_streams_and_raises_worker_errors():
    def broken():
        yield 1
        raise ValueError("boom")

    items = []
    with pytest.raises(ValueError, match="boom"):
        for batch in pump({"a": iter([1, 2]), "b": broken()}):
            items += batch
    assert ("b", 1) in items


def test_run_registry_stop_sets_the_cancel_event_and_waits():
    runs = RunRegistry()
    cancel, done = runs.start("s", "ask")
    threading.Timer(0.1, lambda: runs.finish("s", "ask", (cancel, done))).start()
    assert runs.stop("s", ("ask",), wait=2.0) == 1
    assert cancel.is_set() and done.is_set()
    assert runs.stop("s", ("ask",)) == 0


# The real path: a tiny real Qwen2 model through transformers ------------------------------
@pytest.fixture(scope="module")
def bm25s_retriever():
    from retriever.client import LocalRetriever

    return LocalRetriever(engine="bm25s")


@pytest.fixture(scope="module")
def tiny_scripted_model(tmp_path_factory):
    pytest.importorskip("transformers")
    from agent.testing import build_scripted, build_tokenizer
    from retriever.corpus import load_records, resolve_corpus

    texts = [r["contents"] for r in load_records(resolve_corpus("default"))[:2000]]
    folder = tmp_path_factory.mktemp("tiny")
    tokenizer = build_tokenizer(folder / "tok", texts)
    return build_scripted(folder / "scripted", tokenizer)


@pytest.mark.slow
def test_real_model_ask_flow_through_pool_and_transcript(tiny_scripted_model, bm25s_retriever):
    from agent.config import BackendOptions

    pool = ModelPool(BackendOptions("transformers", device="cpu").load)
    settings = AgentSettings(max_new_tokens=30, max_obs_tokens=3000)
    transcript = Transcript()
    for batch in pump({"ask": run_model(pool, str(tiny_scripted_model),
                                        "who directed 2001 a space odyssey", bm25s_retriever,
                                        settings, threading.Event())}):
        for _, event in batch:
            transcript.apply(event)
    assert transcript.finished is not None and transcript.finished.stop_reason == "answer"
    search = next(m for m in transcript.messages
                  if titles([m])[0].startswith("Search:"))
    assert search["metadata"]["status"] == "done" and "score" in search["content"]
    assert transcript.messages[-1]["content"].startswith(fold.ANSWER_PREFIX)
    assert transcript.stats(pool.get(str(tiny_scripted_model)).count_tokens).tokens > 0
    assert "<information>" in transcript.finished.trajectory
