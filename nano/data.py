"""The nano agent's question sets: training questions and the held-out `vitalqa` benchmark.

Deterministic: the split is a hash of each article's title and every random choice is
seeded from the question's own id, so the same corpus always gives the same files.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

from evaluator.benchmarks import (
    Question,
    local_benchmark_file,
    local_candidates,
    question_from_record,
)
from nano.questions import (
    Article,
    GeneratedQuestion,
    articles_from_records,
    cloze_questions,
    definition_question,
    description_of,
    description_question,
    held_out,
    phrase,
    reading_facts,
    reformulations_for,
    span_facts,
    stable_int,
    superlative_questions,
)

BENCHMARK_NAME = "vitalqa"  # the evaluator knows it by this name (LOCAL_BENCHMARKS)
# Held-out questions per family in the benchmark (the rest of the held-out pool is unused).
CLOZE_COPIES = 1
BENCHMARK_CAPS = {"definition": 120, "description": 100, "span": 120, "twohop": 60}


def _rng(key: str) -> random.Random:
    return random.Random(stable_int(key))


def _title_answers(article: Article) -> tuple[str, ...]:
    return tuple(dict.fromkeys([article.name, article.title]))


def questions_for(article: Article, copies: int = 1) -> list[GeneratedQuestion]:
    """All questions about one article, `copies` phrasings of each."""
    out: list[GeneratedQuestion] = []
    phrasings = superlative_questions(article)
    for copy in range(copies):
        key = f"{article.id}:{copy}"
        if text := definition_question(article, _rng("def" + key)):
            out.append(GeneratedQuestion(
                f"definition-{article.id}-{copy}", phrase(text, _rng("p" + key)),
                _title_answers(article), "definition", (article.title,),
                reformulations=reformulations_for(text)))
        if text := description_question(article):
            out.append(GeneratedQuestion(
                f"description-{article.id}-{copy}", phrase(text, _rng("pd" + key)),
                _title_answers(article), "description", (article.title,),
                reformulations=reformulations_for(text)))
        if phrasings:
            text = phrasings[(stable_int("sup:" + article.id) + copy) % len(phrasings)]
            out.append(GeneratedQuestion(
                f"superlative-{article.id}-{copy}", phrase(text, _rng("pu" + key)),
                _title_answers(article), "superlative", (article.title,),
                reformulations=reformulations_for(text)))
        for n, (relation, text, answer) in enumerate(span_facts(article)):
            out.append(GeneratedQuestion(
                f"span-{article.id}-{n}-{copy}", phrase(text, _rng(f"ps{n}" + key)),
                (answer,), "span", (article.title,), relation,
                reformulations=reformulations_for(text, article.name)))
            description = description_of(article)
            if description and answer.lower() not in description.lower():
                hop = text.replace(article.name, description)
                out.append(GeneratedQuestion(
                    f"twohop-{article.id}-{n}-{copy}", phrase(hop, _rng(f"ph{n}" + key)),
                    (answer,), "twohop", (article.title,), relation, bridge=article.title,
                    second_query=text))
    return out


def reading_questions(article: Article, copies: int = 1) -> list[GeneratedQuestion]:
    """The `read` family: a span of the text that is not the title, asked a different way in
    each copy (`reading_facts`' templates in turn), and `cloze_questions` as they stand, at
    most CLOZE_COPIES times (they vary only in case and "?", and outnumber the rest)."""
    out: list[GeneratedQuestion] = []
    for n, (relation, templates, answer) in enumerate(reading_facts(article)):
        first = stable_int(f"template:{article.id}:{relation}")
        for copy in range(copies):
            text = templates[(first + copy) % len(templates)].format(s=article.name)
            out.append(GeneratedQuestion(
                f"read-{article.id}-{n}-{copy}", phrase(text, _rng(f"pr{n}:{article.id}:{copy}")),
                (answer,), "read", (article.title,), relation,
                reformulations=reformulations_for(text, article.name)))
    for n, (relation, text, answer) in enumerate(cloze_questions(article)):
        for copy in range(min(copies, CLOZE_COPIES)):
            out.append(GeneratedQuestion(
                f"read-{article.id}-c{n}-{copy}", phrase(text, _rng(f"pc{n}:{article.id}:{copy}")),
                (answer,), "read", (article.title,), relation,
                reformulations=reformulations_for(text, article.name)))
    return out


def taught_answers(article: Article) -> frozenset[str]:
    """The answers (normalised as EM compares them) of every span the generator asks about
    `article`: its reading facts, cloze sentences and span facts. A benchmark question whose
    golden answer is among them asks a relation the training data teaches."""
    from evaluator.metrics import normalize_answer

    spans = ([answer for _, _, answer in reading_facts(article)]
             + [answer for _, _, answer in cloze_questions(article)]
             + [answer for _, _, answer in span_facts(article)])
    return frozenset(normalize_answer(a) for a in spans)


def build_questions(records: list[dict], train_copies: int = 2,
                    exclude: frozenset[str] = frozenset()
                    ) -> tuple[list[GeneratedQuestion], list[GeneratedQuestion]]:
    """(training questions, held-out pool): no held-out article in any training question,
    and no article titled in `exclude` (another benchmark's supporting articles) in training."""
    articles = articles_from_records(records)
    train, held = [], []
    for article in articles:
        if held_out(article.title):
            held.extend(questions_for(article, 1))
        elif article.title not in exclude:
            train.extend(questions_for(article, train_copies))
            train.extend(reading_questions(article, train_copies))
    return train, held


def benchmark_support(directory: Path) -> frozenset[str]:
    """The titles a benchmark's questions are answered from (`metadata.support` of every
    record in DIR/*.jsonl), kept out of the training questions."""
    titles = set()
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip() and (support := json.loads(line).get("metadata", {}).get("support")):
                titles.add(support)
    return frozenset(titles)


def benchmark_questions(held: list[GeneratedQuestion]) -> list[GeneratedQuestion]:
    """A fixed sample of the held-out pool, capped per family, in a stable order."""
    out = []
    for family, cap in BENCHMARK_CAPS.items():
        pool = sorted((q for q in held if q.family == family), key=lambda q: stable_int(q.id))
        out.extend(pool[:cap])
    return out


def benchmark_path(directory: Path) -> Path:
    """Where the evaluator looks for vitalqa first under `directory` (DIR/vitalqa/test.jsonl)."""
    return local_candidates(directory, BENCHMARK_NAME)[0]


def shipped_benchmark() -> Path:
    """The vitalqa file shipped with the repository, where the evaluator loads it from."""
    return local_benchmark_file(BENCHMARK_NAME)


def benchmark_question(q: GeneratedQuestion) -> Question:
    """A generated question as a benchmark question, the family and articles in metadata."""
    return Question(id=q.id, dataset=BENCHMARK_NAME, question=q.question,
                    golden_answers=list(q.answers),
                    metadata={"family": q.family, "articles": list(q.articles),
                              "relation": q.relation})


def read_human(path: Path) -> list[Question]:
    """The hand-written questions (family `human`), kept in their own file."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [question_from_record(json.loads(line), BENCHMARK_NAME, n, f"{path}:{n + 1}")
            for n, line in enumerate(lines)]


def as_record(question: Question) -> dict:
    """FlashRAG's record format (the dataset is the file's place, not a field)."""
    return {"id": question.id, "question": question.question,
            "golden_answers": question.golden_answers, "metadata": question.metadata}


def write_benchmark(questions: list[Question], path: Path) -> Counter:
    """Write `vitalqa` as JSON lines; returns the count per family."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(as_record(q), ensure_ascii=False) + "\n"
                           for q in questions), encoding="utf-8")
    tmp.replace(path)
    return Counter(q.metadata["family"] for q in questions)
