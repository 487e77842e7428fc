"""The evaluator's memory and size limits on benchmark files: a parquet file is decoded a
batch at a time, its peak following its budget (not the file's decoded size), and a JSON-lines
line over its size limit is bad input that names it, measured without being held whole.

Peaks are measured in a fresh interpreter: VmHWM (the peak RSS of that process's own address
space), read before and after the load. Not getrusage's ru_maxrss: Linux carries that across
fork and exec, so a child of a large pytest process would start at the parent's peak and hide
the growth. Each child first loads a tiny file of the same kind, so arrow's pools and threads
(about 45 MB, once per process) are not counted against the load measured."""

from __future__ import annotations

import json
import random
import string
import subprocess
import sys
from pathlib import Path

import pytest

import evaluator.benchmarks as benchmarks
from agent.loop import AgentSettings
from evaluator.benchmarks import (
    MAX_QUESTION_CHARS,
    MAX_RECORD_BYTES,
    DataError,
    ParquetLimits,
    load_local,
    load_merged,
    load_with_warnings,
    read_data_file,
    read_parquet_guarded,
)
from evaluator.rundir import load_run
from evaluator.runner import evaluate
from tests.test_evaluator import FACTS, scripted
from tests.test_evaluator_faults import _cli

MB = 2**20
# The tree whose evaluator is under test (the child process imports the same one).
EVALUATOR_ROOT = Path(benchmarks.__file__).resolve().parent.parent

_MEASURE = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import pyarrow.compute, pyarrow.parquet  # noqa: F401  (imported before the baseline)
from evaluator.benchmarks import DataError, ParquetLimits, load_local, read_parquet_guarded

def peak():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmHWM"))

warm, kind, target, budget = Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), int(sys.argv[5])
load_local(warm, "nq")  # the one-off cost of a first read, not counted
before = peak()
try:
    if kind == "load":
        outcome = f"{len(load_local(target, 'nq')[0])} questions"
    else:
        read_parquet_guarded(target, ["id", "question", "golden_answers"],
                             ParquetLimits(decoded_bytes=budget))
        outcome = "loaded"
except DataError as error:
    outcome = f"DataError: {error}"
