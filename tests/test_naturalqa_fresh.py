"""naturalqa fresh: a third hand-written split, read once per pre-registered attempt, about
facts that no dev or test question asks."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from evaluator.metrics import normalize_answer
from retriever.doc import Doc

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "assets" / "naturalqa"
FAMILIES = ("person", "place", "date", "number", "thing", "title")


def _records(split: str) -> list[dict]:
    lines = (DATA / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def readme_table_row(name: str) -> dict[str, int]:
    """The counts in the README table row of `name` (`questions` and each family)."""
    lines = (DATA / "README.md").read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == f"`{name}`":
            header = next(lines[i] for i in range(n - 1, -1, -1)
                          if lines[i].lstrip().startswith("| file"))
            keys = [c.strip() for c in header.strip().strip("|").split("|")][1:]
            return dict(zip(keys, (int(c) for c in cells[1:]), strict=True))
    raise AssertionError(f"no README table row for {name}")


def _key(question: str) -> str:
    """A question lowercased, punctuation stripped, whitespace collapsed."""
    return " ".join(re.sub(r"[^\w\s]", "", question.lower()).split())


@pytest.fixture(scope="module")
def fresh() -> list[dict]:
    return _records("fresh")


@pytest.fixture(scope="module")
def judged() -> list[dict]:
    """dev and test, both spent as a judge."""
    return _records("dev") + _records("test")


@pytest.fixture(scope="module")
def articles(default_corpus) -> dict[str, str]:
    """Title -> text of every article of the embedded corpus."""
    from retriever.corpus import iter_records

    return {doc.title: doc.contents.partition("\n")[2]
            for doc in (Doc(r["id"], r["contents"]) for r in iter_records(default_corpus))}


def unsupported(records: list[dict], articles: dict[str, str]) -> list[str]:
    """Ids of records whose support article is missing, or whose text holds none of their
    answers as written (case-insensitive) or none after Search-R1's normalisation."""
    bad = []
    for record in records:
        text = articles.get(record["metadata"]["support"], "")
        literal = any(a.lower() in text.lower() for a in record["golden_answers"])
        normal = normalize_answer(text)
        normalised = any(normalize_answer(a) and normalize_answer(a) in normal
                         for a in record["golden_answers"])
        if not text or not (literal and normalised):
            bad.append(record["id"])
    return bad


def test_records_are_well_formed(fresh):
    assert len(fresh) >= 150
    assert [r["id"] for r in fresh] == [f"naturalqa-fresh-{i}" for i in range(len(fresh))]
    for r in fresh:
        assert set(r) == {"id", "question", "golden_answers", "metadata"}, r["id"]
        assert isinstance(r["question"], str) and r["question"].strip() == r["question"]
        assert r["question"], r["id"]
        answers = r["golden_answers"]
        assert answers and all(isinstance(a, str) and a.strip() == a and a for a in answers)
        assert len(set(answers)) == len(answers), r["id"]
        assert all(len(a) <= 60 for a in answers), r["id"]  # short, as naturalqa's are
        meta = r["metadata"]
        assert set(meta) == {"family", "support", "answer_is_title"}, r["id"]
        assert meta["family"] in FAMILIES, r["id"]
        assert isinstance(meta["support"], str) and meta["support"], r["id"]
        assert meta["answer_is_title"] == (meta["family"] == "title"), r["id"]
        support = normalize_answer(meta["support"].split(" (")[0])
        names_support = support in {normalize_answer(a) for a in answers}
        assert names_support == meta["answer_is_title"], r["id"]


def test_every_answer_occurs_in_its_supporting_article(fresh, articles):
    missing = sorted({r["metadata"]["support"] for r in fresh} - set(articles))
    assert missing == []
    assert unsupported(fresh, articles) == []


def test_an_answer_missing_from_its_article_is_caught(fresh, articles):
    record = fresh[0]
    assert unsupported([record], articles) == []
    assert unsupported([{**record, "golden_answers": ["Rembrandt"]}], articles) == [record["id"]]
    elsewhere = {**record, "metadata": {**record["metadata"], "support": "No Such Article"}}
    assert unsupported([elsewhere], articles) == [record["id"]]


def test_families_are_what_the_readme_table_says(fresh, judged):
    row = readme_table_row("fresh.jsonl")
    mix = Counter(r["metadata"]["family"] for r in fresh)
    assert row == {"questions": len(fresh), **{f: mix[f] for f in FAMILIES}}
    assert sum(mix.values()) == len(fresh) and set(mix) <= set(FAMILIES)
    # in naturalqa's proportions: each family within 3 points of its dev + test share
    before = Counter(r["metadata"]["family"] for r in judged)
    for family in FAMILIES:
        assert abs(mix[family] / len(fresh) - before[family] / len(judged)) <= 0.03, family


def test_no_fresh_question_repeats_dev_or_test(fresh, judged):
    keys = [_key(r["question"]) for r in fresh]
    assert len(set(keys)) == len(keys)
    assert not set(keys) & {_key(r["question"]) for r in judged}
    assert _key("Who painted the Mona Lisa?") == _key("who painted the mona lisa")


def test_no_fresh_fact_is_a_dev_or_test_fact(fresh, judged):
    """No (support, answer) pair of fresh is one of dev or test, and few support articles
    are shared at all."""
    def pairs(records):
        return {(r["metadata"]["support"], normalize_answer(a))
                for r in records for a in r["golden_answers"]}

    assert not pairs(fresh) & pairs(judged)
    fresh_support = {r["metadata"]["support"] for r in fresh}
    shared = fresh_support & {r["metadata"]["support"] for r in judged}
    assert len(shared) <= 0.3 * len(fresh_support)
