"""Issue 46's confirmation: the pre-registered tests of LLDS-A against GRPO on new seeds
(assets/nano-runs/README.md, "The confirmation (issue 46): pre-registration").

    python -m nano.experiments.confirm RUNS_ROOT [--end 80]
    python -m nano.experiments.confirm --power EXPLORATORY_ROOT

RUNS_ROOT holds one folder a run (`metrics.jsonl`, `command.txt`, and `stopped.json` where
the stopping rule ended it). Printed: a row a run, H1 and H2 with Holm's correction, the
secondary figures (final validation paired by seed, survival), and the two warning rules
as 2 x 2 tables. `--power` prints the power calculation from the exploratory runs (issue
40's, assets/nano-runs/collapse), the figures the pre-registration's sample size rests on.

H1 (the mechanism): the anchor change, the mean of `anchor/logp` over the measures at steps
20-30 minus its step-0 value, is higher under LLDS-A; Mann-Whitney, one-sided, exact.
H2 (the collapse): LLDS-A collapses (curves/collapse_rule.py) in fewer runs; Fisher's exact
test, one-sided. Both at alpha 0.05 with Holm's correction over the two.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from curves.collapse_rule import collapse_step, series, validation
from nano.experiments.collapse import ANCHOR, SURVIVAL_AT, anchor_warning, fisher_one_sided
from nano.experiments.main_verdict import phase_two, read_rows, run_label

END = 80
ALPHA = 0.05
WINDOW = (20, 30)  # the H1 endpoint's steps (anchor measured every 2: six measures)
LEAD = 5  # a warning counts when it comes at least this many steps before the collapse
RULES = ("anchor line", "curves phase II (as read)", "curves phase II (fork keys only)")


@dataclass
class Reading:
    """One run of the confirmation, as the pre-registered rules read it."""

    name: str
    method: str
    seed: int
    last_step: int
    stopped: bool  # ended by the stopping rule (stopped.json)
    judged: bool
    collapse_at: int | None
    anchor_change: float | None
    val_end: float | None
    warned: dict[str, int | None]  # rule -> the step it fired (None: never)

    @property
    def collapsed(self) -> bool:
        return self.collapse_at is not None


def anchor_change(rows: list[dict], window: tuple[int, int] = WINDOW) -> float | None:
    """Mean `anchor/logp` over the measures in `window` minus the step-0 measure; a run
    stopped before the window takes its last three measures instead."""
    anchors = series(rows, ANCHOR)
    if 0 not in anchors:
        return None
    inside = [v for s, v in anchors.items() if window[0] <= s <= window[1]]
    if not inside:
        inside = [anchors[s] for s in sorted(anchors)[-3:]]
    return sum(inside) / len(inside) - anchors[0]


def read_run(run_dir: Path, end: int = END) -> Reading:
    method, seed = run_label(run_dir)
    rows = read_rows(run_dir)
    last = max(int(r["step"]) for r in rows)
    stopped = (run_dir / "stopped.json").is_file()
    judged = stopped or last >= end
    collapse_at = collapse_step(rows)[0] if judged else None
    val = validation(rows)
    as_read, fork_only = phase_two(run_dir)
    return Reading(run_dir.name, method, seed, last, stopped, judged, collapse_at,
                   anchor_change(rows), val[max(val)] if val else None,
                   {RULES[0]: anchor_warning(rows, collapse_at), RULES[1]: as_read,
                    RULES[2]: fork_only})


def read_runs(root: Path, end: int = END) -> list[Reading]:
    runs = sorted(p for p in root.iterdir() if (p / "metrics.jsonl").is_file()
                  and (p / "command.txt").is_file()) if root.is_dir() else []
    return sorted((read_run(p, end) for p in runs),
                  key=lambda r: (r.method != "GRPO", r.seed))


# ----------------------------------------------------------------------------- tests

def mann_whitney_greater(higher: list[float], lower: list[float]) -> float:
    """One-sided exact Mann-Whitney p that `higher` tends to exceed `lower`."""
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(higher, lower, alternative="greater", method="exact").pvalue)


def holm(pvalues: dict[str, float], alpha: float = ALPHA) -> dict[str, bool]:
    """Holm's step-down: the smallest p against alpha/m, the next against alpha/(m-1), ...;
    once one is kept, every larger one is kept too."""
    rejected, going = {}, True
    for i, (name, p) in enumerate(sorted(pvalues.items(), key=lambda kv: kv[1])):
        going = going and p < alpha / (len(pvalues) - i)
        rejected[name] = going
    return rejected


def mean_and_se(values: list[float]) -> tuple[float, float]:
    """The mean and its standard error (the project's one, evaluator.stats.mean_se; inf
    for a single value)."""
    from evaluator.stats import mean_se

    se = mean_se(values)
    return sum(values) / len(values), math.inf if se is None else se


def difference(a: list[float], b: list[float]) -> tuple[float, float]:
    """mean(a) - mean(b) and its standard error (Welch)."""
    (ma, sa), (mb, sb) = mean_and_se(a), mean_and_se(b)
    return ma - mb, math.sqrt(sa ** 2 + sb ** 2)


# ----------------------------------------------------------------------------- power

def power_fisher(n: int, p_grpo: float, p_llds: float, alpha: float) -> float:
    """Exact power of the one-sided Fisher test with n runs a method."""
    from scipy.stats import binom, fisher_exact

    total = 0.0
    for g in range(n + 1):
        for m in range(n + 1):
            p = fisher_exact([[g, n - g], [m, n - m]], alternative="greater").pvalue
            if p < alpha:
                total += binom.pmf(g, n, p_grpo) * binom.pmf(m, n, p_llds)
    return total


def power_ranks(n: int, shift: float, sd: float, alpha: float, draws: int = 2000,
                seed: int = 0) -> float:
    """Power of the one-sided exact Mann-Whitney test, n a method, normal endpoints `shift`
    apart with standard deviation `sd` (simulated, fixed seed)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    hits = sum(mann_whitney_greater(list(rng.normal(shift, sd, n)),
                                    list(rng.normal(0.0, sd, n))) < alpha
               for _ in range(draws))
    return hits / draws