print(json.dumps({"growth": peak() - before, "outcome": outcome}))
"""


def _peak_growth(warm: Path, kind: str, target: Path, budget: int = 0) -> tuple[int, str]:
    """(bytes the peak RSS grew by during the load, what the load said), in a fresh process."""
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(EVALUATOR_ROOT), str(warm), kind,
                           str(target), str(budget)], cwd=EVALUATOR_ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["growth"], result["outcome"]


def _write_table(path: Path, columns: dict, **options) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path, compression="zstd", **options)
    return path


def _unique_questions(rows: int, width: int = 400) -> list[str]:
    """`rows` different questions of `width` characters that compress to almost nothing: a
    row number in front of one random text (the worst case for a small file)."""
    text = "".join(random.Random(0).choices(string.ascii_letters, k=width))
    return [f"{i:08d}{text[8:]}" for i in range(rows)]


# ---------------------------------------------------------------------------- parquet


def test_unique_text_in_a_small_parquet_file_loads_in_memory_near_its_size(tmp_path):
    """60,000 different questions of 400 characters (24 MB of text) in a 0.3 MB file. Read as
    dictionaries, arrow handed every batch the dictionary accumulated so far, and holding the
    batches held the text ~40 times over (1 GB here; 2.4 GB for 100,000 rows)."""
    rows = 60_000
    warm = tmp_path / "warm"
    _write_table(warm / "nq" / "test.parquet",
                 {"id": ["1"], "question": ["q?"], "golden_answers": [["a"]]})
    questions = _unique_questions(rows)
    _write_table(tmp_path / "data" / "nq" / "test.parquet",
                 {"id": [str(i) for i in range(rows)], "question": questions,
                  "golden_answers": [["a"]] * rows})
    assert (tmp_path / "data" / "nq" / "test.parquet").stat().st_size < MB
    text = sum(len(q) for q in questions)
    growth, outcome = _peak_growth(warm, "load", tmp_path / "data")
    assert outcome == f"{rows} questions"
    # The text once as arrow decodes it, once as Python strings and records, plus the one
    # column chunk measured as a dictionary: a few times the text, never tens of times.
    assert growth < 8 * text, f"peak grew {growth / MB:.0f} MB for {text / MB:.0f} MB of text"
    loaded, _, _ = load_local(tmp_path / "data", "nq")
    assert [q.question for q in loaded[:2]] == questions[:2] and loaded[-1].id == str(rows - 1)


def test_a_refused_dictionary_bomb_peaks_near_its_budget_not_its_decoded_size(tmp_path):
    """10,000 different 1 KB questions stored once in a dictionary page, referred to by
    200,000 rows: 200 MB decoded from a 0.3 MB file, against a budget of 32 MB. Refused
    from one read of the dictionary and its indices, not after holding batch upon batch
    that each carried the whole dictionary (440 MB before)."""
    import pyarrow as pa

    rows, distinct, budget = 200_000, 10_000, 32 * MB
    warm = tmp_path / "warm"
    _write_table(warm / "nq" / "test.parquet",
                 {"id": ["1"], "question": ["q?"], "golden_answers": [["a"]]})
    values = pa.array(_unique_questions(distinct, width=1024))
    bomb = _write_table(
        tmp_path / "bomb.parquet",
        {"id": [str(i) for i in range(rows)],
         "question": pa.DictionaryArray.from_arrays(
             pa.array([i % distinct for i in range(rows)], pa.int32()), values),
         "golden_answers": [["a"]] * rows},
        dictionary_pagesize_limit=2**30)
    assert bomb.stat().st_size < MB
    growth, outcome = _peak_growth(warm, "bomb", bomb, budget)
    assert "expand to over 32 MB in memory" in outcome and "split the file" in outcome
    assert growth < 3 * budget, f"peak grew {growth / MB:.0f} MB against a {budget // MB} MB budget"


def test_text_stored_as_an_arrow_dictionary_is_counted_and_read_as_plain_text(tmp_path):
    """A column written as an arrow dictionary comes back as one whatever is asked: it is
    measured row by row, turned into plain strings, and its decoded size counts."""
    import pyarrow as pa

    rows = 5_000
    questions = _unique_questions(rows)
    path = _write_table(tmp_path / "nq" / "test.parquet",
                        {"id": [str(i) for i in range(rows)],
                         "question": pa.array(questions).dictionary_encode(),
                         "golden_answers": [["a", "b"]] * rows})
    records = read_data_file(path)
    assert [r["question"] for _, r in records] == questions
    assert records[0] == (f"{path} record 0",
                          {"id": "0", "question": questions[0], "golden_answers": ["a", "b"]})
    frame = read_parquet_guarded(path, ["question"])
    assert list(frame["question"]) == questions
    with pytest.raises(DataError, match=r"expand to over 1 MB in memory"):
        read_parquet_guarded(path, ["question"], ParquetLimits(decoded_bytes=MB))


def test_every_leaf_is_counted_even_when_its_pages_hold_almost_nothing(tmp_path):
    """A million empty answers in lists: a few KB of pages, 4 MB of offsets once decoded.
    The metadata's value count refuses it before anything is read."""
    rows = 1_000
    path = _write_table(tmp_path / "nq" / "test.parquet",
                        {"id": [str(i) for i in range(rows)], "question": ["q?"] * rows,
                         "golden_answers": [[""] * 1_000] * rows})
    assert path.stat().st_size < 64 * 1024
    with pytest.raises(DataError, match=r"the columns golden_answers expand to over 2 MB"):
        read_parquet_guarded(path, ["golden_answers"], ParquetLimits(decoded_bytes=2 * MB))


def test_text_that_cannot_be_measured_before_decoding_is_refused_from_the_metadata(tmp_path):
    """DELTA_BYTE_ARRAY: each value may repeat the one before, so 15 KB stand for 1.3 GB
    here, and arrow cannot read it as a dictionary to count it. Before, this was called a
    damaged file."""
    rows = 20_000
    path = _write_table(tmp_path / "nq" / "test.parquet",
                        {"id": [str(i) for i in range(rows)], "question": ["7" * 65536] * rows},
                        use_dictionary=False, column_encoding={"question": "DELTA_BYTE_ARRAY"})
    assert path.stat().st_size < 64 * 1024
    with pytest.raises(DataError, match=r"the column question stores text as DELTA_BYTE_ARRAY"
                                        r".*write the file again with pandas or pyarrow"):
        load_local(tmp_path, "nq")
    frame = read_parquet_guarded(path, ["id"])  # the columns beside it still read
    assert len(frame) == rows


