"""Two or more runs side by side: EM ± SE per dataset, averages, and each run's protocol
line; and two runs paired question by question (`paired_report`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from evaluator.report import (
    difference,
    markdown_table,
    number,
    protocol_line,
    sets,
    signed,
    summarize_run,
    with_se,
)
from evaluator.rundir import dataset_order, load_run
from evaluator.stats import average_se, paired_runs


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

    def row(label: str, stats: list[dict | None], marks: list[str]) -> list[str]:
        cells = [label] + [(with_se(st, "em") if st else "-") + m
                           for st, m in zip(stats, marks, strict=True)]
        if two:
            values = [st["em"] if st else None for st in stats]
            cells.append(signed(difference(values[1], values[0])))
        return cells

    rows = []
    for name in names:
        stats = [s["datasets"].get(name) for s in summaries]
        marks = ["*" if st and not st["complete"] else "" for st in stats]
        rows.append(row(name, stats, marks))
    blank = [""] * len(summaries)
    rows.append(row("**avg (each run's sets)**", [s["macro"] for s in summaries], blank))
    if shared and shared != names:
        means = [{"em": sum(s["datasets"][n]["em"] for n in shared) / len(shared),
                  "em_se": average_se([s["datasets"][n]["em_se"] for n in shared])}
                 for s in summaries]
        rows.append(row(f"**avg (shared: {sets(len(shared))})**", means, blank))
    out = ["EM ± SE by dataset (not paired: `report --paired A B` compares two runs "
           "question by question)", "", markdown_table(header, rows), ""]
    out += [f"{label}: {s['protocol']}" for label, s in zip(labels, summaries, strict=True)]
    if any("*" in cell for r in rows for cell in r):
        out.append("* partial: the run has not finished that dataset, or some of its "
                   "questions ended in an error (not scored; re-running resumes them).")
    return "\n".join(out) + "\n"


def paired_report(dir_a: str | Path, dir_b: str | Path) -> str:
    """Run B against run A on the questions both scored, per dataset and pooled: EM of each,
    the difference B - A with its paired SE, the questions only one run got right, and the
    exact McNemar p-value. A ValueError when the runs share no dataset or a question id
    names different questions."""
    run_a, run_b = load_run(dir_a), load_run(dir_b)
    a, b = _labels([Path(dir_a), Path(dir_b)])
    results = paired_runs(run_a.records, run_b.records)
    if not results:
        raise ValueError(f"{a} and {b} share no dataset with results "
                         f"({a}: {', '.join(run_a.records) or 'none'}; "
                         f"{b}: {', '.join(run_b.records) or 'none'}).")
    header = ["dataset", "n common", f"EM {a}", f"EM {b}", f"Δ ({b} − {a}) ± SE",
              f"right only in {a}", f"right only in {b}", "McNemar p"]
    rows = []
    for name, result in results.items():
        label = "**all (pooled)**" if name == "all" else name
        diff = "-" if result.diff is None else signed(result.diff) + (
            "" if result.diff_se is None else f" ± {number(result.diff_se)}")
        rows.append([label, str(result.n), number(result.em_a), number(result.em_b), diff,
                     str(result.only_a), str(result.only_b), f"{result.p_value:.3g}"])
    notes = ["Paired on the question ids both runs scored (a question that errored in either "
             "run is left out). SE: the sample standard error of the per-question "
             "differences. p: exact McNemar test (two-sided binomial test of the questions "
             "only one run got right, at one half).",
             f"{a}: {protocol_line(run_a.settings)}",
             f"{b}: {protocol_line(run_b.settings)}"]
    return "\n".join([f"Paired EM: {a} vs {b}", "", markdown_table(header, rows), "",
                      *notes]) + "\n"
