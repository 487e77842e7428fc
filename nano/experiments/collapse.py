"""Issue 40's collapse-regime experiment: its pre-registered rule and test, applied to the
shipped logs (assets/nano-runs/README.md, "The collapse-regime experiment").

    python -m nano.experiments.collapse RUNS_ROOT [--sweep SWEEP_RUN] [--end STEPS]

RUNS_ROOT holds one folder a run (`metrics.jsonl`, `command.txt`), e.g.
assets/nano-runs/collapse. Prints a table a run, the test, the survival table, the warning
the anchor line and the curves tool gave, and the reproduction check against the sweep's
3e-4 run (by default RUNS_ROOT/../sweep/grpo-lr3e-4-seed0).

The rule, as pre-registered (its code: curves/collapse_rule.py). R5(s): the mean of
`critic/score/mean` over steps s-4 … s; P(s): the highest R5 up to s; V(s): the latest
validation score at or before s. A run collapses at step t if at every step s from t to
its last step R5(s) < P(s) / 2 and V(s) < V(0) / 2, with t at least HOLD steps before the
last step; the collapse step is the smallest such t. A run is judged once it reaches END
steps. The same conditions held for HOLD or more steps in a row and then lifted are a
transient fall (reported, not counted). The test: collapses per method, Fisher's exact
test, one-sided (LLDS-A collapses less often than GRPO), alpha 0.05.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from curves.collapse_rule import REWARD, collapse_step, reward_means, series, validation
from nano.experiments.main_verdict import FALL, phase_two, read_rows, run_label

END = 80  # the pre-registered length: a run is judged once it gets here
ALPHA = 0.05
SURVIVAL_AT = (20, 40, 60, 80)
ANCHOR = "anchor/logp"


@dataclass
class RunReading:
    """What the rule and the secondary questions read off one run's log."""

    name: str
    method: str
    seed: int
    last_step: int
    judged: bool
    collapse_at: int | None = None
    transients: list[tuple[int, int]] = field(default_factory=list)
    peak: tuple[int, float] | None = None  # (step, R5) of the highest R5
    final_reward: float | None = None  # R5 at the last step
    val_start: float | None = None
    val_end: float | None = None
    anchor_start: float | None = None
    anchor_end: float | None = None
    warning_at: int | None = None  # the anchor below its line, held (see anchor_warning)
    curves_decay: int | None = None  # the curves tool's phase II onset, as it reads the log
    curves_collapse: int | None = None  # the curves tool's reward-collapse step


def anchor_warning(rows: list[dict], until: int | None) -> int | None:
    """The first anchor measure at or below the line (FALL below step 0) that stays at or
    below it at every later measure up to `until` (the collapse step; the run's end if
    None): the main runs' line, read as the warning a user would get."""
    anchors = sorted(series(rows, ANCHOR).items())
    if not anchors or anchors[0][0] != 0:
        return None
    line = anchors[0][1] - FALL
    window = [(s, v) for s, v in anchors if until is None or s <= until]
    for i, (step, value) in enumerate(window):
        if step and value <= line and all(v <= line for _, v in window[i:]):
            return step
    return None


def read_run(run_dir: Path, end: int = END) -> RunReading:
    from curves.analysis import analyse_run
    from curves.sources import read_source

    method, seed = run_label(run_dir)
    rows = read_rows(run_dir)
    last = max(int(r["step"]) for r in rows)
    reading = RunReading(run_dir.name, method, seed, last, judged=last >= end)
    if reading.judged:
        reading.collapse_at, reading.transients = collapse_step(rows)
    means = reward_means(rows)
    if means:
        best = max(means, key=lambda s: (means[s], -s))
        reading.peak, reading.final_reward = (best, means[best]), means[max(means)]
    val, anchors = validation(rows), sorted(series(rows, ANCHOR).items())
    if val:
        reading.val_start, reading.val_end = val[min(val)], val[max(val)]
    if anchors:
        reading.anchor_start, reading.anchor_end = anchors[0][1], anchors[-1][1]
    reading.warning_at = anchor_warning(rows, reading.collapse_at)
    reading.curves_decay = phase_two(run_dir)[0]
    reading.curves_collapse = analyse_run(
        read_source(str(run_dir / "metrics.jsonl")).runs[0]).reward_collapse_step
    return reading


def fisher_one_sided(grpo: list[RunReading], llds: list[RunReading]) -> float:
    """P(GRPO has at least its observed collapses | the margins): LLDS-A collapses less."""
    from scipy.stats import fisher_exact

    def counts(runs: list[RunReading]) -> list[int]:
        hit = sum(r.collapse_at is not None for r in runs)
        return [hit, len(runs) - hit]

    return float(fisher_exact([counts(grpo), counts(llds)], alternative="greater").pvalue)