def test_a_parquet_file_without_a_question_column_says_so(tmp_path):
    _write_table(tmp_path / "nq" / "test.parquet", {"id": ["1"], "text": ["q?"]})
    with pytest.raises(DataError, match=r"no 'question' column \(columns: id, text\)"):
        load_local(tmp_path, "nq")


def test_the_merged_parquet_streams_and_keeps_one_data_source(tmp_path):
    path = _write_table(tmp_path / "test.parquet", {
        "data_source": ["nq", "hotpotqa", "nq"],
        "prompt": [[{"role": "user", "content": f"Answer it. Question: q{i}?"}] for i in range(3)],
        "reward_model": [{"ground_truth": {"target": [f"a{i}"]}} for i in range(3)],
        "extra_info": [{"index": i} for i in range(3)]})
    questions = load_merged(path, "nq")
    assert [(q.id, q.question, q.golden_answers) for q in questions] == [
        ("nq_0", "q0?", ["a0"]), ("nq_2", "q2?", ["a2"])]
    with pytest.raises(DataError, match=r"no 'musique' rows \(data sources: hotpotqa, nq\)"):
        load_merged(path, "musique")


# ---------------------------------------------------------------------------- JSON lines


def _jsonl(root: Path, lines: list[bytes | str]) -> Path:
    path = root / "nq" / "test.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        for line in lines:
            out.write(line if isinstance(line, bytes) else line.encode("utf-8"))
    return path


def _record(qid: str, question: str, answers: list[str]) -> str:
    return json.dumps({"id": qid, "question": question, "golden_answers": answers}) + "\n"


def _normal(qid: str, index: int) -> str:
    question, (golden, _) = list(FACTS.items())[index]
    return _record(qid, question, golden)


def test_an_over_long_line_is_bad_input_that_names_the_line_and_the_fix(tmp_path):
    """A 3 MB line between two normal ones refuses the file (exit 2 at the CLI): it is not
    parsed, so nothing of it can be asked or recorded. Before, it became an errored question
    and the run exited 1, where the docs promise exit 2 for bad input."""
    big = _record("big", "who wrote this " * 200_000, ["x"])
    _jsonl(tmp_path / "D", [_normal("q1", 2), big, _normal("q3", 1)])
    with pytest.raises(DataError) as refused:
        load_with_warnings("nq", tmp_path / "D")
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'D' / 'nq' / 'test.jsonl'}:2: a line of "
                              f"{(len(big) - 1) / MB:.1f} MB (record id 'big'), over the "
                              "limit of 1.0 MB for one line of a benchmark file")
    assert "Shorten or remove that record" in message
    assert message.endswith("Then run the same command again.")


