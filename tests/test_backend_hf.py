"""The transformers backend on tiny Qwen2 models the tests build, loaded like hub models."""

from __future__ import annotations

import pytest

from agent import protocol
from agent.backends.base import ModelLoadError, Sampling
from agent.backends.hf import TransformersBackend
from agent.events import AnswerGiven, DocumentsReturned, Finished, TextDelta
from agent.loop import AgentSettings, run_agent, run_agent_batch
from agent.models import check_loadable

# Serves or runs models: outside the fast loop (`pytest -m "not slow"`).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def scripted(tiny_models):
    return TransformersBackend(str(tiny_models["scripted"]))


@pytest.fixture(scope="module")
def random_model(tiny_models):
    return TransformersBackend(str(tiny_models["random"]))


def test_prompt_uses_the_chat_template(scripted):
    prompt = scripted.build_prompt("who wrote hamlet")
    assert prompt == ("<|im_start|>user\n" + protocol.user_message("who wrote hamlet")
                      + "<|im_end|>\n<|im_start|>assistant\n")


def test_real_model_searches_then_answers(scripted, local_retriever):
    settings = AgentSettings(max_obs_tokens=4000)
    events = list(run_agent("which film", scripted, local_retriever, settings))
    done = events[-1]
    assert isinstance(done, Finished) and done.stop_reason == "answer"
    assert done.searches == 1 and done.turns == 2
    # The stop string fired right at `</search>`: the turn is the scripted path, no more.
    first_turn = done.response.split("\n\n<information>")[0]
    assert first_turn.startswith("<think>") and first_turn.endswith("</search>")
    docs = next(e for e in events if isinstance(e, DocumentsReturned))
    assert docs.docs and docs.rendered in done.trajectory
    answer = next(e for e in events if isinstance(e, AnswerGiven))
    assert done.response.endswith("</answer>") and answer.answer in done.response
    # Streaming: many deltas, which together are the generated text.
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(deltas) >= 4
    generated = done.response.replace(docs.rendered, "")
    assert "".join(deltas) == generated
    # The two scripted paths: the search turn stops at `</search>`, the answer turn runs on
    # past `</answer>` to EOS (counted).
    assert done.new_tokens == 7 + 4


def test_eos_ends_a_turn_and_optionally_the_run(tiny_models, local_retriever):
    backend = TransformersBackend(str(tiny_models["eos"]))
    *_, last = backend.stream([backend.build_prompt("q")], 50, Sampling())
    assert last.finish == "eos" and last.text == "<think> the</think>" and last.new_tokens == 4
    stopped = list(run_agent("q", backend, local_retriever, AgentSettings(stop_on_eos=True)))
    assert stopped[-1].stop_reason == "eos" and stopped[-1].turns == 1
    protocol_run = list(run_agent("q", backend, local_retriever, AgentSettings(max_turns=1)))
    assert protocol_run[-1].stop_reason == "max_turns"
    assert protocol.INVALID_ACTION_MESSAGE in protocol_run[-1].trajectory


def test_token_budget_and_max_turns_hold(random_model, local_retriever):
    settings = AgentSettings(max_turns=2, max_new_tokens=6)
    done = list(run_agent("q", random_model, local_retriever, settings))[-1]
    assert done.stop_reason == "max_turns" and done.turns == 3
    assert done.new_tokens == 3 * 6 and done.invalid_actions == 2


def _first_forward_lengths(backend):
    """Record how many tokens the first forward pass of each generate call is fed."""
    seen: list[int] = []
    original = backend.model.forward

    def forward(*args, **kwargs):
        ids = kwargs.get("input_ids")
        seen.append(ids.shape[1] if ids is not None else -1)
        return original(*args, **kwargs)

    backend.model.forward = forward
    return seen


