"""benchmarks/flagship.py: Qwen2.5-3B's shape, and the script run as a user runs it."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.flagship import main, model_shape

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^\((a|b|c)\) .+?\s{2,}([\d.]+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)$")


def test_full_shape_is_qwen25_3b():
    """The exact configuration holds Qwen2.5-3B's published 3.09B parameters (counted on
    the meta device, nothing allocated), with its layout."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**model_shape(None))
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == 3_085_938_688
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
            config.num_key_value_heads, config.intermediate_size, config.vocab_size,
            config.max_position_embeddings) == (36, 2048, 16, 2, 11008, 151936, 32768)
    assert config.rope_parameters["rope_theta"] == 1e6


@pytest.mark.parametrize("scale", [0.0625, 0.125, 0.25, 0.5])
def test_scaled_shape_keeps_the_ratios_and_vocabulary(scale):
    full, shape = model_shape(None), model_shape(scale)
    heads = shape["num_attention_heads"]
    assert heads == 16 * scale and shape["hidden_size"] == 128 * heads
    assert shape["intermediate_size"] / shape["hidden_size"] == 11008 / 2048
    assert shape["num_key_value_heads"] == max(1, heads // 8)
    assert shape["num_hidden_layers"] == max(1, round(36 * scale))
    assert {k: v for k, v in shape.items() if k not in
            ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads")} == {k: v for k, v in full.items() if k not in
                                         ("hidden_size", "intermediate_size",
                                          "num_hidden_layers", "num_attention_heads",
                                          "num_key_value_heads")}


@pytest.mark.parametrize("argv, says", [
    (["--scale", "0"], "--scale 0.0: give a factor in (0, 1]"),
    (["--scale", "1.5"], "give a factor in (0, 1]"),
    (["--questions", "0"], "--questions 0: give 1 to"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    (["--json", "/no/such/folder/out.json"], "--json: folder /no/such/folder does not exist"),
])
def test_bad_flags_exit_2_before_any_work(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


def test_full_without_cuda_exits_2(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: --full is allowed here")
    with pytest.raises(SystemExit) as exit_:
        main(["--full"])
    assert exit_.value.code == 2
    assert "needs a CUDA device" in capsys.readouterr().err


@pytest.mark.slow
def test_smallest_run_prints_positive_figures_for_the_same_questions(tmp_path):
    out = tmp_path / "flagship.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.flagship", "--scale", "0.0625", "--questions", "2",
         "--max-turns", "1", "--max-new-tokens", "4", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = {m[1]: [float(x) for x in m.groups()[1:]]
            for m in map(ROW.match, done.stdout.splitlines()) if m}
    assert {"a", "b"} <= rows.keys(), done.stdout
    for seconds, new_tokens, tokens_per_s, per_min, _searches in rows.values():
        assert seconds > 0 and new_tokens > 0 and tokens_per_s > 0 and per_min > 0
    ratio = re.search(r"\(a\) / \(b\): ([\d.]+)x questions/min, ([\d.]+)x tokens/s",
                      done.stdout)
    assert ratio and float(ratio[1]) > 0 and float(ratio[2]) > 0, done.stdout
    assert "same 2 questions: yes" in done.stdout
    assert "throughput figures, not accuracy" in done.stdout
    import torch

    if not torch.cuda.is_available():
        assert "GPU figure pending: run `python -m benchmarks.flagship --full` on a GPU" \
            in done.stdout
    figures = json.loads(out.read_text(encoding="utf-8"))
    batched, one = figures["paths"]["batched"], figures["paths"]["one_at_a_time"]
    assert batched["ids"] == one["ids"] and len(one["ids"]) == 2
    for path in (batched, one):
        assert path["tokens_per_s"] > 0 and path["questions_per_min"] > 0
        # Every turn of a random model runs to the budget: 2 rounds of 4 tokens a question.
        assert path["new_tokens"] == [8, 8]
    assert figures["config"]["vocab_size"] == 151936 and figures["parameters"] > 0
    if importlib.util.find_spec("vllm") is None:
        assert "vLLM not installed: skipped" in done.stdout
        assert figures["skipped"]["vllm"] == "vLLM not installed"
