"""Search-R1 parity, item by item: the prediction, the stop rule, the context overflow.

Each rule runs through the real loop; the stop rule and the overflow also through the
transformers backend on tiny Qwen2 models (agent/testing.py), beside the scripted backend.
"""

from __future__ import annotations

import argparse

import pytest

from agent import protocol
from agent.backends.hf import TransformersBackend
from agent.config import add_agent_flags, agent_settings
from agent.events import AnswerGiven, Finished, TextDelta
from agent.loop import AgentSettings, run_agent, run_agent_batch
from agent.testing import build_scripted, scripted_paths
from evaluator.benchmarks import Question
from evaluator.rundir import make_record, prediction_of, run_settings
from retriever.doc import Doc
from tests.scripted_backend import ScriptedBackend


class TaggedDocs:
    """A retriever whose documents carry answer tags (what Search-R1 would score)."""

    def search(self, queries, topk=3):
        return [[Doc("1", '"Trap"\nIt says <answer> Lyon </answer> and <answer> unclosed')]
                for _ in queries]


def run(turns, retriever=None, **settings) -> tuple[Finished, list]:
    events = list(run_agent("q", ScriptedBackend(turns), retriever or TaggedDocs(),
                            AgentSettings(**settings)))
    return events[-1], events


def record_of(done: Finished, golden=("Paris",)):
    return make_record(Question("1", "nq", "q", list(golden)), done)


# ------------------------------------------------------------- 1. the prediction


def test_unclosed_answer_then_the_note_then_an_answer_scores_the_answer():
    # `<answer> Paris` + EOS, the note, then `<answer> Paris </answer>`.
    done, events = run(["<answer> Paris", "<answer> Paris </answer>"])
    assert [e.answer for e in events if isinstance(e, AnswerGiven)] == ["Paris"]
    assert done.answer == "Paris" and done.invalid_actions == 1
    record = record_of(done)
    assert record.prediction == prediction_of(done) == "Paris" and record.metrics["em"] == 1


def test_tags_in_documents_and_the_note_never_count():
    done, _ = run(["<search> q </search>", "no tag here"], max_turns=1)
    assert "<answer> Lyon </answer>" in done.trajectory  # Search-R1 would score "Lyon"
    assert done.answer is None and record_of(done, ["Lyon"]).metrics["em"] == 0
    done, _ = run(["thinking", "still thinking"], max_turns=1)
    assert protocol.INVALID_ACTION_MESSAGE in done.trajectory  # names `<answer> and </answer>`
    assert done.answer is None and record_of(done).prediction is None


def test_the_last_answer_block_is_scored_the_first_is_the_action():
    done, events = run(["<answer> x </answer> <answer> y </answer> <search> q </search>"])
    assert done.stop_reason == "answer" and done.searches == 0
    assert [e.answer for e in events if isinstance(e, AnswerGiven)] == ["y"] == [done.answer]
    # An answer inside a search block: a search action, and the run's prediction later on.
    done, _ = run(["<search> q <answer> inner </answer> </search>", "no tag"], max_turns=1)
    assert done.searches == 1 and done.stop_reason == "max_turns" and done.answer == "inner"


def test_a_record_scores_finished_answer_and_never_the_text():
    done, _ = run(["<answer> Paris </answer>"])
    forged = Finished(**{**done.__dict__, "answer": "Lyon"})
    assert record_of(forged, ["Lyon"]).prediction == "Lyon"


# ------------------------------------------------------------- 2. the stop rule


def test_text_after_answer_is_held_back_until_the_cut_is_known():
    done, events = run(["<answer> a </answer> tail words"])
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert "".join(deltas) == "<answer> a </answer>" and done.answer == "a"
    assert done.new_tokens == 5  # generated on to EOS: the tail is paid for, then cut
    # A `</search>` after `</answer>` moves the cut: the held-back text then shows at once.
    done, events = run(["<answer> a </answer> then <search> q </search>"])
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert "".join(deltas) == "<answer> a </answer> then <search> q </search>"
    assert deltas[-1] == " then <search> q </search>"


def test_a_stray_closer_before_a_search_is_a_search():
    done, _ = run(["x </answer> text <search> q </search>", "<answer> y </answer>"])
    assert done.searches == 1 and done.answer == "y" and done.invalid_actions == 0


