"""The hand-wired induction circuit (nano/wire.py): a fresh model copies spans it has read
before any training, and the training CLI path writes it in."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 4000


def _fresh(hidden: int = 128, heads: int = 2, kv_heads: int = 1, layers: int = 2):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads,
                         intermediate_size=2 * hidden, max_position_embeddings=2048,
                         tie_word_embeddings=True, rope_theta=1e6,
                         attn_implementation="eager")
    return Qwen2ForCausalLM(config).eval()


def _copy_loss(model) -> float:
    """Mean loss on the induction batches' copied spans (contexts of 300-500 tokens)."""
    import torch

    from nano.sft import batch_loss, induction_examples

    rows = induction_examples(random.Random(7), low=3, high=VOCAB, rows=6, context=(300, 500))
    with torch.no_grad():
        return batch_loss(model, rows, range(len(rows)), 1.0)[2]


def test_a_wired_fresh_model_copies_spans_from_random_places():
    import torch

    from nano.wire import wire_induction

    torch.set_num_threads(1)
    model = _fresh()
    before = _copy_loss(model)
    wire_induction(model, seed=0)
    after = _copy_loss(model)
    chance = math.log(VOCAB - 3)
    # measured: 8.29 before (chance 8.29), 0.2-0.3 after, with no training at all
    assert before > 0.95 * chance and after < 1.0, (before, after)
    tokens = torch.arange(100, 400)[None]
    with torch.no_grad():
        attention = model(tokens, output_attentions=True).attentions[0][0, 0]
    one_back = attention[torch.arange(1, 300), torch.arange(0, 299)]
    assert one_back.min() > 0.9  # layer 0, head 0 looks exactly one token back


def test_wire_induction_refuses_a_model_too_small_for_it():
    from nano.wire import wire_induction

    with pytest.raises(ValueError, match="needs hidden >= 128, head_dim >= 64"):
        wire_induction(_fresh(hidden=64, heads=2))


@pytest.mark.slow
def test_train_cli_wires_the_fresh_model(micro_data, tmp_path):
    """python -m nano train --wire-induction: the saved model (0 steps) copies, with rope_theta
    1e6; the same command without the flag gives a model at chance."""
    from transformers import Qwen2ForCausalLM

    data = micro_data
    losses = {}
    for flag in ("--wire-induction", None):
        out = tmp_path / ("wired" if flag else "plain")
        command = [sys.executable, "-m", "nano", "train", "--data", str(data / "train.jsonl"),
                   "--tokenizer", str(data / "tokenizer"), "--out", str(out), "--hidden", "128",
                   "--heads", "2", "--kv-heads", "1", "--layers", "2", "--intermediate", "256",
                   "--steps", "0", "--threads", "1"] + ([flag] if flag else [])
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]
        model = Qwen2ForCausalLM.from_pretrained(str(out)).eval()
        params = model.config.rope_parameters or {}
        assert params.get("rope_theta") == (1e6 if flag else 10000.0)
        losses[flag] = _copy_loss(model)
    assert losses["--wire-induction"] < 1.0 < 7.0 < losses[None], losses


@pytest.mark.slow
def test_train_cli_refuses_wiring_given_weights(micro_data, tmp_path):
    """--wire-induction with --init: a clear error, exit 2, and nothing written to --out."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "nano", "train", "--data",
               str(micro_data / "train.jsonl"), "--tokenizer", str(micro_data / "tokenizer"),
               "--out", str(out), "--init", str(ROOT / "assets" / "nano-agent"),
               "--wire-induction", "--steps", "0", "--threads", "1"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "error: --wire-induction writes a circuit into fresh weights" in result.stderr
    assert "pass one of the two" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()
