"""The evaluator against hostile or broken input and concurrent use: parquet files that
expand when decoded, settings.json files that name paths outside the run, two writers on
one run directory, a lock file replaced by a link or another file, questions that cannot be
encoded, a full disk, a damaged results line, empty data files, non-string golden answers
and an unreachable retriever."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.loop import AgentSettings
from agent.testing import ROOT
from evaluator.benchmarks import (
    DataError,
    ParquetLimits,
    load_local,
    load_with_warnings,
    local_benchmark_file,
    read_parquet_guarded,
)
from evaluator.rundir import (
    LOCK_FILE,
    RunDirError,
    check_run_dir,
    finished_ids,
    hold_run_dir,
    load_run,
    prepare_run_dir,
)
from evaluator.runner import RunWriteError, evaluate
from tests.test_evaluator import questions, scripted
from tests.test_evaluator_faults import DEAD_RETRIEVER, _cli, _data, _tree


def _dictionary_column(rows: int, value: str):
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array([value]))


# ---------------------------------------------------------------------------- parquet


def test_a_dictionary_encoded_question_column_is_measured_decoded(tmp_path):
    """One 64 KB question stored once in a dictionary and referenced by 2,048 rows: 128 MB
    decoded from a file of a few KB."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 2048
    path = tmp_path / "nq" / "test.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"id": [str(i) for i in range(rows)],
                             "question": _dictionary_column(rows, "7" * 65536),
                             "golden_answers": [["a"]] * rows}), path, compression="zstd")
    assert path.stat().st_size < 64 * 1024
    limits = ParquetLimits(decoded_bytes=32 * 2**20)
    with pytest.raises(DataError, match=r"expand to over 32 MB in memory"):
        read_parquet_guarded(path, ["id", "question", "golden_answers"], limits)
    with pytest.raises(DataError, match=r"the columns question expand to over 64 MB"):
        read_parquet_guarded(path, ["question"], ParquetLimits(decoded_bytes=64 * 2**20))
    # The same column within the limit loads as plain text, row by row.
    frame = read_parquet_guarded(path, ["id", "question"], ParquetLimits(decoded_bytes=2**30))
    assert frame["question"].iloc[-1] == "7" * 65536 and len(frame) == rows


def test_dictionary_answers_inside_lists_and_plain_repeats_are_measured_too(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 2048
    nested = tmp_path / "nested.parquet"  # no arrow schema stored: parquet's own dictionary
    pq.write_table(pa.table({"id": [str(i) for i in range(rows)], "question": ["q"] * rows,
                             "golden_answers": [["7" * 65536]] * rows}), nested,
                   compression="zstd", store_schema=False)
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"id": [str(i) for i in range(rows)],
                             "question": ["7" * 65536] * rows}), plain, compression="zstd",
                   use_dictionary=False)
    limits = ParquetLimits(decoded_bytes=32 * 2**20)
    for path in (nested, plain):
        assert path.stat().st_size < 512 * 1024
        with pytest.raises(DataError, match=r"expand to over 32 MB in memory"):
            read_parquet_guarded(path, ["id", "question", "golden_answers"], limits)
    frame = read_parquet_guarded(nested, ["id", "golden_answers"], ParquetLimits())
    assert list(frame["golden_answers"].iloc[0]) == ["7" * 65536]


# ---------------------------------------------------------------------------- --overwrite


def test_overwrite_never_follows_dataset_names_out_of_the_run_directory(tmp_path):
    """A settings.json naming `../v/d` with a model and datasets, but not written by the
    evaluator: nothing is deleted, outside the directory or in it."""
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "d.jsonl").write_text("keep\n")
    out = tmp_path / "x"
    out.mkdir()
    (out / "settings.json").write_text('{"model":"m","datasets":["../v/d"]}\n')
    before = _tree(tmp_path)
    done = _cli("--datasets", "vitalqa", "--model", "nano", "--limit", "2", "--output", str(out),
                "--overwrite")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "was not written by this evaluator" in done.stderr
    assert _tree(tmp_path) == before


