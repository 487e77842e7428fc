"""The nano agent's data: deterministic question families, split by article, and teacher
trajectories that go through the real agent loop and the real retriever."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from agent import protocol
from agent.loop import AgentSettings
from nano.data import (
    as_record,
    benchmark_question,
    benchmark_questions,
    build_questions,
    read_human,
    shipped_benchmark,
)
from nano.questions import TITLE_FAMILIES, GeneratedQuestion, articles_from_records, held_out
from nano.teacher import TeacherBackend, documents_in, evidence_for, trajectories
from retriever.client import LocalRetriever
from retriever.corpus import load_records

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = shipped_benchmark()
HUMAN = ROOT / "nano" / "vitalqa_human.jsonl"


@pytest.fixture(scope="module")
def records(default_corpus):
    return load_records(default_corpus)


@pytest.fixture(scope="module")
def questions(records):
    return build_questions(records)


@pytest.fixture(scope="module")
def tokenizer(records):
    from nano.tokenizer import build_tokenizer

    return build_tokenizer(records)


@pytest.fixture(scope="module")
def retriever():
    return LocalRetriever(engine="bm25")


@pytest.mark.slow
def test_questions_are_deterministic(records, questions):
    again = build_questions(records)
    assert [q.question for q in again[0]] == [q.question for q in questions[0]]
    assert [q.answers for q in again[1]] == [q.answers for q in questions[1]]


@pytest.mark.slow
def test_split_by_article(questions):
    train, held = questions
    assert train and held
    assert not any(held_out(t) for q in train for t in q.articles)
    assert all(held_out(t) for q in held for t in q.articles)
    for family in ("definition", "description", "span", "twohop"):
        assert any(q.family == family for q in train), family
        assert any(q.family == family for q in held), family


@pytest.mark.slow
def test_questions_never_contain_their_answer(questions):
    train, held = questions
    leaks = [q for q in train + held if q.family in ("span", "twohop")
             and q.answers[0].lower() in q.question.lower()]
    assert leaks == []


@pytest.mark.slow
def test_phrasings_vary_as_people_type(questions):
    texts = [q.question for q in questions[0]]
    assert any(t.endswith("?") for t in texts) and any(not t.endswith("?") for t in texts)
    assert any(t == t.lower() for t in texts) and any(t[0].isupper() for t in texts)


@pytest.mark.slow
def test_shipped_benchmark_is_what_the_code_writes(questions):
    """assets/vitalqa/test.jsonl: FlashRAG records, regenerated identically from the corpus."""
    shipped = [json.loads(x) for x in SHIPPED.read_text(encoding="utf-8").splitlines()]
    expected = [benchmark_question(q) for q in benchmark_questions(questions[1])]
    assert shipped == [as_record(q) for q in expected + read_human(HUMAN)]
    assert SHIPPED == ROOT / "assets" / "vitalqa" / "test.jsonl"
    for record in shipped:
        assert set(record) == {"id", "question", "golden_answers", "metadata"}
        assert isinstance(record["golden_answers"], list) and record["golden_answers"]
    assert len({r["id"] for r in shipped}) == len(shipped)
    families = Counter(r["metadata"]["family"] for r in shipped)
    assert families["human"] >= 30 and len(families) == 5


@pytest.mark.slow
def test_human_questions_are_about_held_out_articles(records):
    from nano.teacher import _norm

    articles = {a.title: a for a in articles_from_records(records)}
    for question in read_human(HUMAN):
        title = question.metadata["articles"][0]
        assert held_out(title), title
        article = articles[title]
        text = _norm(article.title + " " + article.text)
        assert any(_norm(a) in text for a in question.golden_answers), question


def test_evaluator_loads_vitalqa_from_a_data_dir():
    from evaluator.benchmarks import load_local

    loaded, split, path = load_local(ROOT / "assets", "vitalqa")
    assert split == "test" and path == SHIPPED and len(loaded) == len(SHIPPED.read_text()
                                                                       .splitlines())


def _docs_as_observation(backend: TeacherBackend, retriever, query: str) -> str:
    docs = retriever.search([query], 3)[0]
    return backend.truncate(
        protocol.observation(protocol.render_documents([doc.contents for doc in docs])), 500)


@pytest.mark.slow
def test_trajectories_go_through_the_real_loop(questions, tokenizer, retriever):
    train = questions[0]
    picked = [next(q for q in train if q.family == f) for f in
              ("definition", "description", "span", "twohop")]
    runs = list(trajectories(picked, tokenizer, retriever))
    assert len(runs) >= 3
    teacher = TeacherBackend(tokenizer, picked, retriever, AgentSettings())
    for run in runs:
        segments = run["segments"]
        assert segments[0] == [protocol.build_prompt(run["question"], tokenizer), False]
        generated = [text for text, mine in segments if mine]
        inserted = [text for text, mine in segments[1:] if not mine]
        actions = [protocol.parse_action(t) for t in generated]
        assert [a.kind for a in actions] == ["search"] * (len(actions) - 1) + ["answer"]
        assert actions[0].content == run["question"].rstrip("?").strip()
        # Each observation is the retriever's real answer, cut as the backend cuts it.
        for action, observation in zip(actions, inserted, strict=False):
            assert observation == _docs_as_observation(teacher, retriever, action.content)
        assert actions[-1].content in run["answers"]
        # The model reads its answer in the last observation.
        assert any(actions[-1].content.lower() in (title + text).lower()
                   for _, title, text in documents_in(inserted[-1]))


@pytest.mark.slow
def test_a_superlative_run_answers_the_title_it_retrieved(tokenizer, retriever):
    question = GeneratedQuestion("superlative-test-0", "fourth largest island in the world",
                                 ("Madagascar",), "superlative", ("Madagascar",))
    [run] = list(trajectories([question], tokenizer, retriever))
    actions = [protocol.parse_action(t) for t, mine in run["segments"] if mine]
    assert [(a.kind, a.content) for a in actions] == [
        ("search", "fourth largest island in the world"), ("answer", "Madagascar")]
    observation = next(t for t, mine in run["segments"][1:] if not mine)
    assert "Madagascar" in [title for _, title, _ in documents_in(observation)]


def test_evidence_is_the_words_that_lead_to_the_answer_in_its_sentence():
    text = "It is a portrait. It was painted by Leonardo da Vinci in 1503; it hangs in Paris."
    assert evidence_for("Leonardo da Vinci", text) == "It was painted by Leonardo da Vinci"
    assert evidence_for("Leonardo da Vinci", text, words=1) == "by Leonardo da Vinci"
    assert evidence_for("Paris", text) == "it hangs in Paris"  # not across the ";"
    assert evidence_for("It", text) == "It"  # the sentence starts with it
    assert evidence_for("leonardo da vinci", text) is None  # not as it stands there
    assert evidence_for("Vinci in 15", text) is None  # not a whole-word span


@pytest.mark.slow
def test_quoted_runs_read_the_answer_out_of_the_document_first(tokenizer, retriever):
    question = GeneratedQuestion("span-test-2", "what nationality was Stanley Kubrick",
                                 ("American",), "span", ("Stanley Kubrick",), "nationality")
    plain, quoted = (list(trajectories([question], tokenizer, retriever, quote=q))[0]
                     for q in (False, True))
    assert [t for t, mine in plain["segments"] if not mine] == \
        [t for t, mine in quoted["segments"] if not mine]  # the same documents either way
    last = [t for t, mine in quoted["segments"] if mine][-1]
    think = re.fullmatch(r"<think> Doc (\d) says: (.+) </think>\n<answer> American </answer>",
                         last)
    assert think is not None, last
    observation = [t for t, mine in quoted["segments"] if not mine][-1]
    text = next(t for i, _, t in documents_in(observation) if i == int(think[1]))
    assert think[2].endswith("American") and think[2] in text
    assert "The answer is in Doc" in [t for t, mine in plain["segments"] if mine][-1]


@pytest.mark.slow
def test_quote_evidence_flag_as_the_model_card_runs_it(tmp_path):
    """`python -m nano data --quote-evidence`: span runs quote their document, title runs
    keep the plain think."""
    import subprocess
    import sys

    out = tmp_path / "quoted"
    done = subprocess.run([sys.executable, "-m", "nano", "data", "--out", str(out), "--limit",
                           "60", "--tokenizer", str(ROOT / "assets" / "nano-agent"),
                           "--quote-evidence"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = [json.loads(line) for line in (out / "train.jsonl").open(encoding="utf-8")]
    families = Counter("title" if r["family"] in TITLE_FAMILIES else "span" for r in runs)
    assert families["title"] and families["span"], families
    for run in runs:
        last = run["segments"][-1][0]
        if run["family"] in TITLE_FAMILIES:
            assert last.startswith("<think> The answer is in Doc "), last
            continue
        think = re.fullmatch(r"<think> Doc (\d) says: (.+) </think>\n<answer> (.+) </answer>",
                             last)
        assert think is not None and think[3] == run["answers"][0], last
        text = next(t for i, _, t in documents_in(run["segments"][-2][0]) if i == int(think[1]))
        assert think[2].endswith(think[3]) and think[2] in text, (think[2], text)


@pytest.mark.slow
def test_teacher_searches_again_when_the_documents_miss(tokenizer, retriever):
    """A first search that finds nothing useful leads to a reformulated second search."""
    question = GeneratedQuestion("span-test-0", "what nationality was zqxv wmbr", ("American",),
                                 "span", ("Stanley Kubrick",), "nationality",
                                 reformulations=("zqxv", "Stanley Kubrick"))
    [run] = list(trajectories([question], tokenizer, retriever))
    actions = [protocol.parse_action(t) for t, mine in run["segments"] if mine]
    assert [(a.kind, a.content) for a in actions] == [
        ("search", "what nationality was zqxv wmbr"), ("search", "Stanley Kubrick"),
        ("answer", "American")]
    assert "do not answer" in [t for t, mine in run["segments"] if mine][1]


@pytest.mark.slow
def test_unsolvable_questions_are_dropped(tokenizer, retriever):
    question = GeneratedQuestion("span-test-1", "what nationality was zqxv wmbr", ("Martian",),
                                 "span", ("Stanley Kubrick",), "nationality",
                                 reformulations=("Stanley Kubrick",))
    assert list(trajectories([question], tokenizer, retriever)) == []
