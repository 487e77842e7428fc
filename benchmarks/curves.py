"""Benchmark the curves module on SYNTHETIC data (nothing here is a real training run).

1. Parsing a generated 200k-line verl console log (20k step lines of 60 metrics each, the
   rest start-up/noise lines with ANSI codes, worker prefixes, tqdm bars and tracebacks):
   lines/s for `read_log` vs a naive `readlines()` + regex + float loop + `pd.DataFrame`.
   Target: under 2 s for the 200k lines.
2. Building the figures for 2 runs x 1,000 steps x 60 metrics (phase analysis included) vs
   a naive `plotly.express.line` per metric on a long table.
3. Sparse keys: JSON lines where every row brings a key of its own (5,000 rows, 0.27 MB):
   peak RSS and seconds of `read_log`, which keeps logged values as cells and the table
   within its budget, vs the naive dense table (`pd.DataFrame.from_dict` of the rows),
   each in a fresh process; then `read_log` alone on 15,000 such rows (0.83 MB), whose
   dense table would be 15,000 x 15,001 float64 (1.8 GB).
4. Memory (`--memory`): a generated ~190 MB verl console log (`--log-mb`) through
   `analyze_uploads` and the HTML report, each in a fresh process: peak RSS, report size and
   the figures' JSON (what the UI sends the browser), with every trace bounded to
   MAX_POINTS vs every point drawn. Then a 0.24 MB parquet that expands to
   448 MB: peak RSS of the guarded reader vs `pandas.read_parquet`.

Run: python -m benchmarks.curves [--memory] [--log-mb 190]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from curves.analysis import analyse_run
from curves.parse import read_log
from curves.plots import build_panels
from curves.runs import make_run
from curves.synthetic import synthetic_run

TOTAL_LINES = 200_000
STEP_EVERY = 10  # one step line per 10 lines: 20k step lines
N_METRICS = 60
TARGET_S = 2.0


def metric_table(steps: int, seed: int, kind: str) -> pd.DataFrame:
    """The synthetic verl keys plus filler keys up to N_METRICS columns."""
    table = synthetic_run(kind, steps=steps, seed=seed)
    rng = np.random.default_rng(seed)
    for i in range(N_METRICS - table.shape[1]):
        table[f"timing_s/synthetic_{i:02d}"] = rng.random(steps)
    return table.iloc[:, :N_METRICS]


def write_console_log(path: Path) -> int:
    n_steps = TOTAL_LINES // STEP_EVERY
    table = metric_table(n_steps, 0, "grpo").round(3)
    keys = list(table.columns)
    values = table.to_numpy()
    noise = [
        "\x1b[36m(WorkerDict pid=12345)\x1b[0m INFO: synthetic start-up output, shard 3 of 8",
        "Training Progress:  12%|#2        | 120/1000 [10:00<1:13:20,  5.00s/it]",
        "(TaskRunner pid=777) WARNING: synthetic warning about something unrelated",
        '  File "/synthetic/verl/trainer/ppo/ray_trainer.py", line 1, in fit',
    ]
    lines = 0
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("(TaskRunner pid=777) {'trainer': {'experiment_name': 'synthetic-bench'}}\n")
        lines += 1
        for step in range(n_steps):
            pairs = " - ".join(f"{k}:{v:.3f}" for k, v in zip(keys, values[step], strict=True))
            handle.write(f"\x1b[36m(TaskRunner pid=777)\x1b[0m step:{step + 1} - {pairs}\n")
            lines += 1
            for i in range(STEP_EVERY - 1):
                handle.write(noise[i % len(noise)] + "\n")
                lines += 1
    return lines


_NAIVE_PAIR = re.compile(r"([\w/@.\-]+):([-\w.]+)")


def naive_parse(path: Path) -> pd.DataFrame:
    with open(path, encoding="utf-8") as handle:
        lines = handle.readlines()
    rows = []
    for line in lines:
        if "step:" not in line:
            continue
        row = {}
        for key, value in _NAIVE_PAIR.findall(line):
            try:
                row[key] = float(value)
            except ValueError:
                pass
        rows.append(row)
    return pd.DataFrame(rows)


def best_of(fn, repeats: int = 3) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def bench_parse(folder: Path) -> None:
    path = folder / "synthetic-console.log"
    lines = write_console_log(path)
    size_mb = path.stat().st_size / 2**20
    ours_s, parsed = best_of(lambda: read_log(path))
    naive_s, naive = best_of(lambda: naive_parse(path))
    run = parsed.runs[0]
    assert run.table.shape == (lines // STEP_EVERY, N_METRICS), run.table.shape
    assert len(naive) == lines // STEP_EVERY
    print(f"parse: {lines:,} lines ({size_mb:.1f} MB, {lines // STEP_EVERY:,} step lines x "
          f"{N_METRICS} metrics)")
    print(f"  ours : {ours_s:.3f} s  {lines / ours_s:,.0f} lines/s")
    print(f"  naive: {naive_s:.3f} s  {lines / naive_s:,.0f} lines/s  (readlines + regex loop)")
    print(f"  ratio naive/ours: {naive_s / ours_s:.2f}x")
    verdict = "PASS" if ours_s < TARGET_S else "FAIL"
    print(f"  target < {TARGET_S:.0f} s for 200k lines: {verdict} ({ours_s:.3f} s)")


def bench_figures() -> None:
    runs = [make_run("synthetic-grpo-lambda0.0", metric_table(1000, 1, "grpo"), "bench", "csv"),
            make_run("synthetic-llds-lambda0.2", metric_table(1000, 2, "llds"), "bench", "csv")]
    keys = list(runs[0].table.columns)

    def ours():
        analyses = [analyse_run(run) for run in runs]
        return build_panels(runs, analyses, smoothing=0.6, annotate=True, extra_metrics=keys)

    def naive():
        import plotly.express as px

        long = pd.concat([run.table.assign(run=run.name).reset_index() for run in runs])
        return [px.line(long, x="step", y=key, color="run") for key in keys]

    ours_s, panels = best_of(ours, repeats=2)
    naive_s, figs = best_of(naive, repeats=2)
    traces = sum(len(panel.figure.data) for panel in panels)
    print(f"figures: 2 runs x 1,000 steps x {N_METRICS} metrics")
    print(f"  ours : {ours_s:.3f} s  ({len(panels)} panels, {traces} traces: smoothed + raw, "
          "phase analysis and annotations included)")
    print(f"  naive: {naive_s:.3f} s  ({len(figs)} px.line figures, raw lines only)")
    print(f"  ratio naive/ours: {naive_s / ours_s:.2f}x")


ROOT = Path(__file__).resolve().parents[1]

# The child's own peak RSS: VmHWM belongs to the process image, while ru_maxrss survives
# exec on Linux and would report the (larger) parent's peak.
_PEAK = """
def peak_mb():
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
"""

# Run in a fresh process so its peak RSS is its own: the analysis of one log, the report.
_ANALYSE = _PEAK + """
import json, sys
import curves.plots
if sys.argv[3] == "all-points":
    curves.plots.MAX_POINTS = 10**12  # every logged point drawn