def test_even_a_marked_run_removes_only_file_names_the_evaluator_writes(tmp_path):
    run = tmp_path / "run"
    prepare_run_dir(run, {"model": "m", "datasets": ["nq"]})
    stored = json.loads((run / "settings.json").read_text())
    stored["datasets"] = ["nq", "../v/d", "/etc/passwd", "sub/dir", ".hidden"]
    (run / "settings.json").write_text(json.dumps(stored))
    (run / "nq.jsonl").write_text("{}\n")
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "d.jsonl").write_text("keep\n")
    plan = check_run_dir(run, {"model": "other", "datasets": ["nq"]}, overwrite=True)
    assert [p.name for p in plan.remove] == ["nq.jsonl"]
    assert all(p.parent == run for p in plan.remove)
    with pytest.raises(RunDirError, match=r"'\.\./x' is not a dataset name"):
        check_run_dir(tmp_path / "new", {"model": "m", "datasets": ["../x"]})


# ---------------------------------------------------------------------------- one writer


_HOLD = """
import sys, time
from evaluator.rundir import hold_run_dir
with hold_run_dir(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


def _holding(run_dir: Path) -> subprocess.Popen:
    """A second process that holds `run_dir`'s lock until told to let go."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(run_dir)], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_evaluator_on_a_held_run_directory_exits_at_once(tmp_path):
    data = _data(tmp_path / "D", count=4)
    fresh, earlier = tmp_path / "fresh", tmp_path / "earlier"
    prepare_run_dir(earlier, {"model": "earlier", "datasets": ["nq"]})
    (earlier / "nq.jsonl").write_text('{"id": "nq-0", "stop_reason": "answer"}\n')
    for out, extra in ((fresh, []), (earlier, ["--overwrite"])):
        holder = _holding(out)
        try:
            before = _tree(out)
            start = time.monotonic()
            done = _cli("--datasets", "nq", "--data-dir", str(data), "--limit", "2",
                        "--model", "nano", "--output", str(out), *extra)
            assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
            assert f"another evaluator (pid {holder.pid}) is writing to {out}" in done.stderr
            assert _tree(out) == before
            assert time.monotonic() - start < 60  # refused before any model loaded
        finally:
            holder.communicate("done\n", timeout=30)
        assert (out / LOCK_FILE).is_file()  # left in place; the next run takes it


def test_the_lock_file_alone_does_not_make_a_directory_foreign(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).write_text("123\n")
    prepare_run_dir(out, {"model": "m", "datasets": ["nq"]})
    assert (out / "settings.json").is_file()


def _enter(run_dir: Path) -> None:
    with hold_run_dir(run_dir):
        pass


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "hard link"])
def test_a_lock_file_that_is_a_link_is_refused_and_what_it_points_to_is_kept(tmp_path, kind):
    """Before, the lock was opened through the link and emptied: the user's file was
    replaced by the evaluator's pid."""
    run = tmp_path / "run"
    run.mkdir()
    target = tmp_path / "notes.txt"
    if kind != "dangling symlink":
        target.write_text("mine\n")
    if kind == "hard link":
        os.link(target, run / LOCK_FILE)
    else:
        (run / LOCK_FILE).symlink_to(target)
    message = r"is a symbolic link, not the lock file this evaluator makes; it was not " \
        r"followed and nothing was changed" if "symlink" in kind else \
        r"has 2 names \(a hard link to another file\), so it is not the lock file"
    with pytest.raises(RunDirError, match=message):
        _enter(run)
    if kind == "dangling symlink":
        assert not target.exists()  # not created through the link either
    else:
        assert target.read_text() == "mine\n"
    assert (run / LOCK_FILE).is_symlink() == ("symlink" in kind)


