"""How a nano run went wrong, judged against the documents it retrieved (`nano.evaluate.outcome`):
runs built by hand here; `test_nano_model.py` checks the counts on the shipped model's runs."""

from __future__ import annotations

from agent.events import Finished
from evaluator.benchmarks import Question
from nano.evaluate import OUTCOMES, outcome, score, taught
from nano.questions import Article

MONA = '"Mona Lisa"\nThe Mona Lisa is a portrait painting by Italian artist Leonardo da Vinci.'
LOUVRE = '"Louvre"\nThe Louvre is an art museum in Paris.'
QUESTION = Question("q1", "naturalqa", "who painted the mona lisa", ["Leonardo da Vinci"],
                    {"family": "person"})


def _run(answer: str | None, *retrieved: str) -> Finished:
    return Finished(stop_reason="answer" if answer else "eos", turns=2, searches=1,
                    new_tokens=9, seconds=0.1, trajectory="", prompt="", answer=answer,
                    retrieved=list(retrieved))


def test_each_way_a_run_can_go():
    assert outcome(QUESTION, _run("Leonardo da Vinci", MONA)) == "right"
    assert outcome(QUESTION, _run("Louvre", LOUVRE)) == "answer not retrieved"
    assert outcome(QUESTION, _run("The Mona Lisa", MONA, LOUVRE)) == "said a title"
    assert outcome(QUESTION, _run("Louvre", MONA, LOUVRE)) == "said a title"  # any title read
    assert outcome(QUESTION, _run("Italian artist", MONA)) == "copied another span"
    assert outcome(QUESTION, _run("Michelangelo", MONA)) == "wrote no span"
    assert outcome(QUESTION, _run(None, MONA)) == "wrote no span"
    # a word inside a longer one is not a span: "Vinc" is not read in "Vinci"
    assert outcome(QUESTION, _run("Vinc", MONA)) == "wrote no span"


def test_score_counts_every_run_once():
    runs = [_run("Leonardo da Vinci", MONA), _run("Mona Lisa", MONA), _run("Louvre", LOUVRE)]
    result = score([QUESTION] * 3, runs)
    assert set(result["outcomes"]) == set(OUTCOMES)
    assert sum(result["outcomes"].values()) == 3
    assert result["outcomes"]["right"] == round(result["em"] * 3) == 1
    assert result["outcomes"]["said a title"] == result["outcomes"]["answer not retrieved"] == 1


def test_taught_means_the_generator_asks_that_answer_about_the_support_article():
    iron = Article("1", "Iron", "Iron is a chemical element; it has symbol Fe and atomic "
                   "number 26. It is the most common element on Earth by mass.")
    articles = {"Iron": iron}

    def ask(text: str, answers: list[str], support: str | None = "Iron") -> Question:
        return Question("q", "naturalqa", text, answers,
                        {"family": "thing"} | ({"support": support} if support else {}))

    questions = [ask("chemical symbol of iron", ["Fe"]),  # a reading fact: symbol
                 ask("atomic number of iron", ["26"]),
                 ask("what is iron's melting point", ["1538 °C"]),  # never stated so
                 ask("chemical symbol of iron", ["Fe"], support="Gold"),  # no such article
                 ask("chemical symbol of iron", ["Fe"], support=None)]
    assert taught(questions, articles) == [True, True, False, False, False]


def test_the_generator_asks_for_40_of_naturalqa_devs_78_answers():
    """Measured on the embedded corpus (2026-12-05, the twelfth attempt's patterns, unchanged
    by the thirteenth's; 27 before them): on how many dev questions the training data, had
    it kept their articles, would ask for a golden answer about the article (the same span,
    not always the same relation)."""
    from evaluator.benchmarks import question_from_record, read_data_file
    from nano.questions import articles_from_records
    from retriever.corpus import load_records, resolve_corpus
    from tests.conftest import ROOT

    path = ROOT / "assets" / "naturalqa" / "dev.jsonl"
    questions = [question_from_record(r, "naturalqa", i, w)
                 for i, (w, r) in enumerate(read_data_file(path))]
    articles = {a.title: a for a in articles_from_records(load_records(resolve_corpus(None)))}
    flags = dict(zip((q.question for q in questions), taught(questions, articles), strict=True))
    assert sum(flags.values()) == 40 and len(flags) == 78
    assert flags["chemical symbol of iron"] and flags["what is the capital of brazil"]
    assert not flags["who narrates the great gatsby"]
