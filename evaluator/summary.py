"""A run's records summed up: per-dataset means of the metrics and costs with their
standard errors (`<key>_se`, as `evaluator.stats` computes them), failure counts, and
unweighted averages over datasets (macro, in-domain, out-of-domain).

Pure functions over `Record`s: no I/O (the run directory is `evaluator.rundir`'s).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from evaluator.benchmarks import IN_DOMAIN, OUT_OF_DOMAIN
from evaluator.metrics import METRIC_KEYS
from evaluator.rundir import Record
from evaluator.stats import average_se, metric_se

# Per-question counters averaged per dataset, keyed by their record field.
COST_KEYS = ("searches", "turns", "invalid_actions", "new_tokens", "seconds")


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def errored(record: Record) -> bool:
    """The question ended in an error (retriever or model server down): not an answer to
    score, but a question still to run (resuming retries it)."""
    return record.stop_reason == "error"


def aggregate(records: Sequence[Record]) -> dict[str, Any]:
    """Per-dataset means of the metrics and costs (each with `<key>_se`, its standard error),
    the answered rate and failure counts.

    Errored questions are not scored: `n` counts the scored ones, `errored` the others, and
    `first_error` is the first errored question's message (None when none errored).
    """
    scored = [r for r in records if not errored(r)]
    failed = [r for r in records if errored(r)]
    out: dict[str, Any] = {"n": len(scored), "errored": len(failed),
                           "first_error": next((r.error or "no message" for r in failed), None)}
    values = {key: [float(r.metrics[key]) for r in scored] for key in METRIC_KEYS}
    values["answered"] = [float(r.answered) for r in scored]
    values.update({key: [float(getattr(r, key) or 0) for r in scored] for key in COST_KEYS})
    for key, column in values.items():
        out[key] = _mean(column)
        out[f"{key}_se"] = metric_se(key, column)
    failures = Counter(r.failure for r in scored if r.failure)
    out["failures"] = dict(sorted(failures.items()))
    return out


AVERAGE_KEYS = (*METRIC_KEYS, "answered", *COST_KEYS)


def average(per_dataset: Mapping[str, Mapping[str, Any]], names: Iterable[str]) -> dict[str, Any]:
    """Unweighted mean over the named datasets that are present (each set counts once), and
    its standard error from theirs (`evaluator.stats.average_se`)."""
    present = [name for name in names if name in per_dataset and per_dataset[name]["n"]]
    out: dict[str, Any] = {"datasets": present, "n": sum(per_dataset[d]["n"] for d in present),
                           "errored": sum(per_dataset[d].get("errored", 0) for d in names
                                          if d in per_dataset)}
    for key in AVERAGE_KEYS:
        values = [per_dataset[d][key] for d in present if per_dataset[d][key] is not None]
        out[key] = _mean(values)
        out[f"{key}_se"] = average_se([per_dataset[d].get(f"{key}_se") for d in present])
    return out


def summarize(records_by_dataset: Mapping[str, Sequence[Record]]) -> dict[str, Any]:
    """Per-dataset aggregates plus macro, in-domain and out-of-domain averages."""
    per_dataset = {name: aggregate(recs) for name, recs in records_by_dataset.items()}
    return {
        "datasets": per_dataset,
        "macro": average(per_dataset, per_dataset),
        "in_domain": average(per_dataset, IN_DOMAIN),
        "out_of_domain": average(per_dataset, OUT_OF_DOMAIN),
    }