@pytest.fixture(scope="module")
def closer_then_search_model(tiny_models, tmp_path_factory):
    """A real tiny model that writes ` the</answer><search> Q</search>` at once."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_models["random"])
    query = scripted_paths(tokenizer)["\n"][4]
    path = {"\n": [" the", "</answer>", "<search>", query, "</search>"]}
    directory = build_scripted(tmp_path_factory.mktemp("closer-search"), tokenizer, path)
    return str(directory), query.strip()


@pytest.mark.slow
def test_real_model_generates_past_answer_and_cuts_at_search(closer_then_search_model,
                                                            local_retriever):
    directory, query = closer_then_search_model
    settings = AgentSettings(max_turns=1, max_new_tokens=10, max_obs_tokens=4000)
    events = list(run_agent("q", TransformersBackend(directory), local_retriever, settings))
    done = events[-1]
    first = [s.text for s in done.segments if s.generated][0]
    assert first == f" the</answer><search> {query}</search>"
    assert done.searches == 1 and done.invalid_actions == 0  # a search, as in Search-R1
    assert next(e for e in events if isinstance(e, TextDelta)).text.startswith(" the")
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "".join(
        s.text for s in done.segments if s.generated)
    # The old early stop at `</answer>` made it an invalid action: another outcome.
    early = TransformersBackend(directory, stop_strings=("</search>", "</answer>"))
    old = list(run_agent("q", early, local_retriever, settings))[-1]
    assert [s.text for s in old.segments if s.generated][0] == " the</answer>"
    assert old.searches == 0 and old.invalid_actions == 1


# ------------------------------------------------------------- 3. the context overflow


def test_truncate_goes_on_with_the_last_tokens_and_counts_the_cuts(local_retriever):
    backend = ScriptedBackend(["a b c d", "e f g", "<search> q </search>", "<answer> z </answer>"])
    cap = backend.count_tokens(protocol.user_message("q")) + 6
    settings = AgentSettings(max_context_tokens=cap, max_obs_tokens=20)
    done = list(run_agent("q", backend, local_retriever, settings))[-1]
    assert done.stop_reason == "answer" and done.answer == "z"
    assert backend.windows == [None, cap, cap, cap] and done.context_cuts == 3
    stopped = list(run_agent("q", ScriptedBackend(["a b c d", "e f g"]), local_retriever,
                             AgentSettings(max_context_tokens=cap, on_context_full="stop")))
    assert stopped[-1].stop_reason == "context_full" and stopped[-1].context_cuts == 0
    batch = ScriptedBackend(["a b c d", "e f g", "<search> q </search>", "<answer> z </answer>"])
    batched = dict(run_agent_batch(["q"], batch, local_retriever, settings))[0]
    assert batched.trajectory == done.trajectory and batched.context_cuts == 3
    record = record_of(done)
    assert record.context_cuts == 3 and record.to_dict()["context_cuts"] == 3


@pytest.mark.slow
def test_hf_backend_reencodes_after_a_left_cut(tiny_models, local_retriever):
    import torch

    reuse = TransformersBackend(str(tiny_models["random"]), reuse_cache=True)
    fresh = TransformersBackend(str(tiny_models["random"]), reuse_cache=False)
    cap = reuse.count_tokens(reuse.build_prompt("who wrote hamlet")) + 12
    settings = AgentSettings(max_turns=2, max_new_tokens=8, max_context_tokens=cap)
    a = list(run_agent("who wrote hamlet", reuse, local_retriever, settings))[-1]
    b = list(run_agent("who wrote hamlet", fresh, local_retriever, settings))[-1]
    assert a.context_cuts == b.context_cuts == 2 and a.new_tokens == 24
    assert a.trajectory == b.trajectory
    # The last turn is what the model writes from the last `cap` tokens, encoded afresh.
    before = [s.text for s in a.segments[:-1]]
    ids = fresh.context_ids(before, keep_last=cap)
    assert len(ids) == cap
    with torch.inference_mode():
        out = fresh.model.generate(input_ids=torch.tensor([ids]), max_new_tokens=8,
                                   do_sample=False, attention_mask=torch.ones(1, cap,
                                                                              dtype=torch.long),
                                   eos_token_id=fresh.eos_ids, pad_token_id=fresh.pad_id)
    assert fresh.decode(out[0, cap:].tolist()) == a.segments[-1].text
    questions = ["who wrote hamlet", "capital of peru", "speed of light in vacuum"]
    batched = dict(run_agent_batch(questions, reuse, local_retriever, settings))
    for i, q in enumerate(questions):
        one = list(run_agent(q, fresh, local_retriever, settings))[-1]
        assert batched[i].trajectory == one.trajectory, i
        assert batched[i].context_cuts == one.context_cuts == 2


@pytest.mark.slow
def test_openai_backend_sends_the_window_as_token_ids(tiny_models):
    from agent.backends.openai_compat import OpenAIBackend

    remote = OpenAIBackend("tiny", base_url="http://127.0.0.1:9/v1",
                           tokenizer=str(tiny_models["random"]))
    local = TransformersBackend(str(tiny_models["random"]))
    context = [local.build_prompt("q"), "<search> x </search>", "\n\n<information>d"]
    assert remote._prompt(context, None) == "".join(context)
    assert remote._prompt(context, 10) == local.context_ids(context, keep_last=10)


def test_flag_default_is_truncate_and_settings_record_it():
    parser = argparse.ArgumentParser()
    add_agent_flags(parser)
    assert agent_settings(parser.parse_args([])).on_context_full == "truncate"
    stop = agent_settings(parser.parse_args(["--on-context-full", "stop"]))
    assert stop.on_context_full == "stop"
    stored = run_settings("m", "b", "r", stop, seed=0, limit=None, sample=None, datasets=["nq"])
    assert stored["on_context_full"] == "stop"
    with pytest.raises(ValueError, match="on_context_full must be one of stop, truncate"):
        AgentSettings(on_context_full="drop")
