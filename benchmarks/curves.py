"""Benchmark the curves module on SYNTHETIC data (nothing here is a real training run).

1. Parsing a generated 200k-line verl console log (20k step lines of 60 metrics each, the
   rest start-up/noise lines with ANSI codes, worker prefixes, tqdm bars and tracebacks):
   lines/s for `read_log` vs a naive `readlines()` + regex + float loop + `pd.DataFrame`.
   Target: under 2 s for the 200k lines.
2. Building the figures for 2 runs x 1,000 steps x 60 metrics (phase analysis included) vs
   a naive `plotly.express.line` per metric on a long table.

Run: python benchmarks/curves.py
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

# Run as a script, Python puts benchmarks/ first on sys.path, where agent.py, curves.py and
# evaluator.py would hide the packages of those names: the checkout's root takes its place.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from curves.analysis import analyse_run  # noqa: E402
from curves.parse import read_log  # noqa: E402
from curves.plots import build_panels  # noqa: E402
from curves.runs import make_run  # noqa: E402
from curves.synthetic import synthetic_run  # noqa: E402

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


def main() -> None:
    print("SYNTHETIC benchmark data (generated here, not real training logs)")
    with tempfile.TemporaryDirectory() as tmp:
        bench_parse(Path(tmp))
    bench_figures()


if __name__ == "__main__":
    main()