def _f(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _step(value: int | None) -> str:
    return "-" if value is None else str(value)


def table(readings: list[RunReading]) -> list[str]:
    header = ["run", "method", "seed", "steps", "R5 peak (step) → end", "val start → end",
              "anchor start → end", "collapse", "transient falls", "anchor warning",
              "warning lead", "curves II", "curves reward collapse"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in readings:
        collapse = ("not judged (running)" if not r.judged
                    else "no" if r.collapse_at is None else f"step {r.collapse_at}")
        lead = ("-" if r.collapse_at is None or r.warning_at is None
                else str(r.collapse_at - r.warning_at))
        cells = [r.name, r.method, str(r.seed), str(r.last_step),
                 "-" if r.peak is None
                 else f"{r.peak[1]:.2f} ({r.peak[0]}) → {_f(r.final_reward, 2)}",
                 f"{_f(r.val_start)} → {_f(r.val_end)}",
                 f"{_f(r.anchor_start)} → {_f(r.anchor_end)}", collapse,
                 ", ".join(f"{a}-{b}" for a, b in r.transients) or "-",
                 _step(r.warning_at), lead, _step(r.curves_decay), _step(r.curves_collapse)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def survival(readings: list[RunReading], methods: list[str]) -> list[str]:
    lines = ["| method | runs | " + " | ".join(f"standing at {s}" for s in SURVIVAL_AT) + " |",
             "|" + "---|" * (2 + len(SURVIVAL_AT))]
    for method in methods:
        runs = [r for r in readings if r.method == method]
        standing = [sum(r.collapse_at is None or r.collapse_at > s for r in runs)
                    for s in SURVIVAL_AT]
        lines.append(f"| {method} | {len(runs)} | " + " | ".join(map(str, standing)) + " |")
    return lines


def warnings(readings: list[RunReading]) -> list[str]:
    collapsed = [r for r in readings if r.collapse_at is not None]
    standing = [r for r in readings if r.collapse_at is None]
    leads = [r.collapse_at - r.warning_at for r in collapsed if r.warning_at is not None]
    ii_before = [r for r in collapsed if r.curves_decay is not None
                 and r.curves_decay < r.collapse_at]
    false_alarms = sum(r.curves_decay is not None for r in standing)
    return [
        f"Anchor line (0.05 nats/token below step 0, held): crossed before {len(leads)} of "
        f"{len(collapsed)} collapses"
        + (f", {min(leads)}-{max(leads)} steps before (median "
           f"{sorted(leads)[len(leads) // 2]})" if leads else "")
        + f"; crossed and held to the end in {sum(r.warning_at is not None for r in standing)}"
        f" of {len(standing)} runs that did not collapse.",
        f"Curves phase rule: phase II called before the collapse in {len(ii_before)} of "
        f"{len(collapsed)} collapsing runs; called in {false_alarms} of {len(standing)} "
        "runs that did not collapse (false alarms).",
    ]


def reproduction(run_dir: Path, sweep_dir: Path, upto: int = 50) -> str:
    """Whether the run's rewards at steps 1..upto equal the sweep run's."""
    if not (sweep_dir / "metrics.jsonl").is_file():
        return f"Reproduction: no sweep run at {sweep_dir}; not checked."
    ours, theirs = series(read_rows(run_dir), REWARD), series(read_rows(sweep_dir), REWARD)
    steps = [s for s in range(1, upto + 1) if s in ours and s in theirs]
    same = [s for s in steps if abs(ours[s] - theirs[s]) < 1e-9]
    first = next((s for s in steps if s not in same), None)
    return (f"Reproduction ({run_dir.name} vs {sweep_dir.parent.name}/{sweep_dir.name}, steps "
            f"1-{upto}): reward equal "
            f"at {len(same)} of {len(steps)} steps"
            + ("" if first is None else f"; first difference at step {first} "
               f"({ours[first]:.3f} vs {theirs[first]:.3f})") + ".")


def read_runs(root: Path, end: int = END) -> list[RunReading]:
    """Every run folder under `root` (metrics.jsonl and command.txt), GRPO first."""
    runs = sorted(p for p in root.iterdir() if (p / "metrics.jsonl").is_file()
                  and (p / "command.txt").is_file()) if root.is_dir() else []
    return sorted((read_run(p, end) for p in runs),
                  key=lambda r: (r.method != "GRPO", r.method, r.seed))


def findings(readings: list[RunReading]) -> str:
    """What the judged runs show, in one sentence for a visitor: collapses per method, the
    anchor likelihood's direction, and the pre-registered test's verdict as it stands."""
    judged = [r for r in readings if r.judged]
    grpo = [r for r in judged if r.method == "GRPO"]
    llds = [r for r in judged if r.method == "LLDS-A"]
    if not grpo or not llds:
        return ""

    def collapsed(runs: list[RunReading]) -> str:
        hits = [r.collapse_at for r in runs if r.collapse_at is not None]
        steps = f" (at step{'s' if len(hits) > 1 else ''} {', '.join(map(str, hits))})"
        return f"{len(hits)} of {len(runs)} runs" + (steps if hits else "")

    def rose(runs: list[RunReading]) -> int:
        return sum(r.anchor_end is not None and r.anchor_start is not None
                   and r.anchor_end > r.anchor_start for r in runs)

    p = fisher_one_sided(grpo, llds)
    verdict = ("so LLDS-A prevented the collapse by the pre-registered test" if p < ALPHA
               else "so LLDS-A is not shown to prevent the collapse")
    pending = len(readings) - len(judged)
    return (f"At lr 3e-4 (the collapse regime; {len(grpo)} GRPO and {len(llds)} LLDS-A "
            f"seeds trained to step {END}"
            f"{f', {pending} more not yet' if pending else ''}), GRPO collapsed in "
            f"{collapsed(grpo)} and LLDS-A in {collapsed(llds)}; the likelihood of the "
            f"starting model's right answers ended above where it began in {rose(llds)} of "
            f"{len(llds)} LLDS-A runs and {rose(grpo)} of {len(grpo)} GRPO runs, {verdict} "
            f"(Fisher's exact, one-sided, p = {p:.2f}).")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m nano.experiments.collapse",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("runs_root", type=Path)
    parser.add_argument("--sweep", type=Path, default=None,
                        help="the sweep's 3e-4 run (default RUNS_ROOT/../sweep/"
                             "grpo-lr3e-4-seed0)")
    parser.add_argument("--end", type=int, default=END, help="steps a run must reach")
    args = parser.parse_args(argv)
    root = args.runs_root
    readings = read_runs(root, args.end)
    if not readings:
        print(f"error: no run folder (metrics.jsonl and command.txt) in {root}",
              file=sys.stderr)
        return 2
    print("\n".join(table(readings)))
    methods = list(dict.fromkeys(r.method for r in readings))
    judged = [r for r in readings if r.judged]
    print()
    grpo = [r for r in judged if r.method == "GRPO"]
    llds = [r for r in judged if r.method == "LLDS-A"]
    for method, runs_of in (("GRPO", grpo), ("LLDS-A", llds)):
        hits = [r for r in runs_of if r.collapse_at is not None]
        print(f"{method}: {len(hits)} of {len(runs_of)} judged runs collapsed"
              + (f" (steps {', '.join(str(r.collapse_at) for r in hits)})" if hits else ""))
    pending = len(readings) - len(judged)
    if grpo and llds:
        p = fisher_one_sided(grpo, llds)
        verdict = "prevents the collapse" if p < ALPHA else "not shown to prevent the collapse"
        if sum(r.collapse_at is not None for r in grpo) < 3:
            verdict += " (GRPO collapsed in fewer than 3 runs: the test cannot show it)"
        print(f"Fisher's exact test, one-sided (LLDS-A collapses less): p = {p:.3f} -> "
              f"LLDS-A {verdict}" + (f"; {pending} runs still to reach step {args.end}"
                                     if pending else ""))
    else:
        print(f"Test pending: it needs judged runs of both methods ({len(judged)} of "
              f"{len(readings)} runs have reached step {args.end}).")
    print()
    print("\n".join(survival(judged, methods)))
    print()
    for line in warnings(judged):
        print(line)
    for method in methods:
        vals = [r.val_end for r in judged if r.method == method and r.val_end is not None]
        if vals:
            from evaluator.stats import mean_se

            se = mean_se(vals)
            print(f"Final validation ({method}, {len(vals)} runs): {sum(vals) / len(vals):.3f}"
                  + ("" if se is None else f" ± {se:.3f} (SE over runs)"))
    seed0 = next((root / r.name for r in readings if (r.method, r.seed) == ("GRPO", 0)), None)
    if seed0 is not None:
        sweep = args.sweep or root.parent / "sweep" / "grpo-lr3e-4-seed0"
        print(reproduction(seed0, sweep))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
