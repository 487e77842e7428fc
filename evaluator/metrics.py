"""Per-question answer scoring, exactly as Search-R1's qa_em (and SQuAD) define it.

Pure functions of strings: no I/O, no model, no records (`evaluator.rundir.Record` stores
what `score_prediction` returns; `evaluator.summary` averages them).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

METRIC_KEYS = ("em", "sub_em", "f1", "retrieval_recall")

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