from curves import analyze_uploads
from curves.report import render_report
result = analyze_uploads([sys.argv[1]])
html = render_report(result)
open(sys.argv[2], "w", encoding="utf-8").write(html)
payload = sum(len(panel.figure.to_json()) for panel in result.panels)
print(json.dumps({"peak_mb": peak_mb(), "report_mb": len(html.encode()) / 2**20,
                  "payload_mb": payload / 2**20,
                  "points": sum(len(t.x) for p in result.panels for t in p.figure.data
                                if t.x is not None)}))
"""

_PARQUET = _PEAK + """
import json, sys
import pyarrow, pandas  # imported by both ways: the start line includes them
before = peak_mb()
if sys.argv[2] == "guarded":
    from curves.parse import LogFormatError, read_log
    try:
        read_log(sys.argv[1])
        outcome = "read"
    except LogFormatError as error:
        outcome = "refused: " + str(error)[:90]
else:
    import pandas as pd
    outcome = f"read {pd.read_parquet(sys.argv[1]).shape}"
print(json.dumps({"peak_mb": peak_mb(), "start_mb": before, "outcome": outcome}))
"""


# Sparse keys, in a fresh process each: ours (cells, bounded table) or the dense table.
_SPARSE = _PEAK + """
import json, sys, time
import pandas  # imported by both ways: the start line includes it
before = peak_mb()
start = time.perf_counter()
if sys.argv[2] == "ours":
    from curves.parse import read_log
    parsed = read_log(sys.argv[1])
    shape = parsed.runs[0].table.shape
else:
    rows = {}
    for line in open(sys.argv[1], encoding="utf-8"):
        record = json.loads(line)
        rows[record.pop("step")] = record
    shape = pandas.DataFrame.from_dict(rows, orient="index").shape
print(json.dumps({"peak_mb": peak_mb(), "start_mb": before, "seconds":
                  time.perf_counter() - start, "shape": list(shape)}))
