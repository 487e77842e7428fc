"""Scoring rules (Search-R1 qa_em / SQuAD) and aggregation."""

from __future__ import annotations

import re

import numpy as np
import pytest

from agent.events import Finished, Segment
from agent.protocol import answer_of, extract_answer
from evaluator.benchmarks import Question
from evaluator.metrics import (
    exact_match,
    golden_list,
    normalize_answer,
    retrieval_recall,
    sub_exact_match,
    token_f1,
)
from evaluator.rundir import Record, make_record
from evaluator.summary import aggregate, summarize


def score_question(response: str, golden, docs: list[str]) -> dict[str, float]:
    """The metrics of the record made for a run that wrote `response` after a prompt: the
    `<information>` blocks in it are inserted text, the rest the model's turns."""
    pieces = [p for p in re.split(r"(\n\n<information>.*?</information>\n\n)", response,
                                  flags=re.DOTALL) if p]
    segments = (Segment("PROMPT", False),
                *(Segment(p, not p.startswith("\n\n<information>")) for p in pieces))
    finished = Finished("answer", 1, 0, 0, 0.0, "PROMPT" + response, "PROMPT",
                        answer=answer_of(s.text for s in segments if s.generated),
                        retrieved=list(docs), segments=segments)
    return make_record(Question("q", "nq", "q?", golden_list(golden)), finished).metrics


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Beatles", "beatles"),
        ("a cat and an apple", "cat and apple"),
        ("Theatre", "theatre"),  # articles only as whole words
        ("Anne the Great", "anne great"),
        ("U.S.A.", "usa"),
        ("rock-'n'-roll!", "rocknroll"),
        ("  lots \t of\n\nspace  ", "lots of space"),
        ("THE END", "end"),
        ("", ""),
        ("the", ""),
        ("Zürich", "zürich"),  # unicode letters survive
        ("Ångström", "ångström"),
        ("“quoted” – dash", "“quoted” – dash"),  # non-ASCII punctuation is not removed
        ("a.b", "ab"),  # punctuation goes before articles: "a.b" is not the article a
        ("the-the", "thethe"),
    ],
)
def test_normalize_answer(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_golden_list_shapes() -> None:
    assert golden_list("Paris") == ["Paris"]
    assert golden_list(["a", "b"]) == ["a", "b"]
    assert golden_list(("a",)) == ["a"]
    assert golden_list(np.array(["x", "y"], dtype=object)) == ["x", "y"]
    assert golden_list(None) == []


def test_exact_match() -> None:
    assert exact_match("The Eiffel Tower.", ["eiffel tower"]) == 1
    assert exact_match("Eiffel", ["eiffel tower"]) == 0
    assert exact_match("Paris", "paris") == 1  # a string golden answer
    assert exact_match("London", ["Paris", "London"]) == 1
    assert exact_match("London", np.array(["Paris", "London"])) == 1
    assert exact_match("", [""]) == 1
    assert exact_match(None, ["Paris"]) == 0
    assert exact_match("Paris", []) == 0


def test_sub_exact_match_is_plain_substring() -> None:
    assert sub_exact_match("It is Paris, France", ["paris"]) == 1
    assert sub_exact_match("business", ["US"]) == 1  # Search-R1's subem_check is a substring
    assert sub_exact_match("Lyon", ["paris"]) == 0
    assert sub_exact_match(None, ["paris"]) == 0
    assert sub_exact_match("paris", "Paris") == 1


def test_token_f1() -> None:
    assert token_f1("Eiffel Tower", ["the eiffel tower"]) == 1.0
    assert token_f1("eiffel", ["eiffel tower"]) == pytest.approx(2 / 3)
    assert token_f1("big red dog", ["red", "big red dog house"]) == pytest.approx(6 / 7)
    assert token_f1("cat", ["dog"]) == 0.0
    assert token_f1(None, ["dog"]) == 0.0
    assert token_f1("", ["dog"]) == 0.0
    assert token_f1("dog", []) == 0.0
    assert token_f1("a", ["the"]) == 0.0  # both normalise to nothing


def test_retrieval_recall() -> None:
    docs = ['"Paris"\nParis is the capital of France.', '"Lyon"\nLyon is a city.']
    assert retrieval_recall(["paris"], docs) == 1
    assert retrieval_recall("The Capital", docs) == 1
    assert retrieval_recall(["Marseille"], docs) == 0
    assert retrieval_recall(["us"], ["business plans"]) == 0  # word-bounded, unlike sub-EM
    assert retrieval_recall(["the"], docs) == 0  # empty after normalising: never a hit
    assert retrieval_recall(["paris"], []) == 0


def test_extract_answer_corner_cases() -> None:
    assert extract_answer("<answer> one </answer> then <answer>two</answer>") == "two"
    assert extract_answer("<think>hmm</think> no tag") is None
    assert extract_answer("<answer>\nmulti\nline\n</answer>") == "multi\nline"
    # Documents are inserted text: only the model's turns are searched (answer_of).
    doc_tag = "\n\n<information>Doc 1(Title: x) <answer>trap</answer></information>\n\n"
    assert answer_of(["<search>q</search>", " done"]) is None
    assert score_question(f"<search>q</search>{doc_tag} done", ["trap"], [])["em"] == 0
    assert score_question(f"<search>q</search>{doc_tag}<answer> real </answer>", ["real"],
                          [])["em"] == 1


def test_score_question_uses_last_answer_and_ignores_documents() -> None:
    response = (
        "<think>x</think><search>capital of france</search>\n\n"
        "<information>Doc 1(Title: \"Q\") <answer>Lyon</answer></information>\n\n"
        "<answer>Lyon</answer> wait <answer>The Paris</answer>"
    )
    docs = ['"Paris"\nParis is the capital.']
    assert score_question(response, ["Paris"], docs) == {
        "em": 1, "sub_em": 1, "f1": 1.0, "retrieval_recall": 1
    }


def test_no_answer_scores_zero_everywhere_but_recall() -> None:
    scores = score_question("<think>no idea</think>", "Paris", ["nothing relevant"])
    assert scores == {"em": 0, "sub_em": 0, "f1": 0.0, "retrieval_recall": 0}
    # retrieval recall is about the documents, not the answer
    assert score_question("", ["Paris"], ["Paris!"])["retrieval_recall"] == 1


def _record(em: int, **extra: object) -> Record:
    fields = {
        "id": "q", "dataset": "nq", "question": "q?", "golden_answers": ["x"],
        "prediction": "x" if em else None,
        "metrics": {"em": em, "sub_em": em, "f1": float(em), "retrieval_recall": 1},
        "answered": bool(em), "failure": None if em else "no_answer",
        "searches": 2, "turns": 3, "invalid_actions": 0, "new_tokens": 100, "seconds": 1.5,
        "stop_reason": "answer" if em else "eos",
    }
    fields.update(extra)
    return Record(**fields)


def test_aggregate() -> None:
    records = [_record(1), _record(0), _record(0, failure="max_turns", searches=4), _record(1)]
    stats = aggregate(records)
    assert stats["n"] == 4
    assert stats["em"] == 0.5
    assert stats["answered"] == 0.5
    assert stats["searches"] == 2.5
    assert stats["new_tokens"] == 100
    assert stats["failures"] == {"max_turns": 1, "no_answer": 1}


def test_aggregate_empty() -> None:
    stats = aggregate([])
    assert stats["n"] == 0 and stats["em"] is None and stats["failures"] == {}


def test_summarize_macro_and_domains() -> None:
    by_dataset = {
        "nq": [_record(1), _record(1)],  # 1.0
        "hotpotqa": [_record(0), _record(1)],  # 0.5
        "bamboogle": [_record(0), _record(0), _record(0), _record(1)],  # 0.25
    }
    summary = summarize(by_dataset)
    assert summary["datasets"]["nq"]["em"] == 1.0
    assert summary["macro"]["em"] == pytest.approx((1.0 + 0.5 + 0.25) / 3)  # unweighted
    assert summary["macro"]["n"] == 8
    assert summary["in_domain"]["datasets"] == ["nq", "hotpotqa"]
    assert summary["in_domain"]["em"] == 0.75
    assert summary["out_of_domain"]["datasets"] == ["bamboogle"]
    assert summary["out_of_domain"]["em"] == 0.25


def test_summarize_absent_domain() -> None:
    summary = summarize({"nq": [_record(1)]})
    assert summary["out_of_domain"]["datasets"] == []
    assert summary["out_of_domain"]["em"] is None
