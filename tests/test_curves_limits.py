"""Curves under big or odd input and plain GRPO logs, on SYNTHETIC
logs: bounded traces, a long first JSON line, the parquet guard, the stand-in phases."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from curves import analyze_uploads
from curves.analysis import analyse_run, bin_means
from curves.downsample import MAX_POINTS, extreme_indices
from curves.parse import MAX_PARQUET_BYTES, LogFormatError, read_log
from curves.report import render_report
from curves.runs import make_run
from curves.synthetic import (
    SyntheticPhases,
    stretched_run,
    synthetic_run,
    write_console,
    write_large_console,
)

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- downsampling


def test_extreme_indices_keep_every_bucket_extreme_and_the_ends():
    rng = np.random.default_rng(0)
    values = rng.normal(size=100_003)
    values[[5, 77_777]] = [50.0, -50.0]
    kept = extreme_indices(values, 1000)
    assert len(kept) <= 1000 and kept[0] == 0 and kept[-1] == len(values) - 1
    assert np.all(np.diff(kept) > 0)  # sorted, no repeats
    assert {5, 77_777} <= set(kept.tolist())
    assert values[kept].max() == values.max() and values[kept].min() == values.min()
    assert list(extreme_indices(values[:10], 1000)) == list(range(10))


def test_plotted_traces_are_bounded_and_hover_shows_logged_values():
    steps = 60_000
    table = pd.DataFrame({"critic/score/mean": np.sin(np.arange(steps) / 500.0),
                          "actor/grad_norm": np.full(steps, 0.3)},
                         index=pd.Index(np.arange(1, steps + 1), name="step"))
    table.iloc[12_345, 1] = 40.0  # one spike among 60k points
    result = analyze_uploads_from_table(table)
    for panel in result.panels:
        for trace in panel.figure.data:
            assert len(trace.x) <= MAX_POINTS
    reward = next(p for p in result.panels if p.id == "reward").figure.data
    smoothed = next(t for t in reward if t.customdata is not None)
    raw = table["critic/score/mean"]
    # every hovered raw value is the logged value at that step
    assert np.array_equal(np.asarray(smoothed.customdata), raw.loc[smoothed.x].to_numpy())
    grad = next(p for p in result.panels if p.id == "grad_norm").figure.data
    assert any(40.0 in np.asarray(t.y) for t in grad if t.y is not None)  # the spike stays


def analyze_uploads_from_table(table: pd.DataFrame):
    from curves.analysis import analyse_run as analyse
    from curves.plots import build_panels

    run = make_run("synthetic-long", table, "synthetic", "csv")
    analysis = analyse(run)
    return type("Result", (), {"panels": build_panels([run], [analysis])})()


def test_report_of_a_large_console_log_stays_a_few_mb(tmp_path):
    """The figures are downsampled, so the page stays under 1 MB whatever the log size
    (drawing every logged point would grow it with the log)."""
    path = tmp_path / "synthetic-large.log"
    steps, size = write_large_console(path, 12 * 2**20)
    result = analyze_uploads([str(path)])
    assert not result.errors and result.runs[0].table.shape[0] == steps
    html = render_report(result)
    from plotly.offline import get_plotlyjs

    figures = len(html) - len(get_plotlyjs())
    assert figures < 2**20, f"{figures / 2**20:.1f} MB of figures, {size / 2**20:.0f} MB log"
    payload = sum(len(panel.figure.to_json()) for panel in result.panels)
    assert payload < 2**20


def test_long_runs_are_analysed_on_bounded_bin_means():
    values = pd.Series(np.arange(10_001, dtype=float), index=np.arange(10_001))
    means = bin_means(values, 2000)
    # bins of 6 points (ceil(10,001 / 2,000)), each at its first step
    assert len(means) == 1667 and means.index[1] == 6 and means.iloc[0] == 2.5
    table = stretched_run(40_000)  # the 200-step run stretched: decay from step 12,000
    a = analyse_run(make_run("synthetic-40k", table, "synthetic", "csv"))
    # the 200-step tests' tolerance (12 steps), stretched 200 times
    assert a.decay_onset is not None and abs(a.decay_onset - 12_000) <= 12 * 200
    assert any("bin means of 20 steps" in note for note in a.notes)


# --------------------------------------------------------------------------- formats


def test_json_lines_with_a_first_line_over_64_kb(tmp_path):
    """Detection reads a first line longer than its 64 KB head whole."""
    path = tmp_path / "wide.jsonl"
    with path.open("w") as out:
        for step in range(1, 41):
            record = {"step": step, "critic/score/mean": step / 40}
            record.update({f"timing/filler_{i:05d}": 0.5 for i in range(3000)})
            out.write(json.dumps(record) + "\n")
    assert len(path.read_text().splitlines()[0]) > 64 * 1024
    parsed = read_log(path)
    assert parsed.format == "jsonl" and parsed.runs[0].table.shape == (40, 3001)


def test_a_parquet_that_expands_past_the_limit_is_refused_before_reading(tmp_path):
    """A parquet of a few hundred KB whose zeros decode to ~100 MB is refused from its
    metadata, before any column is read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bomb-history.parquet"
    schema = pa.schema([("_step", pa.int64()), ("critic/score/mean", pa.float64()),
                        ("notes", pa.string())])
    chunk = 1_000_000
    zeros = pa.array(np.zeros(chunk, dtype="int64"))
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for _ in range(MAX_PARQUET_BYTES // 8 // chunk // 2 + 1):
            writer.write_table(pa.table([zeros, zeros.cast(pa.float64()),
                                         pa.nulls(chunk, pa.string())], schema=schema))
    assert path.stat().st_size < 2**20
    with pytest.raises(LogFormatError, match=r"expands to 6,000,000 rows x 2 numeric columns"):
        read_log(path)
    # A history within the limit reads its step and numeric columns only.
    small = tmp_path / "small-history.parquet"
    frame = synthetic_run("grpo", steps=50).reset_index().rename(columns={"step": "_step"})
    frame["label"] = "text"
    frame.to_parquet(small)
    run = read_log(small).runs[0]
    assert "label" not in run.table.columns and len(run.table) == 50


# --------------------------------------------------------------------------- plain GRPO


def test_phases_of_a_plain_grpo_log_come_from_the_stand_in_series():
    """A log without actor/pos_avg_old_log_prob (Search-R1's own) still gets its phases."""
    table = synthetic_run("plain-grpo", seed=0)
    assert not any("avg_" in key for key in table.columns)
    a = analyse_run(make_run("synthetic-search-r1", table, "synthetic", "csv"))
    truth = SyntheticPhases()
    assert a.likelihood_key is None
    assert a.decay_onset is not None and abs(a.decay_onset - truth.decay_at) <= 12
    assert a.accel_onset is not None and abs(a.accel_onset - truth.accel_at) <= 8
    assert a.phase_series["II"].startswith("actor/entropy_loss (rising")
    assert any("phases read from actor/entropy_loss" in note for note in a.notes)
    # No entropy either: phase III from the gradient norm, before the reward collapse.
    bare = table.drop(columns=["actor/entropy_loss", "response_length/mean"])
    b = analyse_run(make_run("synthetic-bare", bare, "synthetic", "csv"))
    assert b.decay_onset is None and b.reward_collapse_step is not None
    assert b.accel_onset is not None and b.accel_onset <= b.reward_collapse_step
    assert b.phase_series == {"III": "actor/grad_norm (last spike before the reward collapse)"}
    assert [label for label, _, _ in b.phases()] == ["III"]


def test_the_report_and_the_cli_say_where_each_phase_came_from(tmp_path):
    path = write_console(tmp_path / "synthetic-search-r1.log",
                         [("synthetic-search-r1", synthetic_run("plain-grpo", seed=1))])
    result = analyze_uploads([str(path)])
    row = result.summary.iloc[0]
    assert "II: actor/entropy_loss (rising" in row["phases from"]
    html = render_report(result)
    assert "II: actor/entropy_loss (rising" in html and "phases II/III come from" in html
    labels = [a.text for p in result.panels if p.id == "entropy"
              for a in p.figure.layout.annotations]
    assert any("(from actor/entropy_loss)" in text for text in labels)
    done = subprocess.run([sys.executable, "-m", "curves", str(path), "--out",
                           str(tmp_path / "r.html")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "phase II from actor/entropy_loss" in done.stdout
    assert "phases II/III come from a rising entropy" in done.stdout


def test_a_dictionary_encoded_parquet_is_refused_before_it_is_decoded(tmp_path):
    """One long string stored once in a dictionary and referenced by every row: a few KB on
    disk, hundreds of MB once each row is materialised."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 2048
    repeated = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()),
                                              pa.array(["7" * 65536]))
    path = tmp_path / "bomb-history.parquet"
    pq.write_table(pa.table({"_step": repeated, "critic/score/mean": [0.5] * rows}), path,
                   compression="zstd")
    assert path.stat().st_size < 64 * 1024
    with pytest.raises(LogFormatError, match=r"step column '_step' holds string values"):
        read_log(path)
    # A numeric step beside a dictionary-encoded text column: the text is never read.
    beside = tmp_path / "text-beside-history.parquet"
    pq.write_table(pa.table({"_step": list(range(rows)), "notes": repeated,
                             "critic/score/mean": [0.5] * rows}), beside, compression="zstd")
    run = read_log(beside).runs[0]
    assert len(run.table) == rows and "notes" not in run.table.columns


def test_the_decoded_size_of_a_parquet_is_bounded_by_its_column_widths(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from curves import parse

    path = tmp_path / "wide-history.parquet"
    rows = 1000
    pq.write_table(pa.table({"_step": pa.array(range(rows), pa.int64()),
                             "critic/score/mean": pa.array([0.5] * rows, pa.float32())}), path)
    monkeypatch.setattr(parse, "MAX_PARQUET_BYTES", 11_999)
    with pytest.raises(LogFormatError, match=r"12,000 bytes in memory.*limit of 11,999 bytes"):
        read_log(path)
    monkeypatch.setattr(parse, "MAX_PARQUET_BYTES", 12_000)
    assert len(read_log(path).runs[0].table) == rows


@pytest.mark.parametrize("suffix", ["jsonl", "csv", "log", "parquet"])
def test_a_step_past_int64_skips_that_row_with_a_note(tmp_path, suffix):
    huge = 2**63
    steps, scores = [1, 2, huge, 3], [0.1, 0.2, 0.3, 0.4]
    path = tmp_path / f"big.{suffix}"
    if suffix == "jsonl":
        path.write_text("".join(json.dumps({"step": s, "critic/score/mean": v}) + "\n"
                                for s, v in zip(steps, scores, strict=True)))
    elif suffix == "csv":
        path.write_text("step,critic/score/mean\n"
                        + "".join(f"{s},{v}\n" for s, v in zip(steps, scores, strict=True)))
    elif suffix == "log":
        path.write_text("".join(f"step:{s} - critic/score/mean:{v}\n"
                                for s, v in zip(steps, scores, strict=True)))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"_step": pa.array(steps, pa.uint64()),
                                 "critic/score/mean": scores}), path)
    parsed = read_log(path)
    table = parsed.runs[0].table
    assert list(table.index) == [1, 2, 3]
    assert list(table["critic/score/mean"]) == [0.1, 0.2, 0.4]
    assert any("1 row(s) had a step outside the 64-bit range" in n for n in parsed.notes)
