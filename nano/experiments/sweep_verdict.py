"""The learning-rate sweep's pre-registered rule, applied to the runs' metrics.jsonl files.

    python -m nano.experiments.sweep_verdict RUN_DIR [RUN_DIR ...]

Rule (README, "Pre-registration"): the highest lr at which GRPO improves for >= 50 steps with
KL to the start below ~0.1, read as: "improves" = the mean `critic/score/mean` over steps
41-50 exceeds that over steps 1-10 by more than twice the standard error of that difference
(from the per-step values); "KL to the start" = `actor/kl_loss` below 0.1 at every one of
steps 41-50. Prints one line a run, then the chosen lr (3e-5 when none passes).
Also printed, not part of the rule: `anchor/logp` at its first and last measure and the
validation score at step 0 and at the end.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

FALLBACK_LR = 3e-5
KL_LIMIT = 0.1


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _se(values: list[float]) -> float:
    from evaluator.stats import mean_se  # the project's one sample SE; inf: too few values

    se = mean_se(values)
    return math.inf if se is None else se


def verdict(rows: list[dict]) -> dict:
    """The rule's reading of one run's metrics rows (one dict a step, as metrics.jsonl)."""
    by_step = {int(r["step"]): r for r in rows}
    score = {s: r["critic/score/mean"] for s, r in by_step.items() if "critic/score/mean" in r}
    early = [score[s] for s in range(1, 11) if s in score]
    late = [score[s] for s in range(41, 51) if s in score]
    kl = [by_step[s]["actor/kl_loss"] for s in range(41, 51)
          if s in by_step and "actor/kl_loss" in by_step[s]]
    anchors = [(s, r["anchor/logp"]) for s, r in sorted(by_step.items()) if "anchor/logp" in r]
    vals = [(s, v) for s, r in sorted(by_step.items()) for k, v in r.items()
            if k.startswith("val/test_score/")]
    complete = len(early) == 10 and len(late) == 10 and len(kl) == 10
    gain = _mean(late) - _mean(early) if early and late else math.nan
    se = math.sqrt(_se(early) ** 2 + _se(late) ** 2) if early and late else math.inf
    return {"steps": max(by_step, default=0), "complete": complete,
            "score_1_10": _mean(early) if early else math.nan,
            "score_41_50": _mean(late) if late else math.nan, "gain": gain, "gain_se": se,
            "improves": complete and gain > 2 * se, "kl_max_41_50": max(kl, default=math.nan),
            "kl_ok": complete and max(kl) < KL_LIMIT,
            "anchor_first": anchors[0] if anchors else None,
            "anchor_last": anchors[-1] if anchors else None,
            "val_first": vals[0] if vals else None, "val_last": vals[-1] if vals else None}


def run_lr(run_dir: Path) -> float:
    command = (run_dir / "command.txt").read_text(encoding="utf-8").split()
    return float(command[command.index("--lr") + 1])


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    passing = []
    for name in argv:
        run_dir = Path(name)
        path = run_dir / "metrics.jsonl"
        if not path.is_file():
            print(f"error: no metrics.jsonl in {run_dir}", file=sys.stderr)
            return 2
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip()]
        v, lr = verdict(rows), run_lr(run_dir)
        print(f"lr {lr:g}: steps {v['steps']}, score 1-10 {v['score_1_10']:.3f}, 41-50 "
              f"{v['score_41_50']:.3f}, gain {v['gain']:+.3f} (SE {v['gain_se']:.3f}) -> "
              f"improves {v['improves']}; max KL 41-50 {v['kl_max_41_50']:.4f} -> below "
              f"{KL_LIMIT}: {v['kl_ok']}; anchor/logp {v['anchor_first']} -> {v['anchor_last']}; "
              f"val {v['val_first']} -> {v['val_last']}")
        if v["improves"] and v["kl_ok"]:
            passing.append(lr)
    chosen = max(passing) if passing else FALLBACK_LR
    print(f"chosen lr: {chosen:g}" + ("" if passing else " (no lr passed: the fallback)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
