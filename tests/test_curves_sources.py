"""Log folders and W&B transaction logs, written by the real libraries (SYNTHETIC values):
a TensorBoard logdir (torch's SummaryWriter), W&B offline runs (the wandb SDK), an MLflow
store (mlflow's client on its file store)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from curves import analyze_uploads
from curves.__main__ import main as curves_main
from curves.parse import LogFormatError
from curves.sources import read_source
from curves.synthetic import synthetic_run

LIK = "actor/pos_avg_old_log_prob"
REWARD = "critic/score/mean"


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return synthetic_run("grpo", steps=60, seed=3)[[LIK, REWARD, "actor/grad_norm"]]


# --------------------------------------------------------------------------- TensorBoard

def _write_events(folder: Path, table: pd.DataFrame) -> None:
    from torch.utils.tensorboard import SummaryWriter

    folder.mkdir(parents=True, exist_ok=True)
    writer = SummaryWriter(log_dir=str(folder))
    for step, row in table.iterrows():
        for key, value in row.items():
            writer.add_scalar(key, float(value), int(step))
    writer.close()


def test_tensorboard_logdir_merges_a_resumed_run(tmp_path, table):
    logdir = tmp_path / "tb"
    # A run that stopped after step 39 and resumed from its step-30 checkpoint: steps
    # 30-39 are logged twice, the resumed values differ.
    _write_events(logdir / "synthetic-grpo", table.loc[:39])
    resumed = table.loc[30:].copy()
    resumed[LIK] = resumed[LIK] - 1.0
    _write_events(logdir / "synthetic-grpo", resumed)
    _write_events(logdir / "llds" / "synthetic-lambda0.2", table)
    assert len(list((logdir / "synthetic-grpo").glob("events.out.tfevents.*"))) == 2

    parsed = read_source(logdir)
    assert parsed.format == "tensorboard"
    runs = {run.name: run for run in parsed.runs}
    assert sorted(runs) == ["llds/synthetic-lambda0.2", "synthetic-grpo"]
    merged = runs["synthetic-grpo"].table
    assert list(merged.index) == list(table.index)
    np.testing.assert_allclose(merged.loc[:29, LIK], table.loc[:29, LIK], rtol=1e-6)
    np.testing.assert_allclose(merged.loc[30:, LIK], resumed[LIK], rtol=1e-6)  # later wins
    np.testing.assert_allclose(merged[REWARD], table[REWARD], rtol=1e-6)
    assert any("steps 30-39 were logged twice" in n for n in runs["synthetic-grpo"].notes)
    assert runs["llds/synthetic-lambda0.2"].method == "LLDS"


def test_tensorboard_logdir_event_files_at_its_top(tmp_path, table):
    logdir = tmp_path / "synthetic-flat"
    _write_events(logdir, table)
    (run,) = read_source(logdir).runs
    assert run.name == "synthetic-flat"
    assert len(run.table) == 60


def test_folder_without_logs_says_what_folders_are_read(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing here\n")
    with pytest.raises(LogFormatError) as info:
        read_source(tmp_path)
    for kind in ("TensorBoard logdir", "W&B run folder", "MLflow"):
        assert kind in str(info.value)


def test_cli_reads_a_logdir(tmp_path, table, capsys):
    _write_events(tmp_path / "tb" / "synthetic-a", table)
    _write_events(tmp_path / "tb" / "synthetic-b", table)
    code = curves_main([str(tmp_path / "tb"), "--out", str(tmp_path / "r.html")])
    out = capsys.readouterr().out
    assert code == 0
    assert "synthetic-a" in out and "synthetic-b" in out


# --------------------------------------------------------------------------- W&B

def _finish(wandb, run) -> None:
    """End a run and stop W&B's service: only then is a second run's log in one process
    wholly on disk (finish alone can return before it is written)."""
    run.finish()
    wandb.teardown()


def _wandb_offline_run(root: Path, name: str, table: pd.DataFrame, config: dict) -> Path:
    wandb = pytest.importorskip("wandb")
    run = wandb.init(project="synthetic", name=name, mode="offline", dir=str(root),
                     config=config, settings=wandb.Settings(silent=True))
    for step, row in table.iterrows():
        run.log({key: float(value) for key, value in row.items()}, step=int(step))
    _finish(wandb, run)
    folders = [p for p in (root / "wandb").glob("offline-run-*")
               if (p / "files").is_dir() and any(p.glob("*.wandb"))]
    return max(folders, key=lambda p: p.stat().st_mtime_ns)


@pytest.fixture(scope="module")
def wide_table() -> pd.DataFrame:
    """Enough keys and steps that the log spans several 32 KiB blocks, with records cut
    across block boundaries."""
    base = synthetic_run("grpo", steps=150, seed=5)
    extra = {f"synthetic/extra_{i}": base[LIK] * (i + 1) for i in range(20)}
    return pd.concat([base[[LIK, REWARD]], pd.DataFrame(extra)], axis=1)


def test_wandb_offline_run_folder_and_file(tmp_path, wide_table):
    folder = _wandb_offline_run(tmp_path, "synthetic-grpo-seed1", wide_table,
                                {"seed": 1, "trainer": {"lr": 1e-6}})
    log_file = next(folder.glob("run-*.wandb"))
    assert log_file.stat().st_size > 3 * 32 * 1024
    for path in (folder, log_file):
        (run,) = read_source(path).runs
        assert run.name == "synthetic-grpo-seed1"
        assert list(run.table.index) == list(wide_table.index)
        np.testing.assert_array_equal(run.table[LIK], wide_table[LIK])
        np.testing.assert_array_equal(run.table["synthetic/extra_19"],
                                      wide_table["synthetic/extra_19"])
        assert run.params["seed"] == "1" and run.params["trainer.lr"] == "1e-06"
        assert not [c for c in run.table.columns if c.startswith("_")]


def test_wandb_log_uploaded_alone_without_a_name_is_named_by_its_run_id(tmp_path, table):
    wandb = pytest.importorskip("wandb")
    run = wandb.init(project="synthetic", id="synthnoname", mode="offline", dir=str(tmp_path),
                     settings=wandb.Settings(silent=True))
    run.log({REWARD: 0.5}, step=1)
    _finish(wandb, run)
    upload = tmp_path / "upload-5f3a"
    upload.mkdir()
    log_file = next((tmp_path / "wandb").glob("offline-run-*/run-synthnoname.wandb"))
    (upload / log_file.name).write_bytes(log_file.read_bytes())
    (parsed,) = read_source(upload / log_file.name).runs
    assert parsed.name == "synthnoname"


def test_wandb_folder_of_several_runs(tmp_path, table):
    _wandb_offline_run(tmp_path, "synthetic-grpo-seed0", table, {"seed": 0})
    _wandb_offline_run(tmp_path, "synthetic-grpo-seed1", table, {"seed": 1})
    parsed = read_source(tmp_path / "wandb")  # latest-run is a link to one of them
    assert sorted(run.name for run in parsed.runs) == ["synthetic-grpo-seed0",
                                                       "synthetic-grpo-seed1"]


def test_wandb_resumed_run_folders_merge_into_one_run(tmp_path, table):
    wandb = pytest.importorskip("wandb")
    import time

    for attempt, steps in enumerate((table.loc[:40], table.loc[30:])):
        run = wandb.init(project="synthetic", name="synthetic-resumed", id="synthres01",
                         resume="allow", mode="offline", dir=str(tmp_path),
                         settings=wandb.Settings(silent=True))
        for step, row in steps.iterrows():
            run.log({LIK: float(row[LIK]) - attempt, REWARD: float(row[REWARD])},
                    step=int(step))
        _finish(wandb, run)
        time.sleep(1.1)  # run folders are named to the second
    assert len(list((tmp_path / "wandb").glob("offline-run-*-synthres01"))) == 2
    (run,) = read_source(tmp_path / "wandb").runs
    assert run.name == "synthetic-resumed"
    assert list(run.table.index) == list(table.index)
    np.testing.assert_array_equal(run.table.loc[:29, LIK], table.loc[:29, LIK])
    np.testing.assert_array_equal(run.table.loc[30:, LIK], table.loc[30:, LIK] - 1)
    assert any("steps 30-40 were logged twice" in note for note in run.notes)


def test_folders_over_the_size_limit_are_refused_before_reading(tmp_path, table, monkeypatch):
    import curves.mlruns
    import curves.sources

    _write_events(tmp_path / "tb" / "synthetic-a", table)
    _legacy_wandb_folder(tmp_path, table)
    run = tmp_path / "mlruns" / "1" / "0123abcd"
    (run / "metrics").mkdir(parents=True)
    (run / "meta.yaml").write_text("run_id: 0123abcd\n")
    (run / "metrics" / "critic").mkdir()
    (run / "metrics" / "critic" / "score").write_text("1 0.5 1\n" * 200)
    monkeypatch.setattr(curves.sources, "MAX_BYTES", 1000)
    monkeypatch.setattr(curves.mlruns, "MAX_BYTES", 1000)
    for folder in ("tb", "wandb", "mlruns"):
        with pytest.raises(LogFormatError, match="over the"):
            read_source(tmp_path / folder)


def test_wandb_log_cut_short_keeps_what_came_before(tmp_path, wide_table):
    folder = _wandb_offline_run(tmp_path, "synthetic-cut", wide_table, {})
    log_file = next(folder.glob("run-*.wandb"))
    data = log_file.read_bytes()
    cut = tmp_path / "run-cut.wandb"
    cut.write_bytes(data[: len(data) // 2])
    parsed = read_source(cut)
    (run,) = parsed.runs
    assert 30 < len(run.table) < 150
    np.testing.assert_array_equal(run.table[LIK], wide_table.loc[run.table.index, LIK])
    assert any("cut-off" in note for note in parsed.notes)


def test_wandb_log_without_the_sdk_says_to_install_it(tmp_path, wide_table, monkeypatch):
    folder = _wandb_offline_run(tmp_path, "synthetic-nosdk", wide_table.iloc[:5], {})
    for module in ("wandb", "wandb.proto", "wandb.proto.wandb_internal_pb2"):
        monkeypatch.setitem(sys.modules, module, None)  # as if wandb were not installed
    with pytest.raises(LogFormatError, match=r"needs the wandb package \(pip install wandb\)"):
        read_source(next(folder.glob("run-*.wandb")))


def _legacy_wandb_folder(root: Path, table: pd.DataFrame) -> Path:
    """A run folder as W&B's SDK wrote it before its history moved into the .wandb log
    alone: files/wandb-history.jsonl, wandb-summary.json, config.yaml ({desc, value} per
    key), wandb-metadata.json, output.log."""
    folder = root / "wandb" / "run-20250101_120000-abc123xy"
    files = folder / "files"
    files.mkdir(parents=True)
    with open(files / "wandb-history.jsonl", "w") as handle:
        for step, row in table.iterrows():
            record = {key: float(value) for key, value in row.items()}
            record.update(_step=int(step), _runtime=1.5 * step, _timestamp=1.7e9 + step)
            handle.write(json.dumps(record) + "\n")
    last = {**{k: float(v) for k, v in table.iloc[-1].items()}, "_step": int(table.index[-1])}
    (files / "wandb-summary.json").write_text(json.dumps(last))
    (files / "config.yaml").write_text(
        "wandb_version: 1\n\n_wandb:\n  desc: null\n  value:\n    python_version: 3.11.7\n"
        "trainer:\n  desc: null\n  value:\n    experiment_name: synthetic-nq-grpo-lambda0.2\n"
        "    total_epochs: 15\nseed:\n  desc: null\n  value: 7\n")
    (files / "wandb-metadata.json").write_text(json.dumps({"program": "main_ppo.py"}))
    (files / "output.log").write_text("".join(
        f"step:{step} - {REWARD}:{row[REWARD]:.3f}\n" for step, row in table.iterrows()))
    return folder


def test_wandb_folder_with_history_file(tmp_path, table):
    folder = _legacy_wandb_folder(tmp_path, table)
    parsed = read_source(folder)
    (run,) = parsed.runs
    assert run.name == "synthetic-nq-grpo-lambda0.2" and run.method == "LLDS"
    np.testing.assert_array_equal(run.table[LIK], table[LIK])
    assert set(run.table.columns) == set(table.columns)
    assert run.params["seed"] == "7" and "python_version" not in str(run.params)
    assert not run.rounded
    # A file of the folder on its own is named by the run, not "output".
    for path in (folder / "files" / "output.log", folder / "files" / "wandb-history.jsonl"):
        (alone,) = read_source(path).runs
        assert alone.name == "synthetic-nq-grpo-lambda0.2"


def test_wandb_folder_summary_says_history_was_cut(tmp_path, table):
    folder = _legacy_wandb_folder(tmp_path, table)
    history = folder / "files" / "wandb-history.jsonl"
    history.write_text("".join(history.read_text().splitlines(keepends=True)[:40]))
    parsed = read_source(folder)
    assert any("history stops at step 40" in note and "60" in note for note in parsed.notes)


def test_wandb_folder_summary_only(tmp_path, table):
    folder = _legacy_wandb_folder(tmp_path, table)
    (folder / "files" / "wandb-history.jsonl").unlink()
    (folder / "files" / "output.log").unlink()
    (run,) = read_source(folder).runs
    assert list(run.table.index) == [60]
    assert run.table.loc[60, LIK] == pytest.approx(table.loc[60, LIK])


# --------------------------------------------------------------------------- MLflow

def _mlflow_store(root: Path, runs: list[tuple[str, str, pd.DataFrame, dict]]) -> Path:
    mlflow = pytest.importorskip("mlflow")
    store = root / "mlruns"
    client = mlflow.MlflowClient(tracking_uri=store.as_uri())
    experiments: dict[str, str] = {}
    for experiment, name, frame, params in runs:
        if experiment not in experiments:
            experiments[experiment] = client.create_experiment(experiment)
        run = client.create_run(experiments[experiment], run_name=name)
        for key, value in params.items():
            client.log_param(run.info.run_id, key, value)
        for step, row in frame.iterrows():
            for key, value in row.items():
                client.log_metric(run.info.run_id, key, float(value), step=int(step))
        client.set_terminated(run.info.run_id)
    return store


@pytest.fixture
def mlflow_file_store(monkeypatch):
    # MLflow 3 keeps its file store behind this switch (it prefers a database).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


def test_mlflow_store_experiment_and_run_folders(tmp_path, table, mlflow_file_store):
    small = table.iloc[:12]
    twice = small.iloc[-3:].copy()
    twice[LIK] = 5.0  # the same steps logged again: the later values win
    store = _mlflow_store(tmp_path, [
        ("synthetic-llds", "synthetic-grpo-seed0", small, {"seed": 0, "lr": 1e-6}),
        ("synthetic-llds", "synthetic-grpo-seed1", pd.concat([small, twice]), {"seed": 1}),
        ("synthetic-other", "synthetic-lambda0.2", small, {}),
    ])
    parsed = read_source(store)
    assert parsed.format == "mlflow"
    runs = {run.name: run for run in parsed.runs}
    assert sorted(runs) == ["synthetic-grpo-seed0", "synthetic-grpo-seed1",
                            "synthetic-lambda0.2"]
    first = runs["synthetic-grpo-seed0"]
    assert list(first.table.index) == list(small.index)
    np.testing.assert_array_equal(first.table[LIK], small[LIK])  # "critic/score/mean" nests
    np.testing.assert_array_equal(first.table[REWARD], small[REWARD])
    assert first.params == {"seed": "0", "lr": "1e-06"}
    np.testing.assert_array_equal(runs["synthetic-grpo-seed1"].table[LIK].iloc[-3:], 5.0)
    assert runs["synthetic-lambda0.2"].method == "LLDS"

    experiment = Path(first.source).parent
    assert sorted(r.name for r in read_source(experiment).runs) == [
        "synthetic-grpo-seed0", "synthetic-grpo-seed1"]
    (alone,) = read_source(first.source).runs
    assert alone.name == "synthetic-grpo-seed0"


def test_mlflow_run_folder_without_mlflow(tmp_path, table):
    """The plain file layout, written by hand: reading it needs no mlflow."""
    run = tmp_path / "mlruns" / "1" / "0123abcd"
    (run / "metrics" / "critic" / "score").mkdir(parents=True)
    (run / "tags").mkdir()
    (run / "meta.yaml").write_text("run_id: 0123abcd\nrun_name: from-meta\nexperiment_id: '1'\n")
    (run / "tags" / "mlflow.runName").write_text("synthetic-from-tag")
    lines = [f"{1700000000000 + s} {v!r} {s}\n" for s, v in table[REWARD].items()]
    (run / "metrics" / "critic" / "score" / "mean").write_text(
        "".join(lines) + "garbage line\n")
    (parsed_run,) = read_source(run).runs
    assert parsed_run.name == "synthetic-from-tag"
    np.testing.assert_array_equal(parsed_run.table[REWARD], table[REWARD])
    assert any("1 metric line" in note for note in parsed_run.notes)


def test_analyze_uploads_takes_folders(tmp_path, table, mlflow_file_store):
    store = _mlflow_store(tmp_path, [("synthetic", "synthetic-grpo", table, {})])
    result = analyze_uploads([str(store)], smoothing=0)
    assert not result.errors
    assert [run.name for run in result.runs] == ["synthetic-grpo"]
    assert "likelihood" in result.figures