@pytest.mark.parametrize("kind", ["directory", "someone's file", "fifo"])
def test_a_lock_name_holding_something_else_is_left_as_it_is(tmp_path, kind):
    run = tmp_path / "run"
    run.mkdir()
    lock = run / LOCK_FILE
    if kind == "directory":
        lock.mkdir()
        (lock / "inside").write_text("mine\n")
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.write_text("my notes, not a pid\n")
    reason = {"directory": "is not a regular file", "fifo": "is not a regular file",
              "someone's file": "holds something other than the pid this evaluator writes"}
    with pytest.raises(RunDirError, match=rf"{LOCK_FILE} {reason[kind]}.*nothing was changed"):
        _enter(run)
    if kind == "directory":
        assert (lock / "inside").read_text() == "mine\n"
    elif kind == "someone's file":
        assert lock.read_text() == "my notes, not a pid\n"
    else:
        assert lock.is_fifo()


def test_a_lock_this_evaluator_wrote_is_taken_again(tmp_path):
    run = tmp_path / "run"
    _enter(run)
    assert (run / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    (run / LOCK_FILE).write_text("")  # a holder killed between creating and writing it
    _enter(run)
    assert (run / LOCK_FILE).read_text() == f"{os.getpid()}\n"


def test_a_symlinked_lock_through_the_cli_is_exit_2_and_changes_nothing(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    target = tmp_path / "notes.txt"
    target.write_text("mine\n")
    (out / LOCK_FILE).symlink_to(target)
    done = _cli("--datasets", "nq", "--data-dir", str(_data(tmp_path / "D")), "--model", "nano",
                "--output", str(out))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"{out / LOCK_FILE} is a symbolic link" in done.stderr
    assert target.read_text() == "mine\n" and sorted(p.name for p in out.iterdir()) == [LOCK_FILE]


# ---------------------------------------------------------------------------- questions


@pytest.mark.slow
def test_a_question_that_cannot_be_encoded_is_an_error_for_that_question_only(
        tmp_path, tiny_models):
    data = tmp_path / "D" / "nq"
    data.mkdir(parents=True)
    texts = ["\ud800 who painted the mona lisa", "Who painted the Mona Lisa?",
             "What is the capital of France?"]
    (data / "test.jsonl").write_text("".join(
        json.dumps({"id": f"q{i}", "question": t, "golden_answers": ["x"]}) + "\n"
        for i, t in enumerate(texts)))
    out = tmp_path / "out"
    args = ["--datasets", "nq", "--data-dir", str(data.parent), "--model",
            str(tiny_models["scripted"]), "--engine", "bm25s", "--output", str(out)]
    for _ in range(2):  # the run, then a resume
        done = _cli(*args)
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        assert done.returncode == 1  # incomplete: one question could not run
        records = {r.id: r for r in load_run(out).records["nq"]}
        assert set(records) == {"q0", "q1", "q2"}
        assert records["q0"].stop_reason == "error"
        assert "cannot be encoded as UTF-8" in records["q0"].error
        assert "position 0" in records["q0"].error
        assert records["q1"].stop_reason != "error" and records["q2"].stop_reason != "error"


# ---------------------------------------------------------------------------- disk faults


def test_a_full_disk_is_a_message_that_keeps_what_was_written(tmp_path, local_retriever,
                                                              monkeypatch):
    from evaluator import rundir, runner

    path = tmp_path / "nq.jsonl"
    real_append = rundir.append_record
    calls = []

    def disk_full_on_the_third(out, record):
        calls.append(record.id)
        if len(calls) == 3:
            out.write('{"id": "half')
            out.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_append(out, record)

    monkeypatch.setattr(runner, "append_record", disk_full_on_the_third)
    with pytest.raises(RunWriteError) as caught:
        list(evaluate(questions(), scripted(), local_retriever, AgentSettings(), path,
                      batch_size=1))
    message = str(caught.value)
    assert "No space left on device" in message and str(path) in message
    assert "2 finished question(s) before it are kept" in message
    assert "run the same command again" in message
    assert len(finished_ids(path)) == 2
    monkeypatch.setattr(runner, "append_record", real_append)
    resumed = list(evaluate(questions(), scripted(), local_retriever, AgentSettings(), path))
    assert len(resumed) == 2
    assert len(load_run(tmp_path).records["nq"]) == 4


@pytest.mark.slow
def test_a_full_disk_through_the_cli_is_exit_1_with_the_message(tmp_path, tiny_models,
                                                                monkeypatch, capsys):
    from evaluator import runner
    from evaluator.__main__ import main

    def no_space(out, record):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(runner, "append_record", no_space)
    out = tmp_path / "out"
    code = main(["--datasets", "nq", "--data-dir", str(_data(tmp_path / "D", count=2)),
                 "--model", str(tiny_models["scripted"]), "--engine", "bm25s",
                 "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and "No space left on device" in err and "Traceback" not in err


def test_a_damaged_middle_line_is_skipped_with_a_warning_and_its_question_runs_again(
        tmp_path, local_retriever, capsys):
    from evaluator.__main__ import warn_about_damaged_results

    path = tmp_path / "nq.jsonl"
    prepare_run_dir(tmp_path, {"model": "m", "datasets": ["nq"]})
    list(evaluate(questions(), scripted(), local_retriever, AgentSettings(), path))
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = b'{"id": "nq-0-1", \xff\xfe garbage\n'
    path.write_bytes(b"".join(lines))
    assert len(finished_ids(path)) == 3
    warn_about_damaged_results(tmp_path, ["nq"])
    assert f"{path}:2 is not a whole result record" in capsys.readouterr().err
    resumed = list(evaluate(questions(), scripted(), local_retriever, AgentSettings(), path))
    assert [r.id for r in resumed] == ["nq-0-1"]
    assert len(load_run(tmp_path).records["nq"]) == 4
    assert path.read_bytes().splitlines()[1] == lines[1].rstrip(b"\n")  # kept as it was


# ---------------------------------------------------------------------------- data files


def test_an_empty_data_file_is_a_clear_error(tmp_path):
    (tmp_path / "nq").mkdir()
    (tmp_path / "nq" / "test.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match=r"test.jsonl holds no records"):
        load_with_warnings("nq", tmp_path)
    done = _cli("--datasets", "nq", "--data-dir", str(tmp_path), "--model", "nano")
    assert done.returncode == 2 and "holds no records" in done.stderr


@pytest.mark.parametrize("answers, position, kind", [([1, None], 0, "int"),
                                                     (["Paris", None], 1, "null"),
                                                     (["a", ["b"]], 1, "list")])
def test_golden_answers_that_are_not_strings_are_refused(tmp_path, answers, position, kind):
    (tmp_path / "nq").mkdir()
    (tmp_path / "nq" / "test.jsonl").write_text(
        json.dumps({"id": "1", "question": "q?", "golden_answers": answers}) + "\n")
    with pytest.raises(DataError, match=rf"test.jsonl:1: golden_answers\[{position}\] is "
                                        rf"{kind} .*not a string"):
        load_local(tmp_path, "nq")


def test_the_shipped_benchmark_file_is_found_by_name():
    path = local_benchmark_file("vitalqa")
    assert path == ROOT / "assets" / "vitalqa" / "test.jsonl" and path.is_file()
    with pytest.raises(DataError, match="not a set shipped"):
        local_benchmark_file("nq")


# ---------------------------------------------------------------------------- retriever


def test_an_unreachable_retriever_url_is_found_before_the_first_question(tmp_path):
    out = tmp_path / "out"
    start = time.monotonic()
    done = _cli("--datasets", "nq", "--data-dir", str(_data(tmp_path / "D")), "--model",
                "nano", "--retriever-url", DEAD_RETRIEVER, "--output", str(out))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"Could not reach the retriever at {DEAD_RETRIEVER}" in done.stderr
    assert not (out / "nq.jsonl").exists()
    assert time.monotonic() - start < 60


def test_an_output_that_cannot_be_created_is_a_message(tmp_path):
    (tmp_path / "a-file").write_text("mine\n")
    done = _cli("--datasets", "nq", "--data-dir", str(_data(tmp_path / "D")), "--model", "nano",
                "--output", str(tmp_path / "a-file" / "run"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "cannot create" in done.stderr and LOCK_FILE in done.stderr
    assert (tmp_path / "a-file").read_text() == "mine\n"
