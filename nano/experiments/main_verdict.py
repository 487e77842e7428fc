"""The main runs' pre-registered criteria (README, "Pre-registration"), applied to the logs
and to the final models' evaluator runs; prints the runs README's table.

    python -m nano.experiments.main_verdict RUNS_ROOT [EVALS_ROOT]
    python -m nano.experiments.main_verdict --save-scores RUNS_ROOT EVALS_ROOT

RUNS_ROOT holds one folder a run (`metrics.jsonl`, `command.txt`); EVALS_ROOT, if given,
holds the evaluator run of each run's final model under the same folder name (`python -m
evaluator --datasets vitalqa,naturalqa --model RUN/model --output EVALS_ROOT/NAME`).
Without EVALS_ROOT, a run folder's `pool_em.json` (question -> 0/1 EM, written from the
evaluator runs by --save-scores; shipped for every main run) stands in for its evaluation.

Displacement (per run; "shown" needs >= 2 of 3 GRPO seeds): `anchor/logp` at least
FALL below its step-0 value at some measure t and below that line at every later measure
before the first deterioration (to the end if none); at t the reward holds: the 10-step
mean of `critic/score/mean` ending at t is not below the steps 1-10 mean by more than twice
the SE of the difference. Deterioration: the first step whose 10-step mean of
`actor/entropy_loss` exceeds 1.5x its steps 1-10 mean, of `actor/grad_norm` 2x, or whose
reward mean is below the steps 1-10 mean by more than twice the SE. The fall must come
before it.
Also printed (issue 28, item 7): where the curves phase rule calls phase II, as it reads
the log and from the fork's `actor/pos_avg_old_log_prob` alone.
LLDS holds (against GRPO; the gate control likewise): the mean over seeds of the paired EM
gain on the pooled held-out questions exceeds twice its SE (from the per-question
differences averaged over the paired seeds) and the between-seed spread (the larger of the
two methods' max - min final EM).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

FALL = 0.05  # nats/token below the step-0 anchor likelihood
SCORES = "pool_em.json"  # a run's final EM by question, from its evaluator run
WINDOW = 10
ENTROPY_FACTOR, GRAD_FACTOR = 1.5, 2.0


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _se(values: list[float]) -> float:
    from evaluator.stats import mean_se  # the project's one sample SE; inf: too few values

    se = mean_se(values)
    return math.inf if se is None else se


def _series(rows: list[dict], key: str) -> dict[int, float]:
    return {int(r["step"]): float(r[key]) for r in rows if key in r}


def _window(series: dict[int, float], end: int) -> list[float]:
    return [series[s] for s in range(max(1, end - WINDOW + 1), end + 1) if s in series]


def _reward_low(score: dict[int, float], end: int) -> bool:
    """The reward's 10-step mean ending at `end` is below the steps 1-10 mean by more than
    twice the SE of the difference."""
    early, now = _window(score, WINDOW), _window(score, end)
    if not early or not now:
        return False
    se = math.sqrt(_se(early) ** 2 + _se(now) ** 2)
    return _mean(early) - _mean(now) > 2 * se


def deterioration(rows: list[dict]) -> tuple[int | None, str | None]:
    """The first step after the first ten whose window deteriorates, and which signal."""
    score = _series(rows, "critic/score/mean")
    entropy, grad = _series(rows, "actor/entropy_loss"), _series(rows, "actor/grad_norm")
    base_h, base_g = _window(entropy, WINDOW), _window(grad, WINDOW)
    for step in sorted(s for s in score if s > WINDOW):
        if base_h and _mean(_window(entropy, step)) > ENTROPY_FACTOR * _mean(base_h):
            return step, "entropy"
        if base_g and _mean(_window(grad, step)) > GRAD_FACTOR * _mean(base_g):
            return step, "grad norm"
        if _reward_low(score, step):
            return step, "reward"
    return None, None


def displacement(rows: list[dict]) -> dict:
    """The displacement criterion's reading of one run's metrics rows."""
    anchors = sorted(_series(rows, "anchor/logp").items())
    score = _series(rows, "critic/score/mean")
    worse_at, worse_by = deterioration(rows)
    out = {"anchor_start": anchors[0][1] if anchors else None,
           "anchor_end": anchors[-1][1] if anchors else None,
           "deteriorates_at": worse_at, "deteriorates_by": worse_by, "fall_at": None,
           "shown": False}
    if not anchors or anchors[0][0] != 0:
        return out
    line = anchors[0][1] - FALL
    before = [(s, v) for s, v in anchors if worse_at is None or s < worse_at]
    for i, (step, value) in enumerate(before):
        if step == 0 or value > line or _reward_low(score, step):
            continue
        if all(v <= line for _, v in before[i:]):
            out.update(fall_at=step, shown=True)
            break
    return out


def phase_two(run_dir: Path) -> tuple[int | None, int | None]:
    """Where the curves phase rule calls phase II (steady decay) in this run: as it reads the
    log (from `anchor/logp` when it has enough points) and from the fork's key alone."""
    from curves.analysis import analyse_run
    from curves.sources import read_source

    run = read_source(str(run_dir / "metrics.jsonl")).runs[0]
    as_read = analyse_run(run).decay_onset
    run.table = run.table.drop(columns=[c for c in run.table.columns if c == "anchor/logp"])
    return as_read, analyse_run(run).decay_onset


