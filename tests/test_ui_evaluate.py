"""The Evaluate tab's handler: the evaluator's runner on a sample, from the UI."""

from __future__ import annotations

import json

from app.ui.context import Studio
from app.ui.evaluate_tab import download_texts, evaluate_sample
from app.ui.model_pool import ModelPool
from tests.scripted_backend import ScriptedBackend
from tests.test_evaluator import FACTS, scripted, write_fixture


def studio_with(backend, retriever) -> Studio:
    return Studio(pool=ModelPool(lambda model: backend), retriever=retriever)


def test_evaluate_sample_scores_and_writes_a_run(tmp_path, monkeypatch, local_retriever):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLDS_DATA_DIR", str(tmp_path))
    data = write_fixture(tmp_path / "data")
    seen = []
    result = evaluate_sample(studio_with(scripted(), local_retriever), "scripted-model",
                             "nq", 3, 0, str(data), 4,
                             progress=lambda value, desc: seen.append((value, desc)))
    summary, table, records = result
    assert "3 questions" in summary and "EM " in summary
    assert len(table) == 3 and set(table["question"]) <= set(FACTS)
    # Progress from the start (0 of 3), then each answer; never a bare timer.
    assert seen[0] == ((0, 3), "0 of 3 questions answered (3 asked at once, so several "
                                "finish together)")
    assert seen[-1][0] == (3, 3)
    # Between answers, each turn of the questions asked together moves the line on.
    turns = [desc for _, desc in seen if "; turn " in desc]
    assert turns and turns[0].endswith("; turn 1 done, 3 still searching")
    files = download_texts("nq", result)
    assert list(files) == ["nq-sample-3.jsonl", "nq-sample-3.csv", "nq-sample-3-summary.md"]
    rows = [json.loads(line) for line in files["nq-sample-3.jsonl"].splitlines()]
    assert {r["id"] for r in rows} == {r.id for r in records} and all(
        "trajectory" in r and "prediction" in r for r in rows)
    assert files["nq-sample-3.csv"].splitlines()[0] == "question,prediction,golden,EM,searches,stop"
    assert files["nq-sample-3-summary.md"].startswith(summary)
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1
    lines = (runs[0] / "nq.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(x)["searches"] == 1 for x in lines)
    # provenance recorded as the CLI records it, and a second press adds no second entry
    settings = json.loads((runs[0] / "settings.json").read_text())
    (entry,) = settings["provenance"]
    assert entry["model"]["id"] == "scripted-model"
    assert entry["retriever"]["engine"] == "bm25s"
    assert entry["retriever"]["documents"] == local_retriever.engine.num_docs > 1000
    assert set(entry["data"]) == {"nq"} and "torch" in entry["packages"]
    evaluate_sample(studio_with(scripted(), local_retriever), "scripted-model", "nq", 3, 0,
                    str(data), 4)
    assert len(json.loads((runs[0] / "settings.json").read_text())["provenance"]) == 1


def test_a_retriever_the_studio_did_not_open_is_recorded_as_such(tmp_path, monkeypatch,
                                                                 local_retriever):
    class Wrapped:  # the operator's own retriever, around a real one
        def search(self, queries, topk=3):
            return local_retriever.search(queries, topk)

    monkeypatch.setenv("LLDS_DATA_DIR", str(tmp_path))
    data = write_fixture(tmp_path / "data")
    summary, table, _ = evaluate_sample(studio_with(scripted(), Wrapped()), "scripted-model",
                                        "nq", 2, 0, str(data), 4)
    assert "2 questions" in summary and len(table) == 2
    (run,) = (tmp_path / "runs").iterdir()
    (entry,) = json.loads((run / "settings.json").read_text())["provenance"]
    assert entry["retriever"]["kind"] == "Wrapped" and "not one the studio" in \
        entry["retriever"]["note"]


def test_evaluate_sample_reports_bad_input(tmp_path, monkeypatch, local_retriever):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLDS_DATA_DIR", str(tmp_path))
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


def test_results_go_to_the_user_data_directory_and_messages_speak_of_the_tab(
        tmp_path, monkeypatch, local_retriever):
    from app.ui.evaluate_tab import results_root

    work, data_home = tmp_path / "checkout", tmp_path / "data-home"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("LLDS_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(data_home))
    assert results_root() == data_home / "llds-studio" / "runs"
    monkeypatch.setenv("LLDS_DATA_DIR", str(tmp_path / "mine"))
    assert results_root() == tmp_path / "mine" / "runs"
    seen = []
    summary, *_ = evaluate_sample(studio_with(scripted(), local_retriever), "scripted-model",
                                 "nq", 3, 0, str(write_fixture(tmp_path / "data")), 4,
                                 progress=lambda value, desc: seen.append(desc))
    assert list(work.iterdir()) == []  # nothing written where the studio was started
    run = next((tmp_path / "mine" / "runs").iterdir())
    assert f"`{run / 'nq.jsonl'}`" in summary
    assert seen[-1].startswith("3 of 3 questions answered (")  # a count, not a score
    studio = studio_with(ScriptedBackend(["<answer> x </answer>"]), local_retriever)
    missing = evaluate_sample(studio, "m", "nq", 3, 0, str(tmp_path / "nowhere"), 4)[0]
    assert "Local benchmark directory" in missing and "--data-dir" not in missing
    assert "vitalqa or naturalqa" in missing
