"""Curves under logs that decode to far more than their size, on SYNTHETIC logs: a new key
on every row, too many values or keys, runs that restart thousands of times, overlong
lines, .wandb files of tiny pieces, FIFOs, huge or symlinked side files.

Peak memory is measured in a child process (`python -m curves`) with its address space
capped, so code that would allocate gigabytes fails fast instead of taking the machine."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from curves import analyze_uploads
from curves.parse import LogFormatError, read_log
from curves.sources import read_source

ROOT = Path(__file__).resolve().parents[1]
REWARD = "critic/score/mean"
GRAD = "actor/grad_norm"
PEAK_LIMIT_MB = 500

# The child's own peak RSS (VmHWM) after `python -m curves`; the address space is capped
# at 2 GiB so a dense steps x keys table (3.6 GB for 15,000 x 15,001) fails at once.
_CLI = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))
from curves.__main__ import main
rc = main(sys.argv[1:])
peak = next(int(line.split()[1]) / 1024 for line in open("/proc/self/status")
            if line.startswith("VmHWM:"))
print(json.dumps({"rc": rc, "peak_mb": peak}))
"""


def _cli(tmp_path: Path, *paths: Path, timeout: float = 60) -> tuple[dict, str, str]:
    done = subprocess.run([sys.executable, "-c", _CLI, *map(str, paths), "--out",
                           str(tmp_path / "report.html")], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=False)
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-2000:]
    return json.loads(lines[-1]), done.stdout, done.stderr


# --------------------------------------------------------------------------- writers

