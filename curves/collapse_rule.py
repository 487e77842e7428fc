"""The studio's one collapse rule (issue 40's, pre-registered), as pure functions over a
run's metric rows (dicts with `step`, the reward `critic/score/mean` or another key, and
`val/test_score/<set>`). The curves tool applies it to any log with a reward and a
validation score at step 0; the nano trainer stops by it; the experiments judge by it.

R5(s): the mean of `critic/score/mean` over steps s-4 … s; P(s): the highest R5 up to s;
V(s): the latest validation score at or before s. At step s a run is *fallen* when
R5(s) < P(s) / 2 and V(s) < V(0) / 2. A run collapses at step t if it is fallen at every
step from t to its last step, with t at least HOLD steps before the last step; the collapse
step is the smallest such t. Falls of HOLD or more steps that lift are transient.

The trainer's stopping rule (`nano rl --stop-after-fall N`) and the experiments' verdicts
read the same functions, so a run stopped for a collapse is judged collapsed at the step
the stop names.
"""

from __future__ import annotations

import math

WINDOW = 5  # steps in the reward mean R5
HOLD = 5  # steps a collapse must hold before the run's end (a validation confirms it)
REWARD, VAL_PREFIX = "critic/score/mean", "val/test_score/"


def series(rows: list[dict], key: str) -> dict[int, float]:
    return {int(r["step"]): float(r[key]) for r in rows if key in r}


def validation(rows: list[dict]) -> dict[int, float]:
    """step -> validation score (the run's one validation set)."""
    return {int(r["step"]): float(v) for r in rows for k, v in r.items()
            if k.startswith(VAL_PREFIX)}


def reward_means(rows: list[dict], reward: str = REWARD) -> dict[int, float]:
    """R5(s) for every step s with WINDOW reward values ending at s."""
    score = series(rows, reward)
    return {s: sum(score[u] for u in range(s - WINDOW + 1, s + 1)) / WINDOW
            for s in sorted(score) if all(u in score for u in range(s - WINDOW + 1, s + 1))}


def fallen_steps(rows: list[dict], reward: str = REWARD) -> list[int]:
    """The steps s at which both conditions hold: R5(s) < P(s)/2 and V(s) < V(0)/2."""
    means, val = reward_means(rows, reward), validation(rows)
    if 0 not in val:
        return []
    peak, fallen = -math.inf, []
    for step in sorted(means):
        peak = max(peak, means[step])
        latest = val[max(s for s in val if s <= step)]
        if means[step] < peak / 2 and latest < val[0] / 2:
            fallen.append(step)
    return fallen


def runs_of(steps: list[int]) -> list[tuple[int, int]]:
    """Consecutive steps grouped as (first, last)."""
    out: list[tuple[int, int]] = []
    for step in steps:
        if out and step == out[-1][1] + 1:
            out[-1] = (out[-1][0], step)
        else:
            out.append((step, step))
    return out


def collapse_step(rows: list[dict], reward: str = REWARD
                  ) -> tuple[int | None, list[tuple[int, int]]]:
    """(the collapse step or None, the transient falls as (first, last) step)."""
    last = max(int(r["step"]) for r in rows)
    spans = runs_of(fallen_steps(rows, reward))
    collapse = None
    if spans and spans[-1][1] == last and last - spans[-1][0] >= HOLD:
        collapse = spans[-1][0]
        spans = spans[:-1]
    return collapse, [(a, b) for a, b in spans if b - a + 1 >= HOLD]


def fall_held(rows: list[dict], steps: int) -> int | None:
    """The first step of a fall that has held from there to the last row for at least
    `steps` steps (last - first >= steps), else None: the trainer's stopping rule."""
    spans = runs_of(fallen_steps(rows))
    if not spans:
        return None
    first, last = spans[-1]
    at_end = last == max(int(r["step"]) for r in rows)
    return first if at_end and last - first >= steps else None
