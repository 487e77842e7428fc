"""Scoring the nano agent on vitalqa (the benchmark and the tests share it): one question at
a time, as the UI runs it (per-question seconds mean something), or batched, as the
evaluator runs it (the same answers, several times faster)."""

from __future__ import annotations

import statistics
from collections import defaultdict

from agent.loop import AgentSettings, run_agent, run_agent_batch
from evaluator.benchmarks import LOCAL_BENCHMARKS, Question, load_local
from evaluator.metrics import exact_match, normalize_answer, retrieval_recall
from nano.data import BENCHMARK_NAME, taught_answers
from nano.questions import Article, stable_int
from retriever.doc import split_title

# What a run did, judged against what it retrieved: right, or which way it went wrong.
OUTCOMES = ("right", "answer not retrieved", "said a title", "copied another span",
            "wrote no span")


class EmptyRetriever:
    """A retriever with nothing in it: every search returns no documents."""

    def search(self, queries: list[str], topk: int = 3) -> list[list]:
        return [[] for _ in queries]


def fixed_sample(questions: list[Question], limit: int | None = None) -> list[Question]:
    """With a limit, a fixed sample spread over the families (a hash of each id), else all."""
    if not limit:
        return list(questions)
    return sorted(questions, key=lambda q: stable_int("sample:" + q.id))[:limit]


def vitalqa(limit: int | None = None) -> list[Question]:
    """The shipped benchmark through the evaluator's loader; with a limit, `fixed_sample`."""
    questions, _, _ = load_local(LOCAL_BENCHMARKS[BENCHMARK_NAME], BENCHMARK_NAME)
    return fixed_sample(questions, limit)


def run_one_by_one(questions: list[Question], backend, retriever,
                   settings: AgentSettings) -> list:
    """Finished runs in question order, one `run_agent` call each (as the UI runs them)."""
    out = []
    for question in questions:
        finished = None
        for event in run_agent(question.question, backend, retriever, settings):
            finished = event
        out.append(finished)
    return out


def run_batched(questions: list[Question], backend, retriever, settings: AgentSettings,
                batch_size: int = 16) -> list:
    """Finished runs in question order, `batch_size` questions per run_agent_batch call."""
    out: list = [None] * len(questions)
    for start in range(0, len(questions), batch_size):
        chunk = questions[start:start + batch_size]
        for i, run in run_agent_batch([q.question for q in chunk], backend, retriever,
                                      settings):
            out[start + i] = run
    return out


def outcome(question: Question, run) -> str:
    """One of OUTCOMES: a wrong answer is told apart by what the run retrieved (whole
    documents, matched as the evaluator's retrieval_recall matches): no golden answer in any
    of them (retrieval), the title of one of them (the shortcut), another span of them
    (misread), or none."""
    if exact_match(run.answer, question.golden_answers):
        return "right"
    if not retrieval_recall(question.golden_answers, run.retrieved):
        return "answer not retrieved"
    answer = normalize_answer(run.answer or "")
    if answer and answer in {normalize_answer(split_title(c)[0]) for c in run.retrieved}:
        return "said a title"
    return ("copied another span" if retrieval_recall(run.answer, run.retrieved)
            else "wrote no span")


def taught(questions: list[Question], articles: dict[str, Article]) -> list[bool]:
    """For each question, whether the training-data generator asks for one of its golden
    answers about the article the question names as its support (`metadata["support"]`, a
    title in `articles`): the answer is a span the data teaches the model to read there (by
    any relation or cloze sentence, not always the one asked). False without a support
    article."""
    out = []
    for question in questions:
        article = articles.get(str(question.metadata.get("support", "")))
        golden = {normalize_answer(a) for a in question.golden_answers}
        out.append(article is not None and bool(golden & taught_answers(article)))
    return out


def score(questions: list[Question], finished: list) -> dict:
    """EM, well-formed rate, searches, EM per family, OUTCOMES counts and seconds of the
    runs."""
    by_family: dict[str, list[int]] = defaultdict(list)
    ems = []
    outcomes = dict.fromkeys(OUTCOMES, 0)
    for question, run in zip(questions, finished, strict=True):
        kind = outcome(question, run)  # "right" exactly when EM is 1
        outcomes[kind] += 1
        em = int(kind == "right")
        ems.append(em)
        by_family[question.metadata["family"]].append(em)
    seconds = [run.seconds for run in finished]
    return {
        "questions": len(questions),
        "em": statistics.mean(ems),
        "well_formed": statistics.mean(run.answer is not None for run in finished),
        "searches": statistics.mean(run.searches for run in finished),
        "per_family": {f: round(statistics.mean(v), 3) for f, v in sorted(by_family.items())},
        "family_counts": {f: len(v) for f, v in sorted(by_family.items())},
        "outcomes": outcomes,
        "p50_s": statistics.median(seconds),
        "p90_s": sorted(seconds)[int(0.9 * (len(seconds) - 1))],
    }