def run_label(run_dir: Path) -> tuple[str, int]:
    """(method as the README names it, seed) from the run's command.txt."""
    words = (run_dir / "command.txt").read_text(encoding="utf-8").split()

    def flag(name: str, default: str) -> str:
        return words[words.index(name) + 1] if name in words else default

    method = flag("--method", "grpo")
    label = "GRPO" if method == "grpo" else method.upper()
    if method != "grpo" and flag("--gate", "lazy") != "lazy":
        label += f" ({flag('--gate', 'lazy')} gate)"
    return label, int(flag("--seed", "0"))


def read_rows(run_dir: Path) -> list[dict]:
    rows = {}
    for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            rows[int(row["step"])] = row  # a resumed step's later line wins
    return [rows[s] for s in sorted(rows)]


def pooled_em(eval_dir: Path) -> dict[str, int]:
    """question key -> 0/1 EM over every dataset of an evaluator run (errors left out)."""
    from evaluator.rundir import load_run

    run = load_run(eval_dir)
    return {f"{name}/{r.id}": int(r.metrics["em"]) for name, records in run.records.items()
            for r in records if r.stop_reason != "error"}


def save_scores(runs_root: Path, evals_root: Path) -> list[str]:
    """Write each run's pooled EM by question as RUN/pool_em.json; the names written."""
    written = []
    for run in sorted(p for p in runs_root.iterdir() if (p / "metrics.jsonl").is_file()):
        if (evals_root / run.name).is_dir():
            scores = pooled_em(evals_root / run.name)
            (run / SCORES).write_text(json.dumps(scores, sort_keys=True, indent=0) + "\n")
            written.append(run.name)
    return written


