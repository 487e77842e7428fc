"""Answers with no model: what a question-answering benchmark gives away to retrieval alone.

    python -m benchmarks.title_rule                    # naturalqa dev, naturalqa test, vitalqa
    python -m benchmarks.title_rule --files a.jsonl b.jsonl [--json OUT]

Each question is searched once, word for word, with in-process BM25 (bm25s) on the embedded
corpus, and each rule reads only the top-1 document (also printed: how often the record's
supporting article is the top-1 document or among the top 3):
  top1_title       the title of the top-1 document;
  first_new_span   the first run of capitalised words in its text that the question does
                   not already contain (leading "The", "It", "In" ... dropped);
  title_or_span    the title, unless the question already names it (then first_new_span);
  by_question_word "when / what year" -> the first year in the text not in the question,
                   "how many / long / tall ..." -> the first number not in the question,
                   anything else -> title_or_span.
Scored with the evaluator's exact match (Search-R1's normalisation), per family
(`metadata.family` of each record) and overall. The span rules were adjusted once on
naturalqa dev predictions only (a run closes at a comma, colon or bracket; nationality
adjectives such as "Italian" are skipped); test and vitalqa were not looked at for that.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from evaluator.benchmarks import Question, question_from_record, read_data_file  # noqa: E402
from evaluator.metrics import exact_match, normalize_answer  # noqa: E402
from retriever.doc import Doc, split_title  # noqa: E402

DEFAULT_FILES = (ROOT / "assets" / "naturalqa" / "dev.jsonl",
                 ROOT / "assets" / "naturalqa" / "test.jsonl",
                 ROOT / "assets" / "vitalqa" / "test.jsonl")

# Capitalised words that start sentences rather than names.
_LEADING = frozenset("""a an the it its in on at as by for from with after before during
since this that these those he she his her they their there here when while although
however some many most one two""".split())
# Lower-case words allowed inside a name ("Leonardo da Vinci", "Republic of Genoa").
_JOINERS = frozenset({"of", "de", "da", "del", "der", "van", "von", "la", "le", "du", "y",
                      "and", "&"})
# A capitalised adjective of nationality ("the Italian artist") is not an answer.
_DEMONYM_ENDINGS = ("ian", "ish", "ese")
_DEMONYMS = frozenset({"american", "african", "european", "mexican", "korean", "dutch",
                       "french", "german", "greek", "roman", "soviet", "thai", "swiss"})
_OPENING = "(\"'‘“"
_CLOSING = ",;:)\"'’”!?"
_YEAR = re.compile(r"\b\d{3,4}(?: BC| AD| BCE| CE)?\b|\bAD \d{1,4}\b")
_NUMBER = re.compile(r"\b\d[\d,.]*\b|\b(?:two|three|four|five|six|seven|eight|nine|ten|"
                     r"eleven|twelve)\b", re.IGNORECASE)
_DATE_QUESTION = re.compile(r"^(when|what year|which year|in what year|in which year)\b|"
                            r"\b(year|date)\b", re.IGNORECASE)
_QUANTITY_QUESTION = re.compile(r"\bhow (many|much|long|tall|high|big|deep|old|far|wide)\b",
                                re.IGNORECASE)


def _text(doc: Doc) -> str:
    return split_title(doc.contents)[1]


def _in_question(candidate: str, question: str) -> bool:
    words = normalize_answer(candidate).split()
    asked = set(normalize_answer(question).split())
    return bool(words) and all(w in asked for w in words)


def _is_demonym(span: str) -> bool:
    word = span.lower()
    return " " not in word and (word in _DEMONYMS or word.endswith(_DEMONYM_ENDINGS))


def capitalised_spans(text: str) -> list[str]:
    """Runs of capitalised words (joined by "of", "da", "van" ...) within a clause: a comma,
    colon, bracket or sentence end closes a run; sentence openers and nationality adjectives
    are dropped."""
    spans: list[str] = []
    current: list[str] = []

    def close() -> None:
        while current and current[-1].lower() in _JOINERS:
            current.pop()
        if current and not _is_demonym(" ".join(current)):
            spans.append(" ".join(current))
        current.clear()

    for token in text.split():
        opens = token[:1] in _OPENING
        word = token.strip(_OPENING + _CLOSING)
        ends_clause = token[-1:] in _CLOSING or (token.endswith(".") and len(word) > 2)
        bare = word.rstrip(".")
        if opens:
            close()
        if bare[:1].isupper() and not (not current and bare.lower() in _LEADING):
            current.append(bare)
        elif current and bare.lower() in _JOINERS:
            current.append(bare)
        else:
            close()
        if ends_clause:
            close()
    close()
    return spans


def top1_title(question: str, doc: Doc) -> str:
    return doc.title


def first_new_span(question: str, doc: Doc) -> str:
    return next((s for s in capitalised_spans(_text(doc)) if not _in_question(s, question)), "")


def title_or_span(question: str, doc: Doc) -> str:
    return first_new_span(question, doc) if _in_question(doc.title, question) else doc.title


def by_question_word(question: str, doc: Doc) -> str:
    pattern = (_YEAR if _DATE_QUESTION.search(question)
               else _NUMBER if _QUANTITY_QUESTION.search(question) else None)
    if pattern is None:
        return title_or_span(question, doc)
    found = (m.group(0) for m in pattern.finditer(_text(doc)))
    return next((f for f in found if not _in_question(f, question)), "")


RULES: dict[str, Callable[[str, Doc], str]] = {
    "top1_title": top1_title, "first_new_span": first_new_span,
    "title_or_span": title_or_span, "by_question_word": by_question_word,
}


def score(questions: list[Question], top1: list[Doc | None]) -> dict[str, dict[str, float]]:
    """{rule: {family: EM, ..., "all": EM}}; a question with no document scores 0."""
    result = {}
    for name, rule in RULES.items():
        hits: dict[str, list[int]] = defaultdict(list)
        for question, doc in zip(questions, top1, strict=True):
            answer = rule(question.question, doc) if doc is not None else None
            em = exact_match(answer, question.golden_answers)
            hits[str(question.metadata.get("family", "-"))].append(em)
            hits["all"].append(em)
        result[name] = {family: sum(v) / len(v) for family, v in hits.items()}
    return result


def supports(question: Question) -> set[str]:
    """Titles of the articles a record names as its support (naturalqa) or source (vitalqa)."""
    meta = question.metadata
    return {meta["support"]} if "support" in meta else set(meta.get("articles") or ())


def support_found(questions: list[Question], ranked: list[list[Doc]]) -> dict[str, float]:
    """Share of questions whose supporting article is the top-1 document / in the top 3."""
    found = [(bool(docs) and docs[0].title in supports(q),
              any(d.title in supports(q) for d in docs[:3]))
             for q, docs in zip(questions, ranked, strict=True)]
    return {"top1": sum(f[0] for f in found) / len(found),
            "top3": sum(f[1] for f in found) / len(found)}


def load(path: Path) -> list[Question]:
    return [question_from_record(record, path.stem, i, where)
            for i, (where, record) in enumerate(read_data_file(path))]


def print_table(label: str, questions: list[Question], table: dict[str, dict[str, float]]):
    counts: dict[str, int] = defaultdict(int)
    for q in questions:
        counts[str(q.metadata.get("family", "-"))] += 1
    families = sorted(counts) + ["all"]
    counts["all"] = len(questions)
    print(f"\n{label}")
    print(f"{'rule':<18}" + "".join(f"{f[:11]:>12}" for f in families))
    print(f"{'(questions)':<18}" + "".join(f"{counts[f]:>12}" for f in families))
    for rule, row in table.items():
        print(f"{rule:<18}" + "".join(f"{row.get(f, 0.0):>12.3f}" for f in families))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", nargs="+", type=Path, default=list(DEFAULT_FILES),
                        help="benchmark files (.jsonl records with metadata.family)")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    if args.json is not None and not args.json.parent.is_dir():
        parser.error(f"--json: folder {args.json.parent} does not exist")

    from retriever.engine import open_engine

    engine = open_engine("bm25s", "default")
    figures = {}
    for path in args.files:
        questions = load(path)
        ranked = engine.search([q.question for q in questions], 3)
        label = f"{path.parent.name}/{path.name}"
        figures[label] = score(questions, [docs[0] if docs else None for docs in ranked])
        print_table(label, questions, figures[label])
        if any(supports(q) for q in questions):
            figures[label]["support_found"] = found = support_found(questions, ranked)
            print(f"supporting article: top-1 {found['top1']:.3f}, top-3 {found['top3']:.3f}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
