"""The agent loop: protocol end to end with a scripted backend and the real retriever."""

from __future__ import annotations

import threading

import pytest

from agent import protocol
from agent.events import (
    AnswerGiven,
    DocumentsReturned,
    Finished,
    InvalidAction,
    SearchCalled,
    TextDelta,
    TurnStarted,
    event_to_dict,
)
from agent.loop import AgentSettings, run_agent, run_agent_batch
from retriever.client import RetrieverError
from tests.scripted_backend import ScriptedBackend

SEARCH = ("<think>I need the director.</think>\n"
          "<search> 2001 A Space Odyssey film director </search>")
ANSWER = "<think>The documents say Kubrick.</think>\n<answer> Stanley Kubrick </answer>"


def finished_of(events) -> Finished:
    assert isinstance(events[-1], Finished)
    assert sum(isinstance(e, Finished) for e in events) == 1
    return events[-1]


def test_search_then_answer_inserts_documents_exactly(local_retriever):
    backend = ScriptedBackend([SEARCH, ANSWER])
    events = list(run_agent("who directed 2001: a space odyssey", backend, local_retriever))
    done = finished_of(events)
    assert done.stop_reason == "answer" and done.answer == "Stanley Kubrick"
    assert (done.turns, done.searches, done.invalid_actions) == (2, 1, 0)
    kinds = [type(e) for e in events if not isinstance(e, TextDelta)]
    assert kinds == [TurnStarted, SearchCalled, DocumentsReturned, TurnStarted, AnswerGiven,
                     Finished]
    search = next(e for e in events if isinstance(e, SearchCalled))
    docs = next(e for e in events if isinstance(e, DocumentsReturned))
    assert search.query == "2001 A Space Odyssey film director"
    assert docs.docs[0].title == "2001: A Space Odyssey" and len(docs.docs) == 3
    expected_obs = protocol.observation(protocol.render_documents(d.contents for d in docs.docs))
    assert docs.rendered == expected_obs
    assert done.trajectory == protocol.user_message(
        "who directed 2001: a space odyssey") + SEARCH + expected_obs + ANSWER
    assert done.response == SEARCH + expected_obs + ANSWER
    # The streamed deltas are exactly the generated text, turn by turn.
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == SEARCH + ANSWER
    # The model saw the observation in its second turn's context.
    assert backend.calls[1] == [protocol.user_message("who directed 2001: a space odyssey"),
                                SEARCH, expected_obs]
    assert done.retrieved == [d.contents for d in docs.docs]


def test_text_after_the_stop_tag_is_cut(local_retriever):
    events = list(run_agent("q", ScriptedBackend([SEARCH + " ignored tail", ANSWER]),
                            local_retriever))
    assert "ignored tail" not in finished_of(events).trajectory


def test_invalid_action_message(local_retriever):
    backend = ScriptedBackend(["I will just think aloud.", ANSWER])
    settings = AgentSettings(stop_on_eos=False)
    events = list(run_agent("q", backend, local_retriever, settings))
    done = finished_of(events)
    assert [type(e) for e in events if isinstance(e, InvalidAction)] == [InvalidAction]
    assert done.invalid_actions == 1 and done.stop_reason == "answer"
    assert backend.calls[1][-1] == protocol.INVALID_ACTION_MESSAGE


def test_stop_on_eos_ends_the_run(local_retriever):
    events = list(run_agent("q", ScriptedBackend(["Just text."]), local_retriever,
                            AgentSettings(stop_on_eos=True)))
    assert finished_of(events).stop_reason == "eos"


def test_final_round_runs_no_search(local_retriever):
    calls = []

    class CountingRetriever:
        def search(self, queries, topk=3):
            calls.append(list(queries))
            return local_retriever.search(queries, topk)

    backend = ScriptedBackend(lambda question, n: f"<search> query {n} </search>")
    events = list(run_agent("q", backend, CountingRetriever(), AgentSettings(max_turns=2)))
    done = finished_of(events)
    assert done.stop_reason == "max_turns" and done.turns == 3
    assert calls == [["query 0"], ["query 1"]]  # the third search is parsed, never run
    starts = [e for e in events if isinstance(e, TurnStarted)]
    assert [(s.turn, s.rounds, s.final) for s in starts] == [(1, 3, False), (2, 3, False),
                                                                (3, 3, True)]