def holds(baseline: dict[int, dict[str, int]], method: dict[int, dict[str, int]]) -> dict:
    """The LLDS criterion: `method` against `baseline`, both seed -> pooled EM by question."""
    seeds = sorted(set(baseline) & set(method))
    if not seeds:
        return {"seeds": [], "holds": False}
    keys = sorted(set.intersection(*(set(baseline[s]) & set(method[s]) for s in seeds)))
    diffs = [_mean([method[s][k] - baseline[s][k] for s in seeds]) for k in keys]
    gain, se = _mean(diffs), _se(diffs)

    def spread(runs: dict[int, dict[str, int]]) -> float:
        ems = [_mean([runs[s][k] for k in keys]) for s in seeds]
        return max(ems) - min(ems)

    limit = max(spread(baseline), spread(method))
    return {"seeds": seeds, "n": len(keys), "gain": gain, "se": se, "spread": limit,
            "holds": gain > 2 * se and gain > limit}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--save-scores"] and len(argv) == 3:
        written = save_scores(Path(argv[1]), Path(argv[2]))
        print(f"wrote {SCORES} for {len(written)} runs: {', '.join(written) or 'none'}")
        return 0 if written else 2
    if not argv or len(argv) > 2 or argv[0].startswith("-"):
        print(__doc__)
        return 2
    runs_root = Path(argv[0])
    evals_root = Path(argv[1]) if len(argv) > 1 else None
    runs = sorted(p for p in runs_root.iterdir() if (p / "metrics.jsonl").is_file()
                  and (p / "command.txt").is_file()) if runs_root.is_dir() else []
    if not runs:
        print(f"error: no run folder (metrics.jsonl and command.txt) in {runs_root}",
              file=sys.stderr)
        return 2
    if evals_root is not None:
        evals = {p.name: pooled_em(p) for p in sorted(evals_root.iterdir())
                 if p.is_dir()} if evals_root.is_dir() else {}
    else:  # the shipped scores
        evals = {run.name: json.loads((run / SCORES).read_text()) for run in runs
                 if (run / SCORES).is_file()}
    # An evaluation still running (or stopped) has fewer questions than the others: it is
    # marked and left out of the LLDS criterion.
    pool_size = max((len(scores) for scores in evals.values()), default=0)
    em_by_method: dict[str, dict[int, dict[str, int]]] = {}
    shown: dict[str, list[bool]] = {}
    gate_lines: list[str] = []  # how often each LLDS run's gate let its term act (not a criterion)
    header = ["run", "method", "seed", "steps", "reward 1-10 → last 10", "final EM (pool)",
              "anchor/logp start → end",
              "KL (last 10)", "anchor fall", "deteriorates", "displacement",
              "curves II (as read / fork key)"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for run in runs:
        label, seed = run_label(run)
        rows = read_rows(run)
        last = max(r["step"] for r in rows)
        d = displacement(rows)
        kl = _window(_series(rows, "actor/kl_loss"), last)
        em = "-"
        scores = evals.get(run.name)
        if scores:
            em = f"{_mean(list(scores.values())):.3f} (n {len(scores)})"
            if len(scores) < pool_size:
                em += " partial"
            else:
                em_by_method.setdefault(label, {})[seed] = scores
        shown.setdefault(label, []).append(d["shown"])
        term = _series(rows, "actor/loss_noreduce")
        if label != "GRPO" and term:
            gate_lines.append(f"{run.name}: the LLDS term (`actor/loss_noreduce`, the fork's "
                              f"key: last micro-batch) above 0 in "
                              f"{sum(v > 0 for v in term.values())} of {len(term)} steps")
        score = _series(rows, "critic/score/mean")
        first, final = _window(score, WINDOW), _window(score, last)
        reward = f"{_mean(first):.2f} → {_mean(final):.2f}" if first and final else "-"
        cells = [run.name, label, str(seed), str(last), reward, em,
                 "-" if d["anchor_start"] is None
                 else f"{d['anchor_start']:.3f} → {d['anchor_end']:.3f}",
                 f"{_mean(kl):.3f}" if kl else "-",
                 "no" if d["fall_at"] is None else f"step {d['fall_at']}",
                 "no" if d["deteriorates_at"] is None
                 else f"step {d['deteriorates_at']} ({d['deteriorates_by']})",
                 "shown" if d["shown"] else "not shown",
                 " / ".join("-" if step is None else str(step) for step in phase_two(run))]
        print("| " + " | ".join(cells) + " |")
    for name, scores in evals.items():
        if name not in {run.name for run in runs} and scores:
            print(f"\n{name} (no training run here): final EM (pool) "
                  f"{_mean(list(scores.values())):.3f} (n {len(scores)})")
    print()
    for line in gate_lines:
        print(line)
    print()
    grpo = shown.get("GRPO", [])
    print(f"Displacement (>= 2 of 3 GRPO seeds): {sum(grpo)} of {len(grpo)} GRPO runs -> "
          f"{'shown' if sum(grpo) >= 2 else 'not shown'}"
          + ("" if len(grpo) >= 3 else " (fewer than 3 seeds: the criterion is incomplete)"))
    for label, method in em_by_method.items():
        if label == "GRPO" or "GRPO" not in em_by_method:
            continue
        h = holds(em_by_method["GRPO"], method)
        if not h["seeds"]:
            continue
        print(f"{label} vs GRPO (seeds {', '.join(map(str, h['seeds']))}, {h['n']} questions): "
              f"gain {h['gain']:+.3f} ± {h['se']:.3f} (SE), between-seed spread "
              f"{h['spread']:.3f} -> {'holds' if h['holds'] else 'does not hold'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
