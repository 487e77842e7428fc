"""Benchmark table and loaders, on fixture files written here; the Hub is never contacted."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pandas as pd
import pytest

from agent.protocol import user_message
from evaluator import benchmarks
from evaluator.benchmarks import (
    BENCHMARK_NAMES,
    BENCHMARKS,
    IN_DOMAIN,
    OUT_OF_DOMAIN,
    DataError,
    DataWarning,
    Question,
    load_benchmark,
    load_with_warnings,
    question_from_prompt,
    resolve_names,
    select,
)


def _records(name: str, count: int) -> list[dict]:
    return [
        {"id": f"{name}-{i}", "question": f"question {i}", "golden_answers": [f"answer {i}"],
         "metadata": {"i": i}}
        for i in range(count)
    ]


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def test_table() -> None:
    assert BENCHMARK_NAMES == (
        "nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"
    )
    sizes = {n: b.size for n, b in BENCHMARKS.items()}
    assert sizes == {"nq": 3610, "triviaqa": 11313, "popqa": 14267, "hotpotqa": 7405,
                     "2wikimultihopqa": 12576, "musique": 2417, "bamboogle": 125}
    assert {n for n, b in BENCHMARKS.items() if b.split == "dev"} == {
        "hotpotqa", "2wikimultihopqa", "musique"}
    assert IN_DOMAIN == ("nq", "hotpotqa")
    assert len(OUT_OF_DOMAIN) == 5


def test_local_jsonl_nested(tmp_path: Path) -> None:
    _write_jsonl(tmp_path / "bamboogle" / "test.jsonl", _records("bamboogle", 125))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)  # the full 125: nothing to warn about
        questions = load_benchmark("bamboogle", data_dir=tmp_path)
    assert len(questions) == 125
    first = questions[0]
    assert first == Question("bamboogle-0", "bamboogle", "question 0", ["answer 0"], {"i": 0})


def test_local_flat_json_list_and_size_warning(tmp_path: Path) -> None:
    (tmp_path / "nq.json").write_text(json.dumps(_records("nq", 5)), encoding="utf-8")
    questions, notes = load_with_warnings("nq", data_dir=tmp_path)
    assert [q.id for q in questions] == [f"nq-{i}" for i in range(5)]
    assert len(notes) == 1 and "5 questions, expected 3,610" in notes[0]
    with pytest.warns(DataWarning, match="expected 3,610"):
        load_benchmark("nq", data_dir=tmp_path)


def test_local_json_holding_json_lines(tmp_path: Path) -> None:
    # FlashRAG's own files are JSON lines even where named .json
    _write_jsonl(tmp_path / "musique" / "dev.json", _records("musique", 3))
    questions, _ = load_with_warnings("musique", data_dir=tmp_path)
    assert len(questions) == 3


def test_local_parquet_with_array_answers(tmp_path: Path) -> None:
    path = tmp_path / "hotpotqa" / "dev.parquet"
    path.parent.mkdir()
    frame = pd.DataFrame(_records("hotpotqa", 4))
    frame["golden_answers"] = [["a", "b"], ["c"], ["d"], ["e", "f"]]
    frame.to_parquet(path)
    questions, _ = load_with_warnings("hotpotqa", data_dir=tmp_path)
    assert questions[0].golden_answers == ["a", "b"]
    assert isinstance(questions[0].golden_answers, list)
    assert questions[3].metadata == {"i": 3}


def test_local_split_preference_and_split_warning(tmp_path: Path) -> None:
    _write_jsonl(tmp_path / "hotpotqa" / "train.jsonl", _records("train", 2))
    _write_jsonl(tmp_path / "hotpotqa" / "dev.jsonl", _records("dev", 2))
    questions, notes = load_with_warnings("hotpotqa", data_dir=tmp_path)
    assert questions[0].id == "dev-0"  # dev before train
    assert not any("split" in n for n in notes)
    _write_jsonl(tmp_path / "nq" / "train.jsonl", _records("nq", 1))
    _, notes = load_with_warnings("nq", data_dir=tmp_path)
    assert any("'train' split" in n for n in notes)


def test_local_records_without_ids_and_string_answers(tmp_path: Path) -> None:
    _write_jsonl(tmp_path / "popqa.jsonl", [{"question": "q?", "golden_answers": "only"}])
    questions, _ = load_with_warnings("popqa", data_dir=tmp_path)
    assert questions == [Question("popqa_0", "popqa", "q?", ["only"], {})]


def test_local_missing_file_says_where(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"triviaqa/test\.jsonl.*--data-dir"):
        load_benchmark("triviaqa", data_dir=tmp_path)


def test_local_bad_json_line(tmp_path: Path) -> None:
    (tmp_path / "nq.jsonl").write_text('{"question": "a"}\n{broken\n', encoding="utf-8")
    with pytest.raises(DataError, match="nq.jsonl:2"):
        load_benchmark("nq", data_dir=tmp_path)


def _merged_frame() -> pd.DataFrame:
    rows = []
    for source, count in (("nq", 3), ("bamboogle", 2)):
        for i in range(count):
            question = f"{source} question {i}?"
            rows.append({
                "data_source": source,
                "prompt": [{"role": "user", "content": user_message(question)}],
                "ability": "fact-reasoning",
                "reward_model": {"style": "rule", "ground_truth": {"target": [f"t{i}", "u"]}},
                "extra_info": {"split": "test", "index": i},
            })
    return pd.DataFrame(rows)


def test_merged_parquet_from_prompt(tmp_path: Path) -> None:
    path = tmp_path / "test.parquet"
    _merged_frame().to_parquet(path)
    questions, notes = load_with_warnings("bamboogle", merged_parquet=path)
    assert [q.question for q in questions] == ["bamboogle question 0?", "bamboogle question 1?"]
    assert questions[1].golden_answers == ["t1", "u"]
    assert questions[1].id == "bamboogle_1"
    assert questions[1].dataset == "bamboogle"
    assert "expected 125" in notes[0]


def test_merged_parquet_prefers_question_and_id_fields(tmp_path: Path) -> None:
    frame = _merged_frame()
    frame["question"] = [f"plain {i}" for i in range(len(frame))]
    frame["id"] = [f"id{i}" for i in range(len(frame))]
    path = tmp_path / "test.parquet"
    frame.to_parquet(path)
    questions, _ = load_with_warnings("nq", merged_parquet=path)
    assert [(q.id, q.question) for q in questions] == [
        ("id0", "plain 0"), ("id1", "plain 1"), ("id2", "plain 2")]


def test_merged_parquet_missing_source(tmp_path: Path) -> None:
    path = tmp_path / "test.parquet"
    _merged_frame().to_parquet(path)
    with pytest.raises(DataError, match="no 'musique' rows.*bamboogle, nq"):
        load_benchmark("musique", merged_parquet=path)
    with pytest.raises(DataError, match="does not exist"):
        load_benchmark("nq", merged_parquet=tmp_path / "nope.parquet")


def test_question_from_prompt() -> None:
    assert question_from_prompt(user_message("who is it")) == "who is it?"
    assert question_from_prompt("no marker") is None
    templated = f"<|im_start|>user\n{user_message('q')}<|im_end|>\n<|im_start|>assistant\n"
    assert question_from_prompt(templated) == "q?"


def _questions(count: int) -> list[Question]:
    return [Question(str(i), "nq", f"q{i}", ["a"]) for i in range(count)]


def test_select_limit_and_sample() -> None:
    questions = _questions(50)
    assert [q.id for q in select(questions, limit=3)] == ["0", "1", "2"]
    assert select(questions, limit=1000) == questions
    first = select(questions, sample=10, seed=7)
    assert first == select(questions, sample=10, seed=7)  # reproducible
    assert first != select(questions, sample=10, seed=8)
    ids = [int(q.id) for q in first]
    assert ids == sorted(ids) and len(set(ids)) == 10  # file order, no repeats
    assert select(questions, sample=99) == questions
    with pytest.raises(DataError, match="not both"):
        select(questions, limit=1, sample=1)


def test_a_limit_checks_the_full_size_only_where_it_read_the_whole_file(tmp_path: Path) -> None:
    """A limit stops reading at its last question, so the set's size is unknown then (and
    not guessed); a limit past the end of the file reads it all and checks it."""
    _write_jsonl(tmp_path / "nq" / "test.jsonl", _records("nq", 20))
    questions, notes = load_with_warnings("nq", data_dir=tmp_path, limit=5)
    assert len(questions) == 5 and notes == []
    questions, notes = load_with_warnings("nq", data_dir=tmp_path, limit=25)
    assert len(questions) == 20 and "the full set has 20 questions" in notes[0]
    sampled, _ = load_with_warnings("nq", data_dir=tmp_path, sample=5, seed=1)
    assert len(sampled) == 5


def _offline(*args: object, **kwargs: object) -> None:
    # what datasets raises with no network (LocalEntryNotFoundError / OfflineModeIsEnabled)
    raise ConnectionError(
        "Couldn't reach 'RUC-NLPIR/FlashRAG_datasets' on the Hub (LocalEntryNotFoundError)")


def test_hub_offline_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", _offline)
    with pytest.raises(DataError) as caught:
        load_benchmark("musique")
    message = str(caught.value)
    assert "unreachable" in message
    assert "musique/dev.jsonl" in message and "--data-dir" in message
    assert "--merged-parquet" in message


def test_hub_other_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    def missing(*args: object, **kwargs: object) -> None:
        raise ValueError("Unknown split")

    monkeypatch.setattr(datasets, "load_dataset", missing)
    with pytest.raises(DataError, match="Unknown split"):
        load_benchmark("nq")


def test_hub_success_uses_flashrag_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    calls = []

    def fake(path: str, name: str, split: str) -> list[dict]:
        calls.append((path, name, split))
        return _records(name, 125)

    monkeypatch.setattr(datasets, "load_dataset", fake)
    questions = load_benchmark("bamboogle", limit=10)
    assert calls == [(benchmarks.HUB_DATASET, "bamboogle", "test")]
    assert len(questions) == 10


def test_unknown_benchmark() -> None:
    with pytest.raises(DataError, match="Unknown benchmark 'squad'"):
        load_benchmark("squad")


def test_resolve_names() -> None:
    assert resolve_names(None) == list(BENCHMARK_NAMES)
    assert resolve_names(["all"]) == list(BENCHMARK_NAMES)
    assert resolve_names(["bamboogle", "nq", "nq", "custom"]) == ["nq", "bamboogle", "custom"]


def test_an_unreachable_hub_fails_fast_with_where_to_put_files(monkeypatch):
    import agent.models
    from evaluator.benchmarks import DataError, load_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(agent.models, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(DataError, match="cannot be reached.*--data-dir"):
        load_hub("nq", "test")