"""


def write_sparse_jsonl(path: Path, rows: int) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(rows):
            handle.write(json.dumps({"step": i, "critic/score/mean": 0.5, f"k{i}": 1.0}) + "\n")


def bench_sparse(folder: Path) -> None:
    path = folder / "synthetic-sparse.jsonl"
    write_sparse_jsonl(path, 5_000)
    print(f"sparse keys: {path.stat().st_size / 2**20:.2f} MB of JSON lines, 5,000 rows, a new "
          "key on each (SYNTHETIC), each way in a fresh process")
    results = {mode: _child(_SPARSE, str(path), mode) for mode in ("ours", "dense")}
    for mode, r in results.items():
        if "error" in r:
            print(f"  {mode:5}: failed ({r['error']})")
            continue
        print(f"  {mode:5}: peak RSS {r['peak_mb']:,.0f} MB (start {r['start_mb']:,.0f} MB); "
              f"{r['seconds']:.2f} s; table {r['shape'][0]:,} x {r['shape'][1]:,}")
    ours, dense = results["ours"], results["dense"]
    if "error" not in ours and "error" not in dense:
        grown = [(r["peak_mb"] - r["start_mb"]) for r in (ours, dense)]
        print(f"  ratio dense/ours: peak RSS {dense['peak_mb'] / ours['peak_mb']:.1f}x "
              f"(above start {grown[1] / max(grown[0], 1):.0f}x), time "
              f"{dense['seconds'] / ours['seconds']:.1f}x")
    write_sparse_jsonl(path, 15_000)
    r = _child(_SPARSE, str(path), "ours")
    if "error" in r:
        print(f"  ours, 15,000 rows: failed ({r['error']})")
    else:
        print(f"  ours, 15,000 rows ({path.stat().st_size / 2**20:.2f} MB): peak RSS "
              f"{r['peak_mb']:,.0f} MB; {r['seconds']:.2f} s; table {r['shape'][0]:,} x "
              f"{r['shape'][1]:,} (the dense table would need 1.8 GB)")
    path.unlink()


def _child(code: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_parquet_bomb(path: Path, rows: int = 28_000_000) -> None:
    """A W&B-looking history parquet whose two columns of zeros (448 MB decoded)
    compresses to a fraction of a megabyte, written a row group at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    chunk = 2_000_000
    schema = pa.schema([("_step", pa.int64()), ("critic/score/mean", pa.float64())])
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        zeros = pa.array(np.zeros(chunk, dtype="int64"))
        for _ in range(rows // chunk):
            writer.write_table(pa.table({"_step": zeros, "critic/score/mean":
                                         zeros.cast(pa.float64())}, schema=schema))


def bench_memory(folder: Path, log_mb: float) -> None:
    from curves.synthetic import write_large_console

    log = folder / "synthetic-large.log"
    steps, size = write_large_console(log, int(log_mb * 2**20))
    print(f"memory: SYNTHETIC console log of {size / 2**20:.0f} MB ({steps:,} steps x 60 "
          "metrics), analyze_uploads + HTML report, each in a fresh process")
    results = {}
    for mode in ("bounded", "all-points"):
        results[mode] = _child(_ANALYSE, str(log), str(folder / f"{mode}.html"), mode)
        r = results[mode]
        if "error" in r:
            print(f"  {mode:10}: failed ({r['error']})")
            continue
        print(f"  {mode:10}: peak RSS {r['peak_mb']:,.0f} MB; report {r['report_mb']:,.1f} MB; "
              f"figure JSON {r['payload_mb']:,.1f} MB; {r['points']:,} points drawn")
    ours, naive = results["bounded"], results["all-points"]
    if "error" not in ours and "error" not in naive:
        print(f"  ratio all-points/bounded: peak {naive['peak_mb'] / ours['peak_mb']:.2f}x, "
              f"report {naive['report_mb'] / ours['report_mb']:.1f}x, figure JSON "
              f"{naive['payload_mb'] / ours['payload_mb']:.1f}x")
    log.unlink()
    bomb = folder / "bomb-history.parquet"
    write_parquet_bomb(bomb)
    print(f"parquet: {bomb.stat().st_size / 2**20:.2f} MB file, 28,000,000 rows x 2 columns "
          "(448 MB decoded)")
    for mode in ("guarded", "pandas"):
        r = _child(_PARQUET, str(bomb), mode)
        if "error" in r:
            print(f"  {mode:8}: failed ({r['error']})")
        else:
            print(f"  {mode:8}: peak RSS {r['peak_mb']:,.0f} MB (start {r['start_mb']:,.0f} MB); "
                  f"{r['outcome']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--memory", action="store_true", help="also the memory benchmark")
    parser.add_argument("--log-mb", type=float, default=190.0, help="console log size")
    args = parser.parse_args()
    print("SYNTHETIC benchmark data (generated here, not real training logs)")
    with tempfile.TemporaryDirectory() as tmp:
        bench_parse(Path(tmp))
        bench_figures()
        bench_sparse(Path(tmp))
        if args.memory:
            bench_memory(Path(tmp), args.log_mb)


if __name__ == "__main__":
    main()
