"""How a nano run went wrong, judged against the documents it retrieved (`nano.evaluate.outcome`):
runs built by hand here; `test_nano_model.py` checks the counts on the shipped model's runs."""

from __future__ import annotations

from agent.events import Finished
from evaluator.benchmarks import Question
from nano.evaluate import OUTCOMES, outcome, score

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