@pytest.mark.slow
def test_an_over_long_line_through_the_cli_is_exit_2_and_runs_once_fixed(tmp_path,
                                                                          tiny_models):
    """A 4 MB line: exit 2 naming it, before the model loads and with nothing written; the
    same command runs every question once the record is fixed."""
    data = tmp_path / "D"
    path = _jsonl(data, [_normal("q1", 0), _record("big", "who wrote this " * 270_000, ["x"]),
                         _normal("q3", 1)])
    out = tmp_path / "out"
    args = ["--datasets", "nq", "--data-dir", str(data), "--model",
            str(tiny_models["scripted"]), "--engine", "bm25s", "--output", str(out)]
    done = _cli(*args)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "test.jsonl:2: a line of 3.9 MB (record id 'big'), over the limit of 1.0 MB" \
        in done.stderr
    assert not (out / "nq.jsonl").exists()
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + _record("big", "Who wrote this?", ["x"]) + lines[2])
    done = _cli(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert {r.id: r.stop_reason != "error" for r in load_run(out).records["nq"]} == \
        {"q1": True, "big": True, "q3": True}


def test_an_over_long_line_is_never_held_whole(tmp_path):
    """A 64 MB line is read past in 1 MiB pieces to measure it: the peak grows by a few MB,
    not by the line and its copies (read, decoded, split and parsed: several times 64 MB
    before)."""
    _jsonl(tmp_path / "warm", [_normal("w", 0)])
    _jsonl(tmp_path / "D", [_normal("q1", 0), _record("big", "x" * (64 * MB), ["x"]),
                            _normal("q3", 1)])
    growth, outcome = _peak_growth(tmp_path / "warm", "load", tmp_path / "D")
    assert outcome.startswith("DataError: ") and ":2: a line of 64.0 MB" in outcome
    assert growth < 16 * MB, f"peak grew {growth / MB:.0f} MB for a 64 MB line"


@pytest.mark.parametrize("layout", ["id-first", "id-last", "no-id", "last-line-unended"])
def test_an_over_long_line_is_named_by_its_line_and_the_id_at_its_ends(tmp_path, layout):
    question = "q" * (MAX_RECORD_BYTES + 10)
    big = {"id-first": _record("big", question, ["x"]),
           "id-last": json.dumps({"question": question, "golden_answers": ["x"], "id": 7}) + "\n",
           "no-id": json.dumps({"question": question}) + "\n",
           "last-line-unended": _record("big", question, ["x"]).rstrip("\n")}[layout]
    lines = [_normal("q1", 0), big] + ([] if layout == "last-line-unended" else
                                       [_normal("q3", 1)])
    _jsonl(tmp_path, lines)
    size = len(big.rstrip("\n"))
    named = {"id-first": " (record id 'big')", "id-last": " (record id '7')", "no-id": "",
             "last-line-unended": " (record id 'big')"}[layout]
    with pytest.raises(DataError) as refused:
        load_local(tmp_path, "nq")
    assert str(refused.value).startswith(
        f"{tmp_path / 'nq' / 'test.jsonl'}:2: a line of {size / MB:.1f} MB{named}, over the "
        "limit of 1.0 MB")


def test_a_line_at_the_limit_is_a_record_like_any_other(tmp_path):
    prefix = '{"id": "edge", "question": "q?", "golden_answers": ["x"], "metadata": {"pad": "'
    line = prefix + "z" * (MAX_RECORD_BYTES - len(prefix) - 3) + '"}}'
    assert len(line) == MAX_RECORD_BYTES  # the newline aside
    _jsonl(tmp_path, [line + "\n", line])  # ended by a newline, then by the end of the file
    questions, _, _ = load_local(tmp_path, "nq")
    assert [(q.id, q.question, getattr(q, "problem", None)) for q in questions] == \
        [("edge", "q?", None)] * 2


def test_a_question_over_the_character_limit_is_an_error_for_that_record(tmp_path,
                                                                         local_retriever):
    long = "why " * (MAX_QUESTION_CHARS // 4 + 1)
    assert len(long.encode()) < MAX_RECORD_BYTES  # the line itself is within its limit
    _jsonl(tmp_path / "D", [_normal("q1", 0), _record("long", long, ["x"])])
    questions, _ = load_with_warnings("nq", tmp_path / "D")
    assert questions[1].question.startswith("why why") and len(questions[1].question) < 300
    assert f"the question is {len(long):,} characters, over the limit of " \
           f"{MAX_QUESTION_CHARS:,}" in questions[1].problem
    out = tmp_path / "nq.jsonl"
    records = {r.id: r for r in evaluate(questions, scripted(), local_retriever,
                                         AgentSettings(), out)}
    assert records["long"].stop_reason == "error" and records["long"].golden_answers == ["x"]
    assert records["q1"].stop_reason == "answer"
    assert len(out.read_bytes()) < 64 * 1024


def test_a_json_document_over_its_limit_asks_for_json_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(benchmarks, "MAX_JSON_DOCUMENT_BYTES", 1024)
    path = tmp_path / "nq" / "test.json"
    path.parent.mkdir()
    path.write_text(json.dumps([{"id": str(i), "question": "q?", "golden_answers": ["a"]}
                                for i in range(100)]))
    with pytest.raises(DataError, match=r"test\.json: a JSON document of .* over the limit of "
                                        r"1 KB .*write it as JSON lines"):
        load_local(tmp_path, "nq")
    path.write_text("".join(_record(str(i), "q?", ["a"]) for i in range(100)))  # JSON lines
    assert len(load_local(tmp_path, "nq")[0]) == 100
