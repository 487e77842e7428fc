"""Answer scoring and aggregation, exactly as Search-R1's qa_em (and SQuAD) define them.

Pure functions: no I/O, no model. A result record is `evaluator.rundir.Record` (its
metrics computed once, when it is made); aggregation turns lists of them into plain dicts.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from evaluator.benchmarks import IN_DOMAIN, OUT_OF_DOMAIN

if TYPE_CHECKING:
    from evaluator.rundir import Record

METRIC_KEYS = ("em", "sub_em", "f1", "retrieval_recall")
# Per-question counters averaged per dataset, keyed by their record field.
COST_KEYS = ("searches", "turns", "invalid_actions", "new_tokens", "seconds")
# Why a scored question has no right answer; an errored question is counted apart (`errored`).
FAILURE_REASONS = ("no_answer", "max_turns", "invalid_action", "context_full")

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lowercase, drop ASCII punctuation, drop a/an/the, collapse whitespace (SQuAD order)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES_RE.sub(" ", text)
    return " ".join(text.split())


def golden_list(golden_answers: Any) -> list[str]:
    """Golden answers as a list of strings: accepts a string, a list/tuple or a numpy array."""
    if golden_answers is None:
        return []
    if isinstance(golden_answers, str):
        return [golden_answers]
    # numpy arrays (what parquet gives back) and any other iterable of answers
    return [str(answer) for answer in golden_answers]


def exact_match(prediction: str | None, golden_answers: Any) -> int:
    """1 when the normalised prediction equals any normalised golden answer."""
    if prediction is None:
        return 0
    pred = normalize_answer(prediction)
    return int(any(pred == normalize_answer(g) for g in golden_list(golden_answers)))


def sub_exact_match(prediction: str | None, golden_answers: Any) -> int:
    """1 when any normalised golden answer is a substring of the normalised prediction.

    A plain substring test, as Search-R1's subem_check does (so "us" matches "business").
    """
    if prediction is None:
        return 0
    pred = normalize_answer(prediction)
    return int(any(normalize_answer(g) in pred for g in golden_list(golden_answers)))


def _f1(pred_tokens: Sequence[str], gold_tokens: Sequence[str]) -> float:
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str | None, golden_answers: Any) -> float:
    """SQuAD token F1 between prediction and golden answer, best over the golden answers."""
    if prediction is None:
        return 0.0
    pred_tokens = normalize_answer(prediction).split()
    scores = [_f1(pred_tokens, normalize_answer(g).split()) for g in golden_list(golden_answers)]
    return max(scores, default=0.0)


def retrieval_recall(golden_answers: Any, retrieved_docs: Iterable[str]) -> int:
    """1 when some normalised golden answer occurs in the normalised retrieved text.

    Matched on word boundaries (like FlashRAG's token-level has_answer) so that a short
    answer does not count as retrieved because it sits inside a longer word. Answers that
    normalise to nothing (e.g. "The") are skipped: they would match every document.
    """
    text = f" {normalize_answer(' '.join(retrieved_docs))} "
    answers = (normalize_answer(g) for g in golden_list(golden_answers))
    return int(any(f" {answer} " in text for answer in answers if answer))


def score_prediction(
    prediction: str | None, golden_answers: Any, retrieved_docs: Iterable[str] = ()
) -> dict[str, float]:
    """The four per-question metrics for an already extracted prediction (None: no tag)."""
    return {
        "em": exact_match(prediction, golden_answers),
        "sub_em": sub_exact_match(prediction, golden_answers),
        "f1": token_f1(prediction, golden_answers),
        "retrieval_recall": retrieval_recall(golden_answers, retrieved_docs),
    }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def errored(record: Record) -> bool:
    """The question ended in an error (retriever or model server down): not an answer to
    score, but a question still to run (resuming retries it)."""
    return record.stop_reason == "error"


def aggregate(records: Sequence[Record]) -> dict[str, Any]:
    """Per-dataset means of the metrics and costs, the answered rate and failure counts.

    Errored questions are not scored: `n` counts the scored ones, `errored` the others, and
    `first_error` is the first errored question's message (None when none errored).
    """
    scored = [r for r in records if not errored(r)]
    failed = [r for r in records if errored(r)]
    out: dict[str, Any] = {"n": len(scored), "errored": len(failed),
                           "first_error": next((r.error or "no message" for r in failed), None)}
    for key in METRIC_KEYS:
        out[key] = _mean([float(r.metrics[key]) for r in scored])
    out["answered"] = _mean([float(r.answered) for r in scored])
    for key in COST_KEYS:
        out[key] = _mean([float(getattr(r, key) or 0) for r in scored])
    failures = Counter(r.failure for r in scored if r.failure)
    out["failures"] = dict(sorted(failures.items()))
    return out


AVERAGE_KEYS = (*METRIC_KEYS, "answered", *COST_KEYS)


def average(per_dataset: Mapping[str, Mapping[str, Any]], names: Iterable[str]) -> dict[str, Any]:
    """Unweighted mean over the named datasets that are present (each set counts once)."""
    present = [name for name in names if name in per_dataset and per_dataset[name]["n"]]
    out: dict[str, Any] = {"datasets": present, "n": sum(per_dataset[d]["n"] for d in present),
                           "errored": sum(per_dataset[d].get("errored", 0) for d in names
                                          if d in per_dataset)}
    for key in AVERAGE_KEYS:
        values = [per_dataset[d][key] for d in present if per_dataset[d][key] is not None]
        out[key] = _mean(values)
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
