"""Standard errors of the summary's means, and a paired comparison of two runs.

Pure functions over numbers and `Record`s: no I/O.

- A 0/1 metric (EM, sub-EM, retrieval recall, answered) gets the binomial standard error
  sqrt(p(1 - p) / n); any other mean (F1, costs) the sample standard error of the mean,
  sd / sqrt(n) with the n - 1 divisor (None for fewer than two values).
- An unweighted average of per-dataset means gets sqrt(sum of their squared SEs) / k:
  the datasets are independent samples.
- Two runs on the same questions: EM of each on the questions both scored, the difference
  B - A with the paired standard error (the sample SE of the per-question differences),
  the discordant counts, and the exact McNemar test (a two-sided binomial test of the
  discordant pairs at one half).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Metrics that are 0 or 1 per question: their mean's SE is binomial.
BINARY_KEYS = ("em", "sub_em", "retrieval_recall", "answered")


def binomial_se(p: float | None, n: int) -> float | None:
    """sqrt(p(1 - p) / n), the standard error of a proportion; None without questions."""
    if p is None or n <= 0:
        return None
    return math.sqrt(max(p * (1.0 - p), 0.0) / n)


def mean_se(values: Sequence[float]) -> float | None:
    """The sample standard error of the mean (n - 1 divisor); None for under two values."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return math.sqrt(variance / n)


def metric_se(key: str, values: Sequence[float]) -> float | None:
    """The SE of the mean of `values` for metric `key`: binomial for a 0/1 metric."""
    if key in BINARY_KEYS:
        return binomial_se(sum(values) / len(values) if values else None, len(values))
    return mean_se(values)


def average_se(ses: Sequence[float | None]) -> float | None:
    """The SE of an unweighted mean of independent means: sqrt(sum SE^2) / k."""
    if not ses or any(se is None for se in ses):
        return None
    return math.sqrt(sum(se * se for se in ses)) / len(ses)  # type: ignore[operator]


def mcnemar_exact_p(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value: twice the smaller binomial tail of the discordant
    pairs at one half, capped at 1 (1.0 when there are none). Exact integer arithmetic."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1))
    return min(1.0, 2 * tail / 2**n)


@dataclass(frozen=True)
class Paired:
    """Run A against run B on the questions both scored (errored ones left out)."""

    n: int
    em_a: float | None
    em_b: float | None
    diff: float | None  # EM B - EM A
    diff_se: float | None  # sample SE of the per-question differences
    only_a: int  # right in A, wrong in B
    only_b: int  # right in B, wrong in A
    p_value: float  # exact McNemar, two-sided

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def paired(em_a: Sequence[int], em_b: Sequence[int]) -> Paired:
    """The paired comparison of two equally long 0/1 EM sequences, question by question."""
    if len(em_a) != len(em_b):
        raise ValueError("paired EM lists must have one value per question each")
    n = len(em_a)
    only_a = sum(1 for a, b in zip(em_a, em_b, strict=True) if a and not b)
    only_b = sum(1 for a, b in zip(em_a, em_b, strict=True) if b and not a)
    if not n:
        return Paired(0, None, None, None, None, 0, 0, 1.0)
    mean_a, mean_b = sum(em_a) / n, sum(em_b) / n
    differences = [float(b - a) for a, b in zip(em_a, em_b, strict=True)]
    return Paired(n, mean_a, mean_b, mean_b - mean_a, mean_se(differences), only_a, only_b,
                  mcnemar_exact_p(only_a, only_b))


def paired_runs(records_a: Mapping[str, Sequence[Any]],
                records_b: Mapping[str, Sequence[Any]]) -> dict[str, Paired]:
    """Per dataset both runs hold, the paired comparison on their common questions (by id;
    a question that errored in either run is left out), plus `all`: every common question
    of every dataset pooled. A common id whose question text differs is a ValueError: the
    runs were not made on the same data."""
    out: dict[str, Paired] = {}
    pooled_a: list[int] = []
    pooled_b: list[int] = []
    for name in records_a:
        if name not in records_b:
            continue
        by_id = {r.id: r for r in records_b[name] if r.stop_reason != "error"}
        em_a, em_b = [], []
        for record in records_a[name]:
            other = by_id.get(record.id)
            if other is None or record.stop_reason == "error":
                continue
            if other.question != record.question:
                raise ValueError(
                    f"{name}: question {record.id!r} differs between the runs "
                    f"({record.question[:60]!r} vs {other.question[:60]!r}); a paired "
                    "comparison needs both runs on the same data.")
            em_a.append(int(record.metrics["em"]))
            em_b.append(int(other.metrics["em"]))
        out[name] = paired(em_a, em_b)
        pooled_a += em_a
        pooled_b += em_b
    if len(out) > 1:
        out["all"] = paired(pooled_a, pooled_b)
    return out
