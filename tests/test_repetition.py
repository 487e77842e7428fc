"""The studio's repetition stop (agent/repetition.py, AgentSettings.stop_repeats): the tail
detector, the loop with a scripted double, and the real path (a tiny Qwen2 model through the
transformers backend that writes one token forever)."""

from __future__ import annotations

import re

import pytest

from agent.events import Finished
from agent.loop import AgentSettings, run_agent, run_agent_batch
from agent.repetition import describe, repeated_tail
from tests.scripted_backend import ScriptedBackend


def test_the_tail_is_one_short_unit_written_at_least_n_times():
    assert repeated_tail("</think>" + " answer" * 70, 64) == (" answer", 70)
    assert repeated_tail("2" + "0" * 485, 64) == ("0", 485)
    assert repeated_tail(" answer" * 63, 64) is None  # one short
    assert repeated_tail(" answer" * 70 + " done", 64) is None  # the tail moved on
    assert repeated_tail("\n" * 500, 64) is None  # blank lines are not degeneration
    assert repeated_tail("a long sentence that repeats. " * 80, 64) is None  # unit > 16
    assert repeated_tail("abab" * 40, 64) == ("ab", 80)  # the shortest unit
    with pytest.raises(ValueError, match="at least 2"):
        repeated_tail("x", 1)
    assert describe(" answer", 64) == ("stopped: `answer` repeated 64 times in a row; the "
                                       "published protocol would run on to the turn limit")


def test_a_degenerate_turn_stops_with_its_reason_and_the_protocol_does_not(local_retriever):
    degenerate = "<think>so</think>" + " answer" * 400
    on = AgentSettings(stop_repeats=64)
    events = list(run_agent("q", ScriptedBackend([degenerate] * 5), local_retriever, on))
    done = events[-1]
    assert isinstance(done, Finished) and done.stop_reason == "repetition"
    assert done.turns == 1 and 64 <= done.new_tokens < 80
    assert done.stop_detail.startswith("stopped: `answer` repeated 6")
    off = list(run_agent("q", ScriptedBackend([degenerate] * 5), local_retriever))[-1]
    assert off.stop_reason == "max_turns" and off.new_tokens > 1900  # the published protocol
    # A turn that answers, then rambles, is an answer: the cut text decides, not the tail.
    answered = "<answer> Paris </answer>" + " answer" * 100
    done = list(run_agent("q", ScriptedBackend([answered]), local_retriever, on))[-1]
    assert done.stop_reason == "answer" and done.answer == "Paris"
    # The batched path (the evaluator's) keeps the protocol whatever the setting.
    _, batch = next(run_agent_batch(["q"], ScriptedBackend([degenerate] * 5),
                                    local_retriever, on))
    assert batch.stop_reason == "max_turns"
    with pytest.raises(ValueError, match="0 \\(off\\) or at least 2"):
        AgentSettings(stop_repeats=1)


@pytest.mark.slow
def test_a_real_model_that_writes_one_token_forever_is_stopped(tiny_models, local_retriever,
                                                               tmp_path):
    from transformers import AutoTokenizer

    from agent.backends.hf import TransformersBackend
    from agent.testing import build_scripted

    tokenizer = AutoTokenizer.from_pretrained(tiny_models["scripted"])
    looping = build_scripted(tmp_path / "loop", tokenizer,
                             paths={"\n": ["<think>", " the", "</think>", " world", " world"]})
    backend = TransformersBackend(str(looping), device="cpu")
    settings = AgentSettings(max_new_tokens=200, max_turns=1, stop_repeats=16)
    done = list(run_agent("q", backend, local_retriever, settings))[-1]
    assert done.stop_reason == "repetition", done
    assert done.new_tokens < 40 and done.turns == 1
    # Stopped at the 16th repeat; the backend may write one more before it reads the stop.
    assert re.search(r"`world` repeated 1[67] times", done.stop_detail), done.stop_detail
    full = list(run_agent("q", backend, local_retriever,
                          AgentSettings(max_new_tokens=200, max_turns=1)))[-1]
    assert full.stop_reason == "max_turns" and full.new_tokens == 400  # two rounds of 200
