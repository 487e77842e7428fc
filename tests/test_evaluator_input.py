"""Benchmark input the evaluator must refuse or stop reading (issue 48): a question that is
not a string is refused for its record alone, `--limit` stops reading at its last question,
and a line over the reader's size limit is bad input (exit 2) that names it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.loop import AgentSettings
from evaluator.benchmarks import (
    MAX_RECORD_BYTES,
    DataError,
    load_local,
    load_merged,
    load_with_warnings,
    select,
)
from evaluator.rundir import load_run
from evaluator.runner import evaluate
from tests.test_evaluator import FACTS, scripted
from tests.test_evaluator_faults import _cli

ASKED = list(FACTS)  # questions the scripted model answers


def _line(qid: str, question: object, answers: list[str] | None = None) -> str:
    return json.dumps({"id": qid, "question": question,
                       "golden_answers": answers if answers is not None else ["x"]}) + "\n"


def _write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines), encoding="utf-8")
    return path


def _parquet(path: Path, columns: dict) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


# ---------------------------------------------------------------------------- a: not a string


@pytest.mark.parametrize("column, shown, kind", [
    ([["who", "wrote", "hamlet"]], "['who', 'wrote', 'hamlet']", "a list"),
    ([[]], "[]", "a list"),
    ([{"text": "who wrote hamlet?"}], "{'text': 'who wrote hamlet?'}", "an object (a struct)"),
])
def test_a_parquet_question_that_is_a_list_or_struct_is_refused_for_its_record(
        tmp_path, column, shown, kind):
    """Before, ['who', 'wrote', 'hamlet'] went to the model as its Python repr."""
    _parquet(tmp_path / "nq" / "test.parquet",
             {"id": ["bad"], "question": column, "golden_answers": [["Shakespeare"]]})
    [question], _, _ = load_local(tmp_path, "nq")
    assert question.question == shown  # the record is found by it, never asked
    assert question.problem == (
        f"{tmp_path / 'nq' / 'test.parquet'} record 0: the question is {kind} ({shown}), not "
        "a string; it was not asked. Write the question as one string (e.g. \"question\": "
        + json.dumps("who wrote hamlet" if shown.startswith("['who'") else "who wrote hamlet?")
        + "), then run the same command again: the other questions are kept and this one "
        "runs then.")


def test_a_jsonl_question_that_is_not_a_string_is_recorded_refused_and_the_rest_run(
        tmp_path, local_retriever):
    _write(tmp_path / "D" / "nq" / "test.jsonl", [
        _line("q1", ASKED[0], FACTS[ASKED[0]][0]), _line("list", ["who", "wrote", "hamlet"]),
        _line("object", {"text": "who?"}), _line("number", 42), _line("flag", True),
        _line("q6", ASKED[2], FACTS[ASKED[2]][0])])
    questions, notes = load_with_warnings("nq", tmp_path / "D")
    assert [q.id for q in questions] == ["q1", "list", "object", "number", "flag", "q6"]
    assert not any("no golden answers" in note for note in notes)
    out = tmp_path / "run" / "nq.jsonl"
    out.parent.mkdir()
    records = {r.id: r for r in evaluate(questions, scripted(), local_retriever,
                                         AgentSettings(), out)}
    refused = {qid: records[qid] for qid in ("list", "object", "number", "flag")}
    assert all(r.stop_reason == "error" and r.turns == 0 for r in refused.values())
    assert "test.jsonl:2: the question is a list (['who', 'wrote', 'hamlet']), not a " \
           "string; it was not asked" in refused["list"].error
    assert "test.jsonl:3: the question is an object (a struct) ({'text': 'who?'})" \
        in refused["object"].error
    assert "test.jsonl:4: the question is a number (42)" in refused["number"].error
    assert "test.jsonl:5: the question is true/false (True)" in refused["flag"].error
    assert records["q1"].stop_reason == records["q6"].stop_reason == "answer"
    assert {r.id for r in load_run(out.parent).records["nq"]} == set(records)


def test_a_merged_parquet_question_that_is_a_list_is_refused_for_its_record(tmp_path):
    path = _parquet(tmp_path / "test.parquet", {
        "data_source": ["nq", "nq"], "question": [["who", "wrote"], [" Who wrote Hamlet? "]],
        "golden_answers": [["a"], ["Shakespeare"]]})
    first, second = load_merged(path, "nq")
    assert first.problem.startswith("merged record 0 (nq): the question is a list")
    assert second.problem.startswith("merged record 1 (nq): the question is a list")


@pytest.mark.slow
def test_a_list_question_through_the_cli_is_exit_1_with_the_reason(tmp_path, tiny_models):
    """The run went on and exited 0 before, having asked the repr."""
    data = tmp_path / "D"
    _parquet(data / "nq" / "test.parquet", {"id": ["bad"], "question": [["who", "wrote"]],
                                            "golden_answers": [["Shakespeare"]]})
    out = tmp_path / "out"
    done = _cli("--datasets", "nq", "--data-dir", str(data), "--model",
                str(tiny_models["scripted"]), "--engine", "bm25s", "--output", str(out))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    [record] = load_run(out).records["nq"]
    assert record.stop_reason == "error"
    assert "the question is a list (['who', 'wrote']), not a string" in record.error


# ---------------------------------------------------------------------------- b: --limit


def _big_file(root: Path, lines: int, after: str) -> Path:
    """DIR/nq/test.jsonl of `lines` records, then the line `after`."""
    path = root / "nq" / "test.jsonl"
    path.parent.mkdir(parents=True)
    with path.open("w", encoding="utf-8") as out:
        out.writelines(_line(f"q{i}", f"question {i}?", [f"a{i}"]) for i in range(lines))
        out.write(after)
    return path


def test_a_limit_stops_reading_at_its_last_question(tmp_path):
    """200,000 records and a malformed line after them: --limit 3 reads three lines and
    never reaches it, where the whole file was read (and the line refused) before."""
    _big_file(tmp_path, 200_000, "{not json\n")
    questions, notes = load_with_warnings("nq", tmp_path, limit=3)
    assert [q.id for q in questions] == ["q0", "q1", "q2"] and notes == []
    with pytest.raises(DataError, match=r"test\.jsonl:200001: not valid JSON"):
        load_with_warnings("nq", tmp_path)  # the line is there to be found


def test_a_limit_counts_scorable_questions_and_a_sample_still_reads_the_whole_file(tmp_path):
    """Unanswerable and repeated records do not count toward the limit (as before); a
    sample is drawn from the whole file, so its seed picks what it picked before."""
    path = _write(tmp_path / "nq" / "test.jsonl", [
        _line("q0", "a?"), _line("none", "b?", []), _line("q0", "c?"), _line("q1", "d?"),
        _line("q2", "e?")] + [_line(f"q{i}", f"{i}?") for i in range(3, 40)])
    questions, notes = load_with_warnings("nq", tmp_path, limit=3)
    assert [q.question for q in questions] == ["a?", "d?", "e?"]
    assert len(notes) == 2  # the record without answers and the repeated id, both read
    whole, _ = load_with_warnings("nq", tmp_path)
    sampled, _ = load_with_warnings("nq", tmp_path, sample=5, seed=3)
    assert sampled == select(whole, sample=5, seed=3)
    with path.open("a") as out:
        out.write("{not json\n")
    with pytest.raises(DataError, match=r"test\.jsonl:43: not valid JSON"):
        load_with_warnings("nq", tmp_path, sample=5, seed=3)
    assert len(load_with_warnings("nq", tmp_path, limit=39)[0]) == 39  # stops before it


# ---------------------------------------------------------------------------- c: long lines


def test_a_set_written_as_one_json_list_on_one_line_is_exit_2_saying_so(tmp_path):
    """A real file just over the real limit: the FlashRAG records written as one JSON list
    on one line of a .jsonl file. It exited 1 as one errored question before."""
    records = [{"id": f"q{i}", "question": f"question {i}?", "golden_answers": ["a"]}
               for i in range(MAX_RECORD_BYTES // 50)]
    path = _write(tmp_path / "nq" / "test.jsonl", [json.dumps(records)])
    size = path.stat().st_size
    assert MAX_RECORD_BYTES < size < 2 * MAX_RECORD_BYTES
    done = _cli("--datasets", "nq", "--data-dir", str(tmp_path), "--model", "/nonexistent")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"error: {path}:1: a line of {size / 2**20:.1f} MB (record id 'q0'), over the " \
           "limit of 1.0 MB for one line of a benchmark file; nothing was asked. It starts " \
           "with '[', as if the whole set were one JSON list on one line; write one record " \
           "a line (a .jsonl file). Then run the same command again." in done.stderr
