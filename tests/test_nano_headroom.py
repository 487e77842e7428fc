"""`python -m nano headroom`: candidates, the selection rule, the file `nano rl` reads, and
bad flags refused before any work."""

from __future__ import annotations

import json

import pytest

from evaluator.benchmarks import Question
from nano.__main__ import main
from nano.headroom import HeadroomConfig, check_paths, select
from tests.test_rl import coin_model, questions_file  # noqa: F401 (fixtures)


def _question(n: int, family: str = "span") -> Question:
    return Question(id=f"q{n}", dataset="x", question=f"question {n}",
                    golden_answers=[f"a{n}"], metadata={"family": family})


def test_select_keeps_shares_within_the_bounds_inclusive():
    questions = [_question(n) for n in range(5)]
    rewards = [0.0, 0.25, 0.5, 0.75, 1.0]
    kept = select(questions, rewards, HeadroomConfig(out="x.jsonl", samples=4))
    assert [r["id"] for r in kept] == ["q1", "q2"]
    assert kept[0]["metadata"] == {"family": "span", "headroom_reward": 0.25,
                                   "headroom_samples": 4}
    wide = select(questions, rewards, HeadroomConfig(out="x.jsonl", low=0.5, high=1.0))
    assert [r["id"] for r in wide] == ["q2", "q3", "q4"]


@pytest.mark.parametrize("change, message", [
    (["--low", "0.7", "--high", "0.6"], "0 <= low <= high <= 1"),
    (["--families", "span,poetry"], "--families 'span,poetry': pick from"),
    (["--samples", "0"], "--samples is 0"),
    (["--out", "OUT.txt"], "name a .jsonl file"),
    (["--out", "EXISTING"], "exists; it is never overwritten"),
    (["--model", "MISSING"], "no model there"),
    (["--questions", "MISSING"], "--questions"),
])
def test_bad_flags_are_refused_before_any_work(tmp_path, capsys, change, message):
    existing = tmp_path / "kept.jsonl"
    existing.write_text("keep\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    swap = {"OUT.txt": str(tmp_path / "out.txt"), "EXISTING": str(existing),
            "MISSING": str(tmp_path / "missing")}
    argv = ["headroom", "--model", str(model), "--out", str(tmp_path / "new.jsonl"),
            *[swap.get(c, c) for c in change]]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert existing.read_text() == "keep\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.jsonl", "model"]


def test_every_field_is_a_flag_with_help():
    import dataclasses

    from nano.__main__ import config_parser

    parser = config_parser("headroom", HeadroomConfig)
    assert HeadroomConfig(**vars(parser.parse_args([]))) == HeadroomConfig()
    assert {a.dest for a in parser._actions if a.dest != "help"} == {
        f.name for f in dataclasses.fields(HeadroomConfig)}
    assert all(f.metadata.get("help") for f in dataclasses.fields(HeadroomConfig))


def test_the_report_says_how_many_qualified_of_how_many_per_family():
    from nano.headroom import report

    summary = {"seconds": 12.3, "measured": {"span": 4, "read": 2},
               "selected": {"span": 1}, "mean_reward": 0.5,
               "rewards": {"span": {0.0: 2, 0.25: 1, 1.0: 1}, "read": {0.5: 1, 1.0: 1}}}
    text = report(summary, HeadroomConfig(out="h.jsonl"))
    assert text.startswith("1 of 6 questions have a share of right answers in [0.2, 0.6] "
                           "over 4 samples (span 1/4, read 0/2)")
    assert "span 0.00: 2, 0.25: 1, 1.00: 1; read 0.50: 1, 1.00: 1" in text


def test_out_is_required():
    with pytest.raises(ValueError, match="--out is required"):
        check_paths(HeadroomConfig())


@pytest.mark.slow
def test_written_candidates_are_training_questions_of_the_families_in_equal_shares():
    from evaluator.benchmarks import local_benchmark_file
    from nano.data import benchmark_support
    from nano.headroom import written_candidates
    from nano.questions import held_out

    config = HeadroomConfig(out="x.jsonl", families="span,twohop,read", candidates=10)
    candidates = written_candidates(config)
    families = [q.metadata["family"] for q in candidates]
    assert (families.count("span"), families.count("twohop"), families.count("read")) == (
        4, 3, 3)
    support = benchmark_support(local_benchmark_file("naturalqa").parent)
    for q in candidates:
        assert not any(held_out(title) or title in support for title in q.metadata["articles"])
    assert [q.id for q in written_candidates(config)] == [q.id for q in candidates]


@pytest.mark.slow
def test_a_measured_file_selects_the_questions_with_headroom_and_nano_rl_reads_it(
        coin_model, questions_file, tmp_path, monkeypatch, local_retriever):  # noqa: F811
    """The coin model answers 'American' half the time: the two questions it can get right
    are kept (a share of 0.25-0.75 over 4 samples), the one it never gets right is not."""
    import retriever.client
    from nano.headroom import measure
    from nano.rl import read_questions

    monkeypatch.setattr(retriever.client, "LocalRetriever", lambda **_: local_retriever)
    out = tmp_path / "headroom" / "train.jsonl"
    config = HeadroomConfig(model=str(coin_model), out=str(out), questions=str(questions_file),
                            samples=4, low=0.2, high=0.8, max_new_tokens=16,
                            max_obs_tokens=4000)
    summary = measure(config)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["question"] for r in records] == ["who directed 2001 a space odyssey",
                                                "who wrote hamlet"]
    assert all(0.2 <= r["metadata"]["headroom_reward"] <= 0.8 for r in records)
    assert summary["rewards"]["-"].get(0.0) == 1  # the capital of France: never right
    assert [q.question for q in read_questions(out)] == [r["question"] for r in records]
