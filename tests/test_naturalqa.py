"""naturalqa: hand-written questions whose golden answers occur in their supporting article."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from evaluator.metrics import normalize_answer
from retriever.doc import Doc

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "assets" / "naturalqa"
SPLITS = ("dev", "test")
FAMILIES = {"person", "place", "date", "number", "thing", "title"}


def _records(split: str) -> list[dict]:
    lines = (DATA / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _title_rule():
    spec = importlib.util.spec_from_file_location("title_rule", ROOT / "benchmarks" /
                                                  "title_rule.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def splits() -> dict[str, list[dict]]:
    return {split: _records(split) for split in SPLITS}


@pytest.fixture(scope="module")
def articles(default_corpus) -> dict[str, str]:
    """Title -> text of every article of the embedded corpus."""
    from retriever.corpus import iter_records

    return {doc.title: doc.contents.partition("\n")[2]
            for doc in (Doc(r["id"], r["contents"]) for r in iter_records(default_corpus))}


def unsupported(records: list[dict], articles: dict[str, str]) -> list[str]:
    """Ids of records whose support article is missing or holds none of their answers."""
    bad = []
    for record in records:
        text = normalize_answer(articles.get(record["metadata"]["support"], ""))
        answers = [normalize_answer(a) for a in record["golden_answers"]]
        if not text or not any(a and a in text for a in answers):
            bad.append(record["id"])
    return bad


def test_records_are_well_formed(splits):
    everything = splits["dev"] + splits["test"]
    assert len(everything) >= 150
    assert len({r["id"] for r in everything}) == len(everything)
    for split, records in splits.items():
        for r in records:
            assert r["id"].startswith(f"naturalqa-{split}-")
            assert r["question"].strip() and r["golden_answers"]
            assert all(isinstance(a, str) and a.strip() for a in r["golden_answers"])
            meta = r["metadata"]
            assert meta["family"] in FAMILIES, r["id"]
            assert isinstance(meta["answer_is_title"], bool)
            assert meta["answer_is_title"] == (meta["family"] == "title"), r["id"]


def test_splits_are_disjoint_and_balanced(splits):
    dev = {normalize_answer(r["question"]) for r in splits["dev"]}
    test = {normalize_answer(r["question"]) for r in splits["test"]}
    assert len(dev) == len(splits["dev"]) and len(test) == len(splits["test"])
    assert not dev & test
    assert 0.25 <= len(dev) / (len(dev) + len(test)) <= 0.4
    dev_mix = Counter(r["metadata"]["family"] for r in splits["dev"])
    test_mix = Counter(r["metadata"]["family"] for r in splits["test"])
    for family in FAMILIES:
        share = dev_mix[family] / (dev_mix[family] + test_mix[family])
        assert 0.2 <= share <= 0.45, (family, dev_mix, test_mix)


def test_title_answers_are_at_most_a_quarter(splits):
    everything = splits["dev"] + splits["test"]
    titled = sum(r["metadata"]["answer_is_title"] for r in everything)
    assert titled / len(everything) <= 0.25
    for r in everything:  # the flag says what the answers are
        support = normalize_answer(r["metadata"]["support"].split(" (")[0])
        names_support = support in {normalize_answer(a) for a in r["golden_answers"]}
        assert names_support == r["metadata"]["answer_is_title"], r["id"]


def test_every_answer_occurs_in_its_supporting_article(splits, articles):
    for records in splits.values():
        assert unsupported(records, articles) == []


def test_an_answer_missing_from_its_article_is_caught(splits, articles):
    record = dict(splits["dev"][0])
    assert unsupported([record], articles) == []
    record["golden_answers"] = ["Rembrandt"]
    assert unsupported([record], articles) == [record["id"]]
    record = {**splits["dev"][0], "metadata": {**splits["dev"][0]["metadata"],
                                              "support": "No Such Article"}}
    assert unsupported([record], articles) == [record["id"]]


def test_capitalised_spans_read_names_not_openers_or_nationalities():
    rule = _title_rule()
    text = ("The Mona Lisa is a portrait painting by the Italian artist Leonardo da Vinci. "
            "It is held in Paris, France.")
    assert rule.capitalised_spans(text) == ["Mona Lisa", "Leonardo da Vinci", "Paris", "France"]
    doc = Doc("0", f'"Mona Lisa"\n{text}')
    assert rule.top1_title("Who painted the Mona Lisa?", doc) == "Mona Lisa"
    assert rule.first_new_span("Who painted the Mona Lisa?", doc) == "Leonardo da Vinci"
    assert rule.title_or_span("Who painted the Mona Lisa?", doc) == "Leonardo da Vinci"
    assert rule.title_or_span("a portrait by Leonardo", doc) == "Mona Lisa"
    dated = Doc("1", '"Magna Carta"\nMagna Carta was sealed by King John on 15 June 1215.')
    assert rule.by_question_word("what year was magna carta", dated) == "1215"


def test_the_title_rule_does_not_solve_naturalqa(splits, bm25s_engine):
    """The top-1 title is right only where the answer is an article's title: far below what
    it scores on title-answer benchmarks."""
    from evaluator.benchmarks import question_from_record

    rule = _title_rule()
    questions = [question_from_record(r, "naturalqa", i) for i, r in enumerate(splits["test"])]
    top1 = [docs[0] if docs else None
            for docs in bm25s_engine.search([q.question for q in questions], 1)]
    table = rule.score(questions, top1)
    assert table["top1_title"]["all"] < 0.2
    assert table["top1_title"]["title"] > 0.3