def _write_events(path: Path, events: list[tuple[int, list[tuple[str, float]]]]) -> Path:
    """A TensorBoard event file written record by record (no torch needed)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        def record(event) -> None:
            data = event.SerializeToString()
            head = struct.pack("<Q", len(data))
            handle.write(head + struct.pack("<I", masked_crc32c(head)) + data
                         + struct.pack("<I", masked_crc32c(data)))

        record(event_pb2.Event(wall_time=1.0, file_version="brain.Event:2"))
        for step, values in events:
            summary = summary_pb2.Summary(value=[
                summary_pb2.Summary.Value(tag=tag, simple_value=value) for tag, value in values])
            record(event_pb2.Event(wall_time=1.0, step=step, summary=summary))
    return path


def _mlflow_run(root: Path, metrics: dict[str, list[tuple[int, float]]],
                name: str = "synthetic-from-meta") -> Path:
    run = root / "mlruns" / "1" / "0123abcd"
    run.mkdir(parents=True)
    (run / "meta.yaml").write_text(f"run_id: 0123abcd\nrun_name: {name}\nexperiment_id: '1'\n")
    for key, points in metrics.items():
        path = run / "metrics" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"1700000000000 {value!r} {step}\n" for step, value in points))
    (run / "params").mkdir()
    (run / "tags").mkdir()
    return run


_BLOCK = 32 * 1024
_WANDB_HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)


def _wandb_file(path: Path, records: list[bytes], piece: int | None = None) -> Path:
    """A .wandb transaction log; with `piece`, every record is cut into pieces of that
    many bytes (first, middles, last), as no writer would but the format allows."""
    out = bytearray(_WANDB_HEADER)

    def write(kind: int, payload: bytes) -> None:
        if _BLOCK - len(out) % _BLOCK < 7 + len(payload):
            out.extend(b"\0" * (_BLOCK - len(out) % _BLOCK))
        crc = zlib.crc32(payload, zlib.crc32(bytes([kind])))
        out.extend(struct.pack("<IHB", crc, len(payload), kind) + payload)

    for record in records:
        if piece is None or len(record) <= piece:
            write(1, record)
            continue
        parts = [record[i:i + piece] for i in range(0, len(record), piece)]
        write(2, parts[0])
        for part in parts[1:-1]:
            write(3, part)
        write(4, parts[-1])
    path.write_bytes(bytes(out))
    return path


def _history_record(step: int, values: dict[str, float]) -> bytes:
    pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")
    items = [pb.HistoryItem(key="_step", value_json=str(step))]
    items += [pb.HistoryItem(key=key, value_json=json.dumps(value))
              for key, value in values.items()]
    return pb.Record(history=pb.HistoryRecord(item=items)).SerializeToString()


# --------------------------------------------------------------------------- a new key per row

N_SPARSE = 15_000


def _sparse_jsonl(folder: Path) -> Path:
    path = folder / "synthetic-sparse.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(N_SPARSE):
            handle.write(json.dumps({"step": i, REWARD: 0.5, f"k{i}": 1.0}) + "\n")
    return path


def _sparse_events(folder: Path) -> Path:
    return _write_events(folder / "synthetic-sparse" / "events.out.tfevents.1700000000.h.1.0",
                         [(i, [(REWARD, 0.5), (f"k{i}", 1.0)]) for i in range(N_SPARSE)])


def _sparse_mlflow(folder: Path) -> Path:
    metrics = {REWARD: [(i, 0.5) for i in range(N_SPARSE)]}
    metrics.update({f"k{i}": [(i, 1.0)] for i in range(N_SPARSE)})
    return _mlflow_run(folder, metrics).parents[1]


@pytest.mark.parametrize("write", [_sparse_jsonl, _sparse_events, _sparse_mlflow],
                         ids=["jsonl", "tensorboard", "mlflow"])
def test_a_new_key_on_every_row_stays_small(tmp_path, write):
    """15,000 rows, each with the reward and a key of its own (under 1 MB as JSON lines):
    every step x every key would be 15,000 x 15,001 float64 (1.8 GB, 3.6 GB at peak);
    the table keeps the reward and what fits the budget, and says so."""
    out, stdout, stderr = _cli(tmp_path, write(tmp_path))
    assert out["rc"] == 0, stderr
    assert out["peak_mb"] < PEAK_LIMIT_MB, out
    assert "keys were left out" in stderr and "over the limit of 10,485,760" in stderr
    assert "15000" in stdout  # the summary's step count: no step lost


def test_table_budget_keeps_recognised_then_most_logged_keys(tmp_path, monkeypatch):
    monkeypatch.setattr("curves.cells.MAX_TABLE_CELLS", 3000)
    path = tmp_path / "synthetic.jsonl"
    rows = []
    for i in range(300):
        row = {"step": i, REWARD: i / 300, "x/dense": float(i), f"k{i}": 1.0}
        if i % 2 == 0:
            row[GRAD] = 1.0 + i
        rows.append(json.dumps(row))
    path.write_text("\n".join(rows) + "\n")
    parsed = read_log(path)
    (run,) = parsed.runs
    assert run.table.shape == (300, 10)  # 3000 cells / 300 steps
    assert list(run.table.columns[:3]) == [REWARD, "x/dense", "k0"]  # first-appearance order
    assert GRAD in run.table.columns and "k6" in run.table.columns and "k7" not in run.table
    np.testing.assert_array_equal(run.table[REWARD], np.arange(300) / 300)
    np.testing.assert_array_equal(run.table[GRAD].dropna(), 1.0 + np.arange(0, 300, 2))
    (note,) = [n for n in parsed.notes if "left out" in n]
    assert "293 of 303 keys were left out" in note and "k7" in note


# --------------------------------------------------------------------------- the cell builder

def _reference(rows: list[tuple[int, dict[str, float]]], nan_wins: bool) -> pd.DataFrame:
    """What the readers built before cells: a dict of rows, later values winning (NaN too
    with `nan_wins`), in pandas."""
    table: dict[int, dict[str, float]] = {}
    for step, values in rows:
        row = table.setdefault(step, {})
        for key, value in values.items():
            if nan_wins or not np.isnan(value) or key not in row:
                row[key] = value
    return pd.DataFrame.from_dict(table, orient="index").sort_index()


@pytest.mark.parametrize("nan_wins", [False, True])
def test_cells_table_matches_a_dict_of_rows(monkeypatch, nan_wins):
    """Random rows with steps going back and forth, repeated keys, NaNs and empty rows,
    filled in chunks smaller than a row: the same table as a dict of rows."""
    from curves import cells

    monkeypatch.setattr(cells, "_CHUNK", 7)
    rng = np.random.default_rng(0)
    keys = [f"key/{i}" for i in range(12)]
    store = cells.Cells()
    rows = []
    for _ in range(400):
        step = int(rng.integers(0, 60))
        chosen = [str(k) for k in rng.choice(keys, size=int(rng.integers(0, 6)),
                                             replace=False)]
        values = [float("nan") if rng.random() < 0.2 else float(rng.normal()) for _ in chosen]
        store.add(step, tuple(chosen), values)
        rows.append((step, dict(zip(chosen, values, strict=True))))
    table, notes = store.table(nan_wins=nan_wins)
    expected = _reference(rows, nan_wins)
    assert not notes
    assert list(table.index) == list(expected.index)
    pd.testing.assert_frame_equal(table[sorted(table.columns)],
                                  expected[sorted(expected.columns)], check_names=False)


# --------------------------------------------------------------------------- refusals

def test_too_many_values_are_refused_with_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr("curves.cells.MAX_CELLS", 1000)
    path = tmp_path / "synthetic.log"
    path.write_text("".join(f"step:{s} - " + " - ".join(f"{REWARD if k == 0 else f'x/{k}'}:0.5"
                                                     for k in range(10)) + "\n"
                            for s in range(1, 201)))
    with pytest.raises(LogFormatError, match="more than 1,000 logged values.*keep fewer"):
        read_log(path)
    result = analyze_uploads([str(path)])
    assert [m.source for m in result.errors] == ["synthetic.log"]


def test_too_many_distinct_keys_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("curves.cells.MAX_KEYS", 50)
    path = tmp_path / "synthetic.jsonl"
    path.write_text("".join(json.dumps({"step": i, REWARD: 0.5, f"k{i}": 1.0}) + "\n"
                            for i in range(100)))
    with pytest.raises(LogFormatError, match="more than 50 distinct metric keys"):
        read_log(path)


def test_csv_over_the_cell_budget_is_refused_before_pandas_reads_it(tmp_path, monkeypatch):
    """A CSV's empty cells cost a byte on disk and 8 in the table: rows x header columns
    is checked first."""
    monkeypatch.setattr("curves.parse.MAX_TABLE_CELLS", 1000)
    header = "step," + REWARD + "," + ",".join(f"k{i}" for i in range(18))
    path = tmp_path / "synthetic.csv"
    path.write_text(header + "\n" + "".join(f"{i},0.5" + "," * 18 + "\n" for i in range(60)))
    with pytest.raises(LogFormatError, match=r"60 rows x 20 columns \(1,200 cells\)"):
        read_log(path)
    path.write_text(header + "\n" + "".join(f"{i},0.5" + "," * 18 + "\n" for i in range(40)))
    assert read_log(path).runs[0].table.shape == (40, 1)


def test_a_step_count_restarting_thousands_of_times_is_refused(tmp_path):
    """1,0,1,0,...: every line a new run (20,001 runs from 1.2 MB, 30 s to read before)."""
    path = tmp_path / "synthetic.log"
    path.write_text("".join(f"step:{1 - i % 2} - {REWARD}:0.5\n" for i in range(4100)))
    with pytest.raises(LogFormatError, match="goes back more than 2,000 times"):
        read_log(path)


def test_overlong_lines_are_skipped_unread(tmp_path, monkeypatch):
    monkeypatch.setattr("curves.parse.MAX_LINE_CHARS", 1000)
    # Longer than the 64 KB head read to detect the format, so the first line is read apart.
    long_row = json.dumps({"step": 2, REWARD: 9.0, **{f"k{i}": 1 for i in range(8000)}})
    path = tmp_path / "synthetic.jsonl"
    path.write_text("".join(json.dumps({"step": s, REWARD: 0.5}) + "\n" for s in range(2))
                    + long_row + "\n" + json.dumps({"step": 3, REWARD: 0.5}) + "\n")
    parsed = read_log(path)
    assert list(parsed.runs[0].table.index) == [0, 1, 3]
    assert any("1 line(s) over 1,000 characters were skipped" in n for n in parsed.notes)
    path.write_text(long_row + "\n")
    with pytest.raises(LogFormatError, match="the first line is over 1,000 bytes"):
        read_log(path)


def test_tensorboard_logdir_merge_stays_within_the_budget(tmp_path, monkeypatch):
    """Two event files of one run that fit apart but not merged (other steps, other keys)."""
    monkeypatch.setattr("curves.cells.MAX_TABLE_CELLS", 500)
    run = tmp_path / "logs" / "synthetic-run"
    _write_events(run / "events.out.tfevents.1700000000.h.1.0",
                  [(s, [(REWARD, 0.5)] + [(f"a{k}", 1.0) for k in range(4)]) for s in range(50)])
    _write_events(run / "events.out.tfevents.1700000100.h.1.0",
                  [(s, [(REWARD, 0.7)] + [(f"b{k}", 1.0) for k in range(4)])
                   for s in range(50, 100)])
    parsed = read_source(tmp_path / "logs")
    (merged,) = parsed.runs
    assert merged.table.shape == (100, 5)
    np.testing.assert_allclose(merged.table[REWARD], [0.5] * 50 + [0.7] * 50)
    assert any("4 of 9 keys were left out" in note for note in parsed.notes)


# --------------------------------------------------------------------------- .wandb

def _read_seconds(path: Path, repeats: int) -> float:
    from curves.wandb_log import read_wandb_log

    # CPU seconds, the best of a few: other work on a busy machine stretches wall time.
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        read_wandb_log(path)
        best = min(best, time.process_time() - start)
    return best


def test_wandb_log_of_tiny_pieces_reads_in_linear_time(tmp_path):
    """One record cut into 1-byte pieces with valid CRCs: 10 times the bytes must cost
    about 10 times the time, not 100 (joining with `bytes +=` copied the record so far at
    every piece: 20 MB took over a minute)."""
    pytest.importorskip("wandb.proto.wandb_internal_pb2")
    small = _wandb_file(tmp_path / "small.wandb", [b"x" * 100_000], piece=1)
    large = _wandb_file(tmp_path / "large.wandb", [b"x" * 1_000_000], piece=1)
    assert large.stat().st_size > 7.5 * 2**20
    ratio = _read_seconds(large, 2) / _read_seconds(small, 5)
    assert ratio < 25, ratio


def test_wandb_record_in_pieces_and_oversized_records(tmp_path, monkeypatch):
    from curves import wandb_log

    records = [_history_record(s, {REWARD: s / 10, f"k{s}": 1.0}) for s in range(5)]
    log = wandb_log.read_wandb_log(_wandb_file(tmp_path / "pieces.wandb", records, piece=3))
    assert list(log.history.index) == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(log.history[REWARD], np.arange(5) / 10)
    assert not log.notes
    big = _history_record(9, {REWARD: 0.9, **{f"blob/{i}": 1.0 for i in range(50)}})
    monkeypatch.setattr(wandb_log, "MAX_RECORD_BYTES", len(big) - 1)
    log = wandb_log.read_wandb_log(_wandb_file(tmp_path / "big.wandb", [*records, big],
                                               piece=8))
    assert 9 not in log.history.index and len(log.history) == 5
    assert any("1 record(s) over" in note for note in log.notes)


# --------------------------------------------------------------------------- FIFOs

def test_fifo_named_like_an_event_file_is_skipped(tmp_path):
    run = tmp_path / "logs" / "synthetic-run"
    _write_events(run / "events.out.tfevents.1700000000.h.1.0",
                  [(s, [(REWARD, 0.5)]) for s in range(40)])
    os.mkfifo(run / "events.out.tfevents.1700000100.h.1.0")
    out, stdout, stderr = _cli(tmp_path, tmp_path / "logs", timeout=30)
    assert out["rc"] == 0, stderr
    assert "events.out.tfevents.1700000100.h.1.0 is not a regular file" in stderr
    assert "synthetic-run" in stdout


def test_fifo_wandb_log_in_a_run_folder_is_not_opened(tmp_path):
    folder = tmp_path / "wandb" / "offline-run-20240101_000000-abc123"
    (folder / "files").mkdir(parents=True)
    (folder / "files" / "output.log").write_text(
        "".join(f"step:{s} - {REWARD}:0.5\n" for s in range(1, 41)))
    os.mkfifo(folder / "run-abc123.wandb")
    out, stdout, stderr = _cli(tmp_path, folder, timeout=30)
    assert out["rc"] == 0, stderr
    assert "offline-run-20240101_000000-abc123" in stdout


def test_fifo_passed_as_a_file_is_refused(tmp_path):
    fifo = tmp_path / "events.out.tfevents.1700000000.h.1.0"
    os.mkfifo(fifo)
    with pytest.raises(LogFormatError, match="not a regular file"):
        read_source(fifo)


# --------------------------------------------------------------------------- side files

def test_huge_side_files_are_not_read(tmp_path):
    """A 1 GB config.yaml in a W&B run folder and a 3 GB MLflow param (sparse files: no
    disk used) are refused after reading 1 MB, with a note; the runs are still read."""
    folder = tmp_path / "wandb" / "run-20240101_000000-abc123"
    (folder / "files").mkdir(parents=True)
    (folder / "files" / "wandb-history.jsonl").write_text(
        "".join(json.dumps({"_step": s, REWARD: 0.5}) + "\n" for s in range(40)))
    with open(folder / "files" / "config.yaml", "wb") as handle:
        handle.write(b"trainer:\n  value:\n    experiment_name: synthetic-config\n")
        handle.truncate(2**30)
    run = _mlflow_run(tmp_path, {REWARD: [(s, 0.5) for s in range(40)]})
    with open(run / "params" / "huge", "wb") as handle:
        handle.truncate(3 * 2**30)
    (run / "params" / "lr").write_text("1e-6")
    out, stdout, stderr = _cli(tmp_path, folder, run, timeout=60)
    assert out["rc"] == 0, stderr
    assert out["peak_mb"] < PEAK_LIMIT_MB, out
    assert "files/config.yaml is over 1,048,576 bytes and was not read" in stderr
    assert "params/huge is over 1,048,576 bytes and was not read" in stderr
    assert "run-20240101_000000-abc123" in stdout and "synthetic-from-meta" in stdout
    assert read_source(run).runs[0].params == {"lr": "1e-6"}


def test_symlinked_side_files_are_not_followed(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not-a-run-name\n")
    run = _mlflow_run(tmp_path, {REWARD: [(s, 0.5) for s in range(40)]})
    (run / "tags" / "mlflow.runName").symlink_to(secret)
    (run / "params" / "seed").symlink_to(secret)
    parsed = read_source(run)
    (found,) = parsed.runs
    assert found.name == "synthetic-from-meta" and found.params == {}
    assert any("tags/mlflow.runName is a symbolic link" in note for note in parsed.notes)

    folder = tmp_path / "wandb" / "run-20240101_000000-abc123"
    (folder / "files").mkdir(parents=True)
    (folder / "files" / "wandb-history.jsonl").write_text(
        "".join(json.dumps({"_step": s, REWARD: 0.5}) + "\n" for s in range(40)))
    config = tmp_path / "elsewhere.yaml"
    config.write_text("trainer:\n  value:\n    experiment_name: not-a-run-name\n")
    (folder / "files" / "config.yaml").symlink_to(config)
    parsed = read_source(folder)
    assert parsed.runs[0].name == "run-20240101_000000-abc123"
    assert any("files/config.yaml is a symbolic link" in note for note in parsed.notes)
