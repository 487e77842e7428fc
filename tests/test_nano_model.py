"""The shipped nano agent (assets/nano-agent): loads as any local checkpoint does, follows
the protocol, and on a fixed held-out sample of vitalqa reaches the EM measured for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent import protocol
from agent.loop import AgentSettings

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "assets" / "nano-agent"

# Measured with `python -m benchmarks.nano --limit 60` (greedy, top-3 BM25; see the model
# card's ATTEMPTS.md, the thirteenth attempt): EM 47/60 with retrieval, both one question
# at a time and batched, 0/60 without,
# 100 % well-formed, one search per question. Greedy decoding is deterministic; the
# tolerance covers float differences between machines (two questions either way).
SAMPLE = 60
MEASURED_EM = 47 / 60
MEASURED_WELL_FORMED = 1.0
MEASURED_EM_WITHOUT = 0.0
TOLERANCE = 2 / 60
WITHOUT_SAMPLE = 15


@pytest.fixture(scope="module")
def backend():
    import torch

    from agent.backends.hf import TransformersBackend

    torch.set_num_threads(2)
    return TransformersBackend(str(MODEL), device="cpu")


def test_files_and_size():
    names = {p.name for p in MODEL.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", "README.md"} <= names
    assert sum(p.stat().st_size for p in MODEL.iterdir()) <= 30 * 2**20


@pytest.mark.slow
def test_loads_like_a_qwen_checkpoint(backend):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(MODEL))
    assert backend.model.config.model_type == "qwen2"
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    generation = json.loads((MODEL / "generation_config.json").read_text())
    assert generation["eos_token_id"] == eos
    assert sorted(backend.eos_ids) == sorted(eos)
    prompt = protocol.build_prompt("who wrote hamlet", tokenizer)
    assert prompt == ("<|im_start|>user\n" + protocol.user_message("who wrote hamlet")
                      + "<|im_end|>\n<|im_start|>assistant\n")
    for tag in ("<search>", "</search>", "<answer>", "</answer>", "<information>"):
        assert len(tokenizer(tag, add_special_tokens=False)["input_ids"]) == 1


@pytest.mark.slow
def test_teacher_truncates_as_the_backend_does(backend, default_corpus):
    """Training observations were cut exactly as inference cuts them."""
    from nano.teacher import TeacherBackend
    from retriever.corpus import load_records

    records = load_records(default_corpus)[:6]
    text = protocol.observation(protocol.render_documents([r["contents"] for r in records]))
    teacher = TeacherBackend(backend.tokenizer, [], None, AgentSettings())
    for limit in (500, 137, 40):
        assert teacher.truncate(text, limit) == backend.truncate(text, limit)
    assert teacher.count_tokens(text) == backend.count_tokens(text)


@pytest.mark.slow
def test_held_out_em(backend):
    """Greedy on a fixed held-out sample: the EM measured for the shipped model (batched, as
    the evaluator runs it: the same answers as one at a time, several times faster)."""
    from nano.evaluate import EmptyRetriever, run_batched, score, vitalqa
    from retriever.client import LocalRetriever

    questions = vitalqa(limit=SAMPLE)
    with_docs = score(questions, run_batched(questions, backend, LocalRetriever("bm25"),
                                             AgentSettings()))
    assert with_docs["em"] == pytest.approx(MEASURED_EM, abs=TOLERANCE)
    assert with_docs["well_formed"] >= MEASURED_WELL_FORMED - TOLERANCE
    assert with_docs["searches"] == pytest.approx(1.0, abs=0.1)
    # Without documents the model searches again every round and may ramble to the turn
    # budget; two rounds of 64 tokens show as well that it has no answer of its own.
    few = questions[:WITHOUT_SAMPLE]
    short = AgentSettings(max_turns=2, max_new_tokens=64)
    without = score(few, run_batched(few, backend, EmptyRetriever(), short))
    assert without["em"] == MEASURED_EM_WITHOUT


@pytest.mark.slow
def test_naturalqa_test_em_is_the_figure_the_ask_tab_shows(backend):
    """All of naturalqa's test split (hand-written questions), batched as the evaluator runs
    them: the count right is the one `assets/ask_examples.json` records (measured one question
    at a time by `python -m app.ui.examples`) and the Ask tab shows beside its examples."""
    import time

    from app.ui.examples import examples_score
    from evaluator.benchmarks import LOCAL_BENCHMARKS, load_local
    from nano.evaluate import run_batched, score
    from retriever.client import LocalRetriever

    questions = load_local(LOCAL_BENCHMARKS["naturalqa"], "naturalqa")[0]
    start = time.perf_counter()
    result = score(questions, run_batched(questions, backend, LocalRetriever("bm25"),
                                          AgentSettings()))
    print(f"naturalqa test: EM {result['em']:.3f} on {len(questions)} questions in "
          f"{time.perf_counter() - start:.1f} s, per family {result['per_family']}")
    right, asked = examples_score()
    assert asked == len(questions)
    assert round(result["em"] * asked) == pytest.approx(right, abs=2)
    assert result["searches"] == pytest.approx(1.0, abs=0.05)  # one search a question
    # every run is judged once against what it retrieved, and "right" is EM's count
    assert sum(result["outcomes"].values()) == len(questions)
    assert result["outcomes"]["right"] == round(result["em"] * len(questions))
    assert result["outcomes"]["answer not retrieved"] < 0.1 * len(questions)  # it is reading
