"""Two or more runs side by side: EM per dataset, averages, and each run's protocol line."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from evaluator.report import difference, markdown_table, number, sets, signed, summarize_run
from evaluator.rundir import dataset_order


def _labels(paths: Sequence[Path]) -> list[str]:
    names = [p.name for p in paths]
    # two runs with the same folder name (different parents) need their paths to tell apart
    return [str(p) if names.count(p.name) > 1 else p.name for p in paths]


def compare_runs(dirs: Sequence[str | Path]) -> str:
    """EM per dataset of two or more runs side by side, with averages and the protocols."""
    summaries = [summarize_run(d) for d in dirs]
    labels = _labels([Path(d) for d in dirs])
    names = sorted({n for s in summaries for n in s["datasets"]}, key=dataset_order)
    # a dataset whose every question errored has no EM yet: it is shared by none
    shared = [n for n in names if all(s["datasets"].get(n, {}).get("em") is not None
                                      for s in summaries)]
    two = len(summaries) == 2
    header = ["dataset", *labels] + ([f"Δ ({labels[1]} − {labels[0]})"] if two else [])

    def row(label: str, values: list[float | None], marks: list[str]) -> list[str]:
        cells = [label] + [number(v) + m for v, m in zip(values, marks, strict=True)]
        if two:
            cells.append(signed(difference(values[1], values[0])))
        return cells

    rows = []
    for name in names:
        stats = [s["datasets"].get(name) for s in summaries]
        values = [st["em"] if st else None for st in stats]
        marks = ["*" if st and not st["complete"] else "" for st in stats]
        rows.append(row(name, values, marks))
    blank = [""] * len(summaries)
    rows.append(row("**avg (each run's sets)**", [s["macro"]["em"] for s in summaries], blank))
    if shared and shared != names:
        means = [sum(s["datasets"][n]["em"] for n in shared) / len(shared) for s in summaries]
        rows.append(row(f"**avg (shared: {sets(len(shared))})**", means, blank))
    out = ["EM by dataset", "", markdown_table(header, rows), ""]
    out += [f"{label}: {s['protocol']}" for label, s in zip(labels, summaries, strict=True)]
    if any("*" in cell for r in rows for cell in r):
        out.append("* partial: the run has not finished that dataset, or some of its "
                   "questions ended in an error (not scored; re-running resumes them).")
    return "\n".join(out) + "\n"