def test_observation_is_truncated_to_its_token_cap(local_retriever):
    backend = ScriptedBackend([SEARCH, ANSWER])
    events = list(run_agent("q", backend, local_retriever, AgentSettings(max_obs_tokens=20)))
    docs = next(e for e in events if isinstance(e, DocumentsReturned))
    full = protocol.observation(protocol.render_documents(d.contents for d in docs.docs))
    assert backend.count_tokens(docs.rendered) == 20
    assert full.startswith(docs.rendered) and len(docs.rendered) < len(full)


def test_context_cap_ends_the_run(local_retriever):
    backend = ScriptedBackend([SEARCH, ANSWER])
    prompt_tokens = backend.count_tokens(protocol.user_message("q"))
    settings = AgentSettings(max_context_tokens=prompt_tokens + 40, on_context_full="stop")
    done = finished_of(list(run_agent("q", backend, local_retriever, settings)))
    assert done.stop_reason == "context_full" and done.searches == 1
    too_long = AgentSettings(max_prompt_tokens=prompt_tokens - 1)
    assert finished_of(list(run_agent("q", backend, local_retriever, too_long))).stop_reason == (
        "context_full")


def test_cancel_between_tokens(local_retriever):
    cancel = threading.Event()
    backend = ScriptedBackend(["word " * 200], delay=0.001)
    deltas = 0
    for event in run_agent("q", backend, local_retriever, cancel=cancel):
        if isinstance(event, TextDelta):
            deltas += 1
            if deltas == 5:
                cancel.set()
        last = event
    assert last.stop_reason == "cancelled" and last.new_tokens < 10


def test_retriever_failure_is_an_error_event():
    class Down:
        def search(self, queries, topk=3):
            raise RetrieverError("Could not reach the retriever at http://127.0.0.1:9/retrieve")

    done = finished_of(list(run_agent("q", ScriptedBackend([SEARCH]), Down())))
    assert done.stop_reason == "error" and "127.0.0.1:9" in done.error


def test_batch_equals_one_by_one_and_batches_searches(local_retriever):
    def script(question: str, n: int) -> str:
        if "Paris" in question:
            return ANSWER
        return ["<search> " + question + " </search>", "no action", ANSWER][min(n, 2)]

    questions = ["capital of France Paris", "speed of light", "Beethoven symphony"]
    calls = []

    class CountingRetriever:
        def search(self, queries, topk=3):
            calls.append(list(queries))
            return local_retriever.search(queries, topk)

    batch_backend = ScriptedBackend(script)
    batched = dict(run_agent_batch(questions, batch_backend, CountingRetriever()))
    single = [finished_of(list(run_agent(q, ScriptedBackend(script), local_retriever)))
              for q in questions]
    for i, one in enumerate(single):
        assert batched[i].trajectory == one.trajectory
        assert batched[i].stop_reason == one.stop_reason
    assert calls == [["speed of light?", "Beethoven symphony?"]]  # one batch for both
    assert batch_backend.batch_sizes == [3, 2, 2]


def test_events_serialise(local_retriever):
    import json

    for event in run_agent("q", ScriptedBackend([SEARCH, ANSWER]), local_retriever):
        data = json.loads(json.dumps(event_to_dict(event)))
        assert data["event"] == type(event).__name__
        if isinstance(event, DocumentsReturned):
            assert data["docs"][0]["title"] and "score" in data["docs"][0]


@pytest.mark.parametrize("bad", ["", "   "])
def test_empty_question_still_runs_the_protocol(bad, local_retriever):
    # Front ends reject empty questions; the loop itself just follows the protocol.
    done = finished_of(list(run_agent(bad, ScriptedBackend([ANSWER]), local_retriever)))
    assert done.prompt.endswith("Question: ?\n")