def test_kv_reuse_gives_the_same_tokens_as_reencoding(tiny_models, local_retriever):
    settings = AgentSettings(max_turns=2, max_new_tokens=12)
    reuse = TransformersBackend(str(tiny_models["random"]), reuse_cache=True)
    fresh = TransformersBackend(str(tiny_models["random"]), reuse_cache=False)
    fed = _first_forward_lengths(reuse)
    a = list(run_agent("who wrote hamlet", reuse, local_retriever, settings))[-1]
    b = list(run_agent("who wrote hamlet", fresh, local_retriever, settings))[-1]
    assert a.trajectory == b.trajectory and a.new_tokens == b.new_tokens == 36
    # Later turns fed only the new tokens (observation / invalid note), not the whole context.
    prefills = [n for n in fed if n > 1]
    context = reuse.count_tokens(a.trajectory)
    assert prefills[0] == reuse.count_tokens(a.prompt)
    assert len(prefills) == 3 and all(n < context // 3 for n in prefills[1:])


def test_batched_equals_one_by_one(random_model, local_retriever):
    questions = ["who wrote hamlet", "what is the speed of light in vacuum", "capital of peru"]
    settings = AgentSettings(max_turns=1, max_new_tokens=10)
    batched = dict(run_agent_batch(questions, random_model, local_retriever, settings))
    for i, q in enumerate(questions):
        one = list(run_agent(q, random_model, local_retriever, settings))[-1]
        assert batched[i].trajectory == one.trajectory, i
        assert batched[i].new_tokens == one.new_tokens


def test_batched_rounds_reuse_the_cache_and_match_one_by_one(tiny_models, local_retriever):
    questions = ["who wrote hamlet", "what is the speed of light in vacuum", "capital of peru"]
    settings = AgentSettings(max_turns=2, max_new_tokens=9)
    reuse = TransformersBackend(str(tiny_models["random"]), reuse_cache=True)
    fed = _first_forward_lengths(reuse)
    batched = dict(run_agent_batch(questions, reuse, local_retriever, settings))
    fresh = TransformersBackend(str(tiny_models["random"]), reuse_cache=False)
    again = dict(run_agent_batch(questions, fresh, local_retriever, settings))
    for i, q in enumerate(questions):
        one = list(run_agent(q, fresh, local_retriever, settings))[-1]
        assert batched[i].trajectory == again[i].trajectory == one.trajectory, i
    prefills = [n for n in fed if n > 1]
    context = max(reuse.count_tokens(r.trajectory) for r in batched.values())
    assert len(prefills) == 3 and prefills[0] > 100
    assert all(n < context // 3 for n in prefills[1:])  # rounds 2, 3 fed only what was new


def test_batched_real_model_search_and_answer(scripted, local_retriever):
    settings = AgentSettings(max_obs_tokens=4000)
    results = dict(run_agent_batch(["a", "b", "c"], scripted, local_retriever, settings))
    assert sorted(results) == [0, 1, 2]
    assert all(r.stop_reason == "answer" and r.searches == 1 for r in results.values())


def test_missing_models_fail_fast_with_advice(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache"):
        check_loadable("SEGAgentRL/LLDS-A-GRPO-Qwen2.5-3B-Base-MA")
    with pytest.raises(ModelLoadError, match="no config.json"):
        check_loadable(str(tmp_path))
    with pytest.raises(ModelLoadError, match="neither a local directory nor a hub id"):
        check_loadable("not a model")
    with pytest.raises(ModelLoadError):
        TransformersBackend("SEGAgentRL/LLDS-A-GRPO-Qwen2.5-3B-Base-MA")


def test_an_abandoned_stream_stops_generating_and_leaves_a_clean_cache(tiny_models,
                                                                       local_retriever):
    backend = TransformersBackend(str(tiny_models["random"]))
    settings = AgentSettings(max_turns=1, max_new_tokens=20)
    stream = backend.stream([backend.build_prompt("first question")], 200, Sampling())
    next(stream), next(stream)
    stream.close()  # e.g. a browser tab closed mid-answer
    assert not backend._lock.locked()
    after = list(run_agent("second question", backend, local_retriever, settings))[-1]
    fresh = TransformersBackend(str(tiny_models["random"]), reuse_cache=False)
    expected = list(run_agent("second question", fresh, local_retriever, settings))[-1]
    assert after.trajectory == expected.trajectory


def _forward_batch_sizes(backend):
    """Record how many rows each forward pass of the model runs."""
    seen: list[int] = []
    original = backend.model.forward

    def forward(*args, **kwargs):
        seen.append(kwargs["input_ids"].shape[0])
        return original(*args, **kwargs)

    backend.model.forward = forward
    return seen


def test_a_straggler_row_decodes_alone_and_matches_one_by_one(tiny_models):
    """Three rows stop after 3 tokens, one runs to 40: the three stop decoding with it."""
    questions = ["who wrote hamlet", "capital of peru", "speed of light", "who painted it"]
    budgets = [3, 3, 3, 40]
    backend = TransformersBackend(str(tiny_models["random"]), reuse_cache=True)
    contexts = [[protocol.build_prompt(q, backend.tokenizer)] for q in questions]
    rows = _forward_batch_sizes(backend)
    outputs = backend.generate(contexts, budgets, Sampling())
    alone = TransformersBackend(str(tiny_models["random"]), reuse_cache=False)
    for context, budget, output in zip(contexts, budgets, outputs, strict=True):
        assert output == list(alone.stream(context, budget, Sampling()))[-1]
    assert outputs[3].new_tokens == 40 and outputs[3].finish == "length"
    assert rows.count(4) <= 3  # prefill and two decoding steps, then the cut
    assert rows.count(1) >= 37  # the straggler's remaining steps, on its own

    # The next round still continues every row from the cache: it feeds what was new.
    fed = _first_forward_lengths(backend)
    after = [c + [o.text, protocol.INVALID_ACTION_MESSAGE] for c, o in zip(contexts, outputs,
                                                                          strict=True)]
    again = backend.generate(after, [6] * 4, Sampling())
    assert again == alone.generate(after, [6] * 4, Sampling())
    new_for_straggler = (backend.count_tokens(outputs[3].text)
                         + backend.count_tokens(protocol.INVALID_ACTION_MESSAGE))
    assert fed[0] <= new_for_straggler < backend.count_tokens("".join(after[3])) // 2


def test_rows_of_unlike_lengths_fill_their_cache_by_group_and_match_one_by_one(tiny_models):
    """Short first turns beside long contexts (visitors joining others at their documents):
    each group of like length is computed on its own columns, not all rows at the padded
    width, and every row's tokens are those it gets alone."""
    backend = TransformersBackend(str(tiny_models["random"]), reuse_cache=False)
    documents = protocol.observation(" ".join(["the old city lies on the wide river"] * 30))
    contexts = [[protocol.build_prompt(q, backend.tokenizer)] + ([documents] if long else [])
                for q, long in [("who wrote hamlet", False), ("speed of light", True),
                                ("capital of peru", False), ("who painted it", True)]]
    lengths = [len(backend.context_ids(c)) for c in contexts]
    assert max(lengths) > 3 * min(lengths)
    shapes: list[tuple[int, int]] = []
    original = backend.model.forward

    def forward(*args, **kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))
        return original(*args, **kwargs)

    backend.model.forward = forward
    outputs = backend.generate(contexts, [8] * 4, Sampling())
    alone = TransformersBackend(str(tiny_models["random"]), reuse_cache=False)
    for context, output in zip(contexts, outputs, strict=True):
        assert output == list(alone.stream(context, 8, Sampling()))[-1]
    prefills = [shape for shape in shapes if shape[1] > 1]
    assert sorted(prefills) == [(2, max(lengths[0], lengths[2]) - 1),
                                (2, max(lengths[1], lengths[3]) - 1)]
    assert shapes.count((4, 1)) == 8  # then all four decode together, a column a step


def test_two_loads_in_two_threads_take_turns(tiny_models, monkeypatch):
    """transformers' loader is not safe to run twice at once in one process: loads wait for
    each other, and both models come out whole."""
    import threading
    import time

    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained.__func__
    inside, most = [0], [0]
    guard = threading.Lock()

    def counting(cls, *args, **kwargs):
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.3)  # long enough for the other thread to arrive
        try:
            return original(cls, *args, **kwargs)
        finally:
            with guard:
                inside[0] -= 1

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(counting))
    loaded = []
    threads = [threading.Thread(target=lambda: loaded.append(
        TransformersBackend(str(tiny_models["random"])))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == 1
    assert len(loaded) == 2
    assert all(p.device.type != "meta" for b in loaded for p in b.model.parameters())
