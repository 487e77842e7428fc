"""Serving many visitors (app/ui/serving.py): one batched run per model, a first-come line
that tells its place, each visitor's events their own, Stop for one visitor only.

The scripted backend (tests/ only) makes turns and their timing exact; the real-path twin
runs the shipped nano agent through transformers: batched answers equal the answers of
the same questions asked one at a time.
"""

from __future__ import annotations

import threading
import time

from agent.events import Finished, TextDelta
from agent.loop import AgentSettings, run_agent
from app.ui.model_pool import ModelPool, ModelStatus, run_model
from app.ui.serving import Place
from tests.scripted_backend import ScriptedBackend, question_of


def by_question(question: str, turn: int) -> str:
    """Search once, then answer with the question's own last word (each visitor's answer
    is recognisably their own)."""
    if turn == 0:
        return f"<think> look up {question} </think>\n<search> {question} </search>"
    return f"<think> found </think>\n<answer> {question.rstrip('?').split()[-1]} </answer>"


class Recording(ScriptedBackend):
    """The questions of each batched (generate) call."""

    generated: list[list[str]]

    def generate(self, contexts, max_new_tokens, sampling, keep_last=None):
        self.__dict__.setdefault("generated", []).append(
            [question_of(c[0]) for c in contexts])
        return super().generate(contexts, max_new_tokens, sampling, keep_last)


class NoDocuments:
    def __init__(self):
        self.calls: list[int] = []

    def search(self, queries, topk=3):
        self.calls.append(len(queries))
        return [[] for _ in queries]


def ask_all(pool, questions, settings=None, cancels=None, stagger=0.0):
    """Each question from its own thread, as visitors do; {question: events}."""
    out: dict[str, list] = {q: [] for q in questions}
    settings = settings or AgentSettings()
    cancels = cancels or {q: threading.Event() for q in questions}
    retriever = pool.test_retriever

    def visit(q):
        out[q].extend(run_model(pool, "m/x", q, retriever, settings, cancels[q]))

    threads = []
    for q in questions:
        threads.append(threading.Thread(target=visit, args=(q,)))
        threads[-1].start()
        time.sleep(stagger)
    for thread in threads:
        thread.join(30)
    return out


def pool_of(backend, max_batch=16):
    pool = ModelPool(lambda model: backend, max_batch=max_batch)
    pool.test_retriever = NoDocuments()
    pool.get("m/x")
    return pool


def test_visitors_who_arrive_while_one_runs_share_one_batch_and_keep_their_answers():
    backend = ScriptedBackend(by_question, delay=0.02)
    pool = pool_of(backend)
    questions = [f"question number {w}" for w in ("one", "two", "three", "four", "five")]
    events = ask_all(pool, questions, stagger=0.05)
    for q in questions:
        finished = events[q][-1]
        assert isinstance(finished, Finished) and finished.answer == q.split()[-1]
    # The first streamed alone; the others joined it: turns for several in one call.
    assert max(backend.batch_sizes) >= 3
    assert max(pool.test_retriever.calls) >= 3  # their searches in one retriever call


def test_a_lone_visitor_still_streams_token_by_token():
    pool = pool_of(ScriptedBackend(by_question, delay=0.01))
    events = ask_all(pool, ["only me here"])["only me here"]
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert len(deltas) > 6 and events[-1].answer == "here"


def test_the_line_is_first_come_first_served_and_says_place_and_time():
    backend = ScriptedBackend(by_question, delay=0.05)
    pool = pool_of(backend, max_batch=1)
    questions = ["first a", "second b", "third c"]
    events = ask_all(pool, questions, stagger=0.1)
    ends = {q: next(i for i, e in enumerate(backend.calls) if q in e[0])
            for q in questions}
    assert ends["first a"] < ends["second b"] < ends["third c"]  # in the order they came
    places = [e for e in events["third c"] if isinstance(e, ModelStatus)
              and e.state == "waiting"]
    assert places and "2nd in line" in places[0].detail
    assert any("next in line" in p.detail for p in places)  # it moved up while it waited
    # Once a run time is measured, the estimate is in seconds.
    assert any("starts in about" in p.detail for p in places)
    assert all(isinstance(events[q][-1], Finished) for q in questions)


def test_place_words():
    assert Place(0, 16, None).words() == ("16 questions running on this model; you are next "
                                          "in line.")
    assert Place(0, 0, None).words().startswith("The model is finishing another run")
    assert Place(2, 1, 7.4).words().endswith("3rd in line; starts in about 7 s (from the "
                                             "last runs).")


def test_stop_ends_only_that_visitors_question():
    backend = ScriptedBackend(by_question, delay=0.03)
    pool = pool_of(backend)
    questions = ["keep going alpha", "stop me beta", "keep going gamma"]
    cancels = {q: threading.Event() for q in questions}
    threading.Timer(0.5, cancels["stop me beta"].set).start()
    events = ask_all(pool, questions, cancels=cancels, stagger=0.05)
    assert events["stop me beta"][-1].stop_reason == "cancelled"
    assert events["keep going alpha"][-1].answer == "alpha"
    assert events["keep going gamma"][-1].answer == "gamma"


def test_a_visitor_who_stops_while_waiting_leaves_the_line():
    backend = ScriptedBackend(by_question, delay=0.05)
    pool = pool_of(backend, max_batch=1)
    cancels = {"running now x": threading.Event(), "gives up y": threading.Event()}
    threading.Timer(0.3, cancels["gives up y"].set).start()
    events = ask_all(pool, list(cancels), cancels=cancels, stagger=0.05)
    assert not any(isinstance(e, Finished) for e in events["gives up y"])  # never ran
    assert not any("gives up y" in call[0] for call in backend.calls)
    assert events["running now x"][-1].answer == "x"


def test_settings_that_cannot_share_a_batch_run_apart():
    backend = Recording(by_question, delay=0.02)
    pool = pool_of(backend)
    out: dict[str, list] = {}

    def visit(q, settings):
        out[q] = list(run_model(pool, "m/x", q, pool.test_retriever, settings,
                                threading.Event()))

    greedy, sampled = AgentSettings(), AgentSettings(greedy=False, temperature=0.7, seed=1)
    threads = [threading.Thread(target=visit, args=(f"greedy {i}", greedy)) for i in range(3)]
    threads += [threading.Thread(target=visit, args=(f"sampled {i}", sampled))
                for i in range(3)]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join(30)
    assert all(out[q][-1].answer == q.split()[-1] for q in out)
    for call in backend.generated:
        assert len({q.split()[0] for q in call}) == 1, f"one call mixed settings: {call}"
    assert max(len(call) for call in backend.generated) >= 2


def test_real_nano_agent_batched_answers_equal_one_at_a_time(local_retriever):
    from agent.config import BackendOptions

    questions = ["who created linux", "capital of kenya", "when was facebook founded",
                 "what virus causes smallpox"]
    backend = BackendOptions("transformers", device="cpu").load("nano")
    alone = {q: [e for e in run_agent(q, backend, local_retriever, AgentSettings())][-1]
             for q in questions}
    pool = ModelPool(lambda model: backend)
    pool.test_retriever = local_retriever
    pool.get("m/x")
    together = ask_all(pool, questions)
    for q in questions:
        assert together[q][-1].answer == alone[q].answer
        assert together[q][-1].trajectory == alone[q].trajectory
