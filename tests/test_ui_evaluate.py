"""The Evaluate tab's handler: the evaluator's runner on a sample, from the UI."""

from __future__ import annotations

import json

from app.ui.context import Studio
from app.ui.evaluate_tab import evaluate_sample
from app.ui.model_pool import ModelPool
from tests.scripted_backend import ScriptedBackend
from tests.test_evaluator import FACTS, scripted, write_fixture


def studio_with(backend, retriever) -> Studio:
    return Studio(pool=ModelPool(lambda model: backend), retriever=retriever)


def test_evaluate_sample_scores_and_writes_a_run(tmp_path, monkeypatch, local_retriever):
    monkeypatch.chdir(tmp_path)
    data = write_fixture(tmp_path / "data")
    seen = []
    summary, table = evaluate_sample(studio_with(scripted(), local_retriever), "scripted-model",
                                     "nq", 3, 0, str(data), 4,
                                     progress=lambda value, desc: seen.append(value))
    assert "3 questions" in summary and "EM " in summary
    assert len(table) == 3 and set(table["question"]) <= set(FACTS)
    assert seen[-1] == (3, 3)
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1
    lines = (runs[0] / "nq.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(x)["searches"] == 1 for x in lines)


def test_evaluate_sample_reports_bad_input(tmp_path, monkeypatch, local_retriever):
    monkeypatch.chdir(tmp_path)
    studio = studio_with(ScriptedBackend(["<answer> x </answer>"]), local_retriever)
    assert "Pick a model" in evaluate_sample(studio, " ", "nq", 3, 0, "", 4)[0]
    missing = evaluate_sample(studio, "m", "nq", 3, 0, str(tmp_path / "nowhere"), 4)[0]
    assert "Could not load nq" in missing

    def broken(model):
        from agent.backends.base import ModelLoadError

        raise ModelLoadError("offline and not cached")

    studio.pool = ModelPool(broken)
    data = write_fixture(tmp_path / "data")
    assert "offline and not cached" in evaluate_sample(studio, "m", "nq", 3, 0, str(data), 4)[0]