def power_report(exploratory: Path) -> list[str]:
    """The pre-registration's power calculation, from the exploratory runs' figures."""
    from nano.experiments import collapse

    readings = read_runs(exploratory)
    grpo = [r for r in readings if r.method == "GRPO"]
    llds = [r for r in readings if r.method == "LLDS-A"]
    g_change = [r.anchor_change for r in grpo]
    l_change = [r.anchor_change for r in llds]
    (mg, sg), (ml, sl) = mean_and_se(g_change), mean_and_se(l_change)
    sd_g, sd_l = sg * math.sqrt(len(g_change)), sl * math.sqrt(len(l_change))
    pooled = math.sqrt((sd_g ** 2 + sd_l ** 2) / 2)
    rate_g = sum(r.collapsed for r in grpo) / len(grpo)
    rate_l = sum(r.collapsed for r in llds) / len(llds)
    lines = [f"Exploratory runs ({exploratory}): {len(grpo)} GRPO, {len(llds)} LLDS-A.",
             f"H1 endpoint (anchor change, steps {WINDOW[0]}-{WINDOW[1]} minus step 0): "
             f"GRPO {mg:+.3f} (SD {sd_g:.3f}), LLDS-A {ml:+.3f} (SD {sd_l:.3f}); "
             f"shift {ml - mg:.3f}, pooled SD {pooled:.3f}.",
             f"H2 collapse rates by step {collapse.END}: GRPO {rate_g:.2f}, LLDS-A "
             f"{rate_l:.2f}.", "",
             "| n a method | H1 as seen, a 0.025 | H1 shift/2, SD x3, a 0.025 | "
             f"H2 at {rate_g:.1f} vs {rate_l:.1f}, a 0.05 | H2 0.7 vs 0.2, a 0.05 | "
             "H2 0.8 vs 0.2, a 0.05 | H2 0.9 vs 0.2, a 0.05 | H2 0.9 vs 0.2, a 0.025 |",
             "|---|---|---|---|---|---|---|---|"]
    for n in range(8, 13):
        cells = [power_ranks(n, ml - mg, pooled, ALPHA / 2, draws=500),
                 power_ranks(n, (ml - mg) / 2, 3 * pooled, ALPHA / 2, draws=500),
                 power_fisher(n, rate_g, rate_l, ALPHA), power_fisher(n, 0.7, 0.2, ALPHA),
                 power_fisher(n, 0.8, 0.2, ALPHA), power_fisher(n, 0.9, 0.2, ALPHA),
                 power_fisher(n, 0.9, 0.2, ALPHA / 2)]
        lines.append(f"| {n} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    return lines


# ----------------------------------------------------------------------------- regime

PILOT_LR = "5e-4"
REGIMES = {  # the pre-registered choice: (lr, steps, seeds)
    "pilot lr": (PILOT_LR, 80, list(range(101, 111))),
    "fallback": ("3e-4", 120, list(range(101, 113))),
}


def pick_regime(pilot_root: Path) -> tuple[str, list[str]]:
    """The pre-registered rule: the pilot lr if the GRPO pilot collapsed and the LLDS-A
    pilot did not, else the fallback; (why, the runner's arguments)."""
    pilot = {r.method: r for r in read_runs(pilot_root)}
    if set(pilot) != {"GRPO", "LLDS-A"} or not all(r.judged for r in pilot.values()):
        raise ValueError(f"the pilot pair in {pilot_root} has not ended: nothing to pick yet")
    chosen = ("pilot lr" if pilot["GRPO"].collapsed and not pilot["LLDS-A"].collapsed
              else "fallback")
    lr, steps, seeds = REGIMES[chosen]
    why = (f"GRPO pilot {'collapsed' if pilot['GRPO'].collapsed else 'did not collapse'}, "
           f"LLDS-A pilot {'collapsed' if pilot['LLDS-A'].collapsed else 'did not collapse'}"
           f": {chosen} (lr {lr}, {steps} steps, seeds {seeds[0]}-{seeds[-1]})")
    return why, ["--seeds", ",".join(map(str, seeds)), "--lr", lr, "--steps", str(steps),
                 "--stop-after-fall", "10"]


# ----------------------------------------------------------------------------- verdict

def _f(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{round(value, digits) + 0.0:.{digits}f}"


def run_table(readings: list[Reading]) -> list[str]:
    header = ["run", "method", "seed", "steps", "collapse", f"anchor change ({WINDOW[0]}-"
              f"{WINDOW[1]})", "final val", *RULES]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in readings:
        collapse = ("not judged (running)" if not r.judged else "no" if not r.collapsed
                    else f"step {r.collapse_at}" + (" (stopped)" if r.stopped else ""))
        cells = [r.name, r.method, str(r.seed), str(r.last_step), collapse,
                 _f(r.anchor_change), _f(r.val_end),
                 *("-" if r.warned[k] is None else str(r.warned[k]) for k in RULES)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def warning_table(readings: list[Reading], rule: str) -> list[str]:
    """The 2 x 2 table of one rule: collapses warned at least LEAD steps ahead, and alarms
    in runs that did not collapse."""
    hit = [r for r in readings if r.collapsed]
    calm = [r for r in readings if not r.collapsed]
    ahead = [r for r in hit if r.warned[rule] is not None
             and r.warned[rule] <= r.collapse_at - LEAD]
    alarms = [r for r in calm if r.warned[rule] is not None]
    leads = sorted(r.collapse_at - r.warned[rule] for r in ahead)
    target = len(ahead) == len(hit) and len(alarms) * 5 <= len(calm)
    return [f"Warning rule: {rule}", "", f"| | warned {LEAD}+ steps ahead (calm runs: at all) "
            "| not warned |", "|---|---|---|",
            f"| collapsed | {len(ahead)} | {len(hit) - len(ahead)} |",
            f"| did not collapse | {len(alarms)} | {len(calm) - len(alarms)} |",
            f"lead (steps) {', '.join(map(str, leads)) or '-'}; target (every collapse warned "
            f"{LEAD}+ steps ahead, false alarms in at most 1 of 5 calm runs): "
            + ("met" if target and hit else "not met")]


def verdict(readings: list[Reading]) -> list[str]:
    judged = [r for r in readings if r.judged]
    grpo = [r for r in judged if r.method == "GRPO"]
    llds = [r for r in judged if r.method == "LLDS-A"]
    pending = len(readings) - len(judged)
    if not grpo or not llds:
        return [f"Tests pending: judged runs of both methods are needed ({len(judged)} of "
                f"{len(readings)} judged)."]
    h1_l = [r.anchor_change for r in llds if r.anchor_change is not None]
    h1_g = [r.anchor_change for r in grpo if r.anchor_change is not None]
    p1 = mann_whitney_greater(h1_l, h1_g)
    p2 = fisher_one_sided(grpo, llds)
    rejected = holm({"H1": p1, "H2": p2})
    d1, se1 = difference(h1_l, h1_g)
    hits_g, hits_l = sum(r.collapsed for r in grpo), sum(r.collapsed for r in llds)
    lines = [
        f"Runs judged: GRPO {len(grpo)}, LLDS-A {len(llds)}"
        + (f"; {pending} not yet judged (the verdict is provisional)" if pending else ""),
        f"H1 (anchor change, LLDS-A > GRPO): LLDS-A {mean_and_se(h1_l)[0]:+.3f}, GRPO "
        f"{mean_and_se(h1_g)[0]:+.3f} nats/token; difference {d1:+.3f} ± {se1:.3f} (SE); "
        f"Mann-Whitney one-sided p = {p1:.2g} -> "
        + ("holds (Holm)" if rejected["H1"] else "not shown"),
        f"H2 (collapses, LLDS-A fewer): GRPO {hits_g} of {len(grpo)}, LLDS-A {hits_l} of "
        f"{len(llds)}; difference {hits_g / len(grpo) - hits_l / len(llds):+.2f}; Fisher "
        f"one-sided p = {p2:.2g} -> " + ("holds (Holm)" if rejected["H2"] else "not shown"),
    ]
    by_seed = {(r.method, r.seed): r.val_end for r in judged if r.val_end is not None}
    paired = [by_seed[("LLDS-A", s)] - by_seed[("GRPO", s)] for m, s in by_seed
              if m == "GRPO" and ("LLDS-A", s) in by_seed]
    if paired:
        mean, se = mean_and_se(paired)
        lines.append(f"Final validation, LLDS-A - GRPO paired by seed ({len(paired)} seeds): "
                     f"{mean:+.3f} ± {se:.3f} (SE)")
    for method, runs in (("GRPO", grpo), ("LLDS-A", llds)):
        standing = [sum(not r.collapsed or r.collapse_at > s for r in runs) for s in SURVIVAL_AT]
        lines.append(f"Standing at steps {', '.join(map(str, SURVIVAL_AT))} ({method}, "
                     f"{len(runs)} runs): {', '.join(map(str, standing))}")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m nano.experiments.confirm",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("runs_root", type=Path)
    parser.add_argument("--end", type=int, default=END, help="steps a run must reach")
    parser.add_argument("--power", action="store_true",
                        help="RUNS_ROOT is the exploratory set: print the power calculation")
    parser.add_argument("--regime", action="store_true",
                        help="RUNS_ROOT is the pilot pair: print the regime the rule picks "
                             "and the runner's arguments for it")
    args = parser.parse_args(argv)
    if args.power:
        print("\n".join(power_report(args.runs_root)))
        return 0
    if args.regime:
        try:
            why, runner = pick_regime(args.runs_root)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(why, file=sys.stderr)
        print(" ".join(runner))
        return 0
    readings = read_runs(args.runs_root, args.end)
    if not readings:
        print(f"error: no run folder (metrics.jsonl and command.txt) in {args.runs_root}",
              file=sys.stderr)
        return 2
    print("\n".join(run_table(readings)))
    print()
    print("\n".join(verdict(readings)))
    judged = [r for r in readings if r.judged]
    for rule in RULES:
        print()
        print("\n".join(warning_table(judged, rule)))
    stopped = [json.loads((args.runs_root / r.name / "stopped.json").read_text())
               for r in readings if r.stopped]
    if stopped:
        print()
        print(f"Stopped by the rule: {len(stopped)} runs, each after the fall held "
              f"{', '.join(str(s['held_steps']) for s in stopped)} steps.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
