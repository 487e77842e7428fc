"""The nano agent's held-out set is a benchmark the evaluator knows by name, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agent.testing import ROOT
from evaluator.benchmarks import DataError, load_with_warnings


def test_vitalqa_loads_without_a_data_dir():
    questions, notes = load_with_warnings("vitalqa", limit=5)
    assert len(questions) == 5 and notes == []
    assert all(q.golden_answers and q.question for q in questions)
    assert questions[0].id != questions[1].id


def test_unknown_name_lists_the_local_sets_too():
    with pytest.raises(DataError, match="vitalqa"):
        load_with_warnings("not-a-benchmark")


@pytest.mark.slow
def test_evaluator_cli_scores_the_nano_agent_on_vitalqa(tmp_path):
    """`python -m evaluator --datasets vitalqa` with no --model: offline → the nano agent."""
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("LLDS_MODEL", None)
    done = subprocess.run(
        [sys.executable, "-m", "evaluator", "--datasets", "vitalqa", "--limit", "3",
         "--engine", "bm25s", "--output", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    row = summary["datasets"]["vitalqa"]
    assert row["n"] == 3 and row["complete"] and row["errored"] == 0
    assert summary["settings"]["model"] == "nano"
    records = [json.loads(line) for line in (out / "vitalqa.jsonl").read_text().splitlines()]
    assert len(records) == 3
    # The nano agent searches and answers in the protocol's format (its card: 100 % well-formed).
    assert all(r["prediction"] for r in records)
