"""Growing a trained model (nano/grow.py): more layers and a wider MLP that compute exactly
what the saved model computes until training moves them, and that training does move."""

from __future__ import annotations

import pytest

from nano.grow import grow
from nano.sft import TrainConfig, train
from tests.test_nano_train import MICRO


def _model(layers: int = 2, intermediate: int = 48):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=97, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=intermediate, tie_word_embeddings=True)).eval()


def test_the_grown_model_computes_what_the_saved_one_does():
    import torch

    small = _model()
    big = grow(small, layers=5, intermediate=128).eval()
    assert big.config.num_hidden_layers == 5 and big.config.intermediate_size == 128
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(big) > 2 * count(small)
    ids = torch.randint(0, 97, (3, 40))
    with torch.no_grad():
        assert torch.equal(small(ids).logits, big(ids).logits)
    # the new capacity is not all zeros: the new MLP units have random inputs
    assert big.model.layers[0].mlp.up_proj.weight[48:].abs().sum() > 0


def test_the_gradient_reaches_the_new_layers_and_units():
    import torch

    big = grow(_model(), layers=3, intermediate=64).train()
    ids = torch.randint(0, 97, (2, 30))
    big(ids, labels=ids).loss.backward()
    new_layer, old_layer = big.model.layers[2], big.model.layers[0]
    assert new_layer.mlp.down_proj.weight.grad.abs().sum() > 0
    assert new_layer.self_attn.o_proj.weight.grad.abs().sum() > 0
    assert old_layer.mlp.down_proj.weight.grad[:, 48:].abs().sum() > 0


def test_growing_only_adds():
    with pytest.raises(ValueError, match="growing only adds.*2 layers"):
        grow(_model(), layers=1)
    with pytest.raises(ValueError, match="MLP 48 wide"):
        grow(_model(), intermediate=32)


def test_train_grows_an_init_model_and_refuses_growth_without_one(micro_data, tmp_path):
    from transformers import Qwen2ForCausalLM

    base = dict(data=micro_data / "train.jsonl", tokenizer=micro_data / "tokenizer",
                **{**MICRO, "steps": 3, "save_every": 3})
    train(TrainConfig(out=tmp_path / "a", **{**base, "steps": 0}), log=lambda *_: None)
    lines: list[str] = []
    train(TrainConfig(out=tmp_path / "b", init=tmp_path / "a", grow_layers=4,
                      grow_intermediate=256, **base), log=lines.append)
    assert any("grown to 4 layers, MLP 256 wide" in line for line in lines)
    saved = Qwen2ForCausalLM.from_pretrained(str(tmp_path / "b"))
    assert (saved.config.num_hidden_layers, saved.config.intermediate_size) == (4, 256)
    # three steps moved the new layers' silent output projections off zero
    assert saved.model.layers[3].mlp.down_proj.weight.abs().sum() > 0
    with pytest.raises(ValueError, match="pass it with --init"):
        TrainConfig(out=tmp_path / "c", grow_layers=4, **base)


def test_grow_flags_on_the_command_line_as_the_model_card_runs_them(micro_data, tmp_path):
    """`python -m nano train --init DIR --grow-layers N --grow-intermediate M`, as a user runs
    it; without --init the same flags are refused before anything is read (exit 2)."""
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM

    from agent.testing import ROOT

    train(TrainConfig(data=micro_data / "train.jsonl", tokenizer=micro_data / "tokenizer",
                      out=tmp_path / "start", **{**MICRO, "steps": 0}), log=lambda *_: None)
    command = [sys.executable, "-m", "nano", "train", "--data", str(micro_data / "train.jsonl"),
               "--tokenizer", str(micro_data / "tokenizer"), "--out", str(tmp_path / "grown"),
               "--steps", "2", "--threads", "1", "--limit", "20", "--save-every", "2",
               "--grow-layers", "3", "--grow-intermediate", "256"]
    grown = subprocess.run([*command, "--init", str(tmp_path / "start")], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert grown.returncode == 0, grown.stderr[-2000:]
    assert "grown to 3 layers, MLP 256 wide" in grown.stdout
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "grown"))
    assert (model.config.num_hidden_layers, model.config.intermediate_size) == (3, 256)
    elsewhere = tmp_path / "refused"
    refused = subprocess.run([*command, "--out", str(elsewhere)], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "pass it with --init" in refused.stderr
    assert not elsewhere.exists()  # refused before anything was written
