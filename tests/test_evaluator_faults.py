"""The evaluator under bad input and faults: nothing of the user's is deleted, an outage
never reads as a result, and every bad input is a message with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from agent.loop import AgentSettings
from agent.testing import ROOT
from evaluator.benchmarks import DataError, ParquetLimits, load_with_warnings, read_parquet_guarded
from evaluator.report import completion_note, mark_completion, summarize_run, write_summary
from evaluator.rundir import (
    LOCK_FILE,
    RunDirError,
    check_run_dir,
    load_run,
    prepare_run_dir,
    run_settings,
)
from evaluator.runner import RunStopped, evaluate
from evaluator.summary import aggregate
from tests.test_evaluator import FACTS, questions, scripted

DEAD_RETRIEVER = "http://127.0.0.1:9/retrieve"  # port 9 (discard): nothing listens


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "evaluator", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _data(root: Path, count: int = 4, name: str = "nq") -> Path:
    """DIR/<name>/test.jsonl with `count` questions cycling through FACTS."""
    items = list(FACTS.items())
    lines = [json.dumps({"id": f"{name}-{i}", "question": items[i % len(items)][0],
                         "golden_answers": items[i % len(items)][1][0]}) for i in range(count)]
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "test.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def _tree(root: Path) -> dict[str, str]:
    """Every file under `root` and its text, the run lock's file aside (it holds a pid)."""
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != LOCK_FILE}


# ---------------------------------------------------------------------------- data loss


def test_overwrite_refuses_a_directory_that_is_not_a_run(tmp_path):
    """A `{}` settings.json beside the user's code, --overwrite and a model that does not
    exist: refused, and nothing in the directory is touched."""
    out = tmp_path / "x"
    (out / "src").mkdir(parents=True)
    (out / "settings.json").write_text("{}\n")
    (out / "src" / "main.py").write_text("code\n")
    before = _tree(out)
    done = _cli("--datasets", "nq", "--data-dir", str(_data(tmp_path / "D")), "--limit", "1",
                "--model", "/nonexistent", "--output", str(out), "--overwrite")
    assert done.returncode == 2, done.stderr
    assert "not a run directory" in done.stderr and "Traceback" not in done.stderr
    assert _tree(out) == before


@pytest.mark.slow
def test_overwrite_waits_for_the_model_and_removes_only_the_evaluators_files(tmp_path):
    out = tmp_path / "run"
    prepare_run_dir(out, run_settings("old-model", "transformers", "bm25:default",
                                      AgentSettings(), seed=0, limit=1, sample=None,
                                      datasets=["nq"]))
    (out / "nq.jsonl").write_text('{"id": "1"}\n')
    (out / "summary.md").write_text("old summary\n")
    (out / "notes.txt").write_text("mine\n")
    (out / "src").mkdir()
    (out / "src" / "main.py").write_text("code\n")
    args = ["--datasets", "nq", "--data-dir", str(_data(tmp_path / "D")), "--limit", "1",
            "--output", str(out), "--overwrite"]
    before = _tree(out)
    failed = _cli(*args, "--model", str(tmp_path / "no-such-model"))
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert _tree(out) == before  # the model did not load: nothing was touched
    plan = check_run_dir(out, {"model": "new", "datasets": ["nq"]}, overwrite=True)
    assert sorted(p.name for p in plan.remove) == ["nq.jsonl", "summary.md"]
    prepare_run_dir(out, {"model": "new", "datasets": ["nq"]}, overwrite=True)
    assert _tree(out) == {"notes.txt": "mine\n", "src/main.py": "code\n",
                          "settings.json": '{\n  "model": "new",\n  "datasets": [\n    "nq"\n'
                                           '  ],\n  "written_by": "evaluator"\n}\n'}


def test_without_overwrite_nothing_of_the_users_is_removed(tmp_path):
    """A directory holding the user's own summary.md is not a run: refused, file kept."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "summary.md").write_text("my own notes\n")
    with pytest.raises(RunDirError, match="not a run directory.*summary.md"):
        prepare_run_dir(out, {"model": "m", "datasets": ["nq"]})
    assert _tree(out) == {"summary.md": "my own notes\n"}
    # A file of the user's named like a dataset this run would write is not appended to.
    run = tmp_path / "run"
    prepare_run_dir(run, {"model": "m", "datasets": ["nq"]})
    (run / "hotpotqa.jsonl").write_text("mine\n")
    with pytest.raises(RunDirError, match="hotpotqa.jsonl, which this run did not write"):
        prepare_run_dir(run, {"model": "m", "datasets": ["hotpotqa"]})
    assert (run / "hotpotqa.jsonl").read_text() == "mine\n"


def test_settings_json_is_written_whole(tmp_path):
    run = tmp_path / "run"
    prepare_run_dir(run, {"model": "m", "datasets": ["nq"]})
    assert json.loads((run / "settings.json").read_text()) == {"model": "m", "datasets": ["nq"],
                                                               "written_by": "evaluator"}
    assert [p.name for p in run.iterdir()] == ["settings.json"]  # no temporary left behind


# ---------------------------------------------------------------------------- clear errors


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path.parent.parent


BAD_DATA = {
    "non-utf8": ("nq/test.jsonl", b'{"id": "1", "question": "q", "golden_answers": ["a"]}\n'
                 b'{"id": "2", "question": "caf\xe9", "golden_answers": ["b"]}\n',
                 r"nq/test\.jsonl:2: not UTF-8 text"),
    "text-parquet": ("nq/test.parquet", "id,question\n1,q\n", r"test\.parquet: not a parquet"),
    "number-answers": ("nq/test.jsonl", '{"id": "1", "question": "q", "golden_answers": 42}\n',
                       r"test\.jsonl:1: golden_answers is a int \(42\).*\[\"42\"\]"),
    "not-an-object": ("nq/test.jsonl", '{"id": "1", "question": "q", "golden_answers": ["a"]}\n'
                      '["q", "a"]\n', r"test\.jsonl:2: a record must be a JSON object"),
}


@pytest.mark.parametrize("case", sorted(BAD_DATA))
def test_bad_data_files_name_the_file_and_record(tmp_path, case):
    relative, content, message = BAD_DATA[case]
    root = _write(tmp_path / relative, content)
    with pytest.raises(DataError, match=message):
        load_with_warnings("nq", data_dir=root)


def test_bad_data_through_the_cli_is_exit_2_without_traceback(tmp_path):
    relative, content, message = BAD_DATA["number-answers"]
    root = _write(tmp_path / relative, content)
    done = _cli("--datasets", "nq", "--data-dir", str(root), "--model", "/nonexistent")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "golden_answers is a int (42)" in done.stderr


@pytest.mark.parametrize("flags", [["--topk", "0"], ["--max-turns", "-1"], ["--limit", "-1"],
                                   ["--sample", "-5"], ["--batch-size", "0"],
                                   ["--max-consecutive-errors", "-3"]])
@pytest.mark.slow
def test_nonsense_values_stop_at_parsing(tmp_path, flags):
    done = _cli("--datasets", "nq", "--data-dir", str(tmp_path), *flags)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"argument {flags[0]}" in done.stderr and "below the smallest allowed" in done.stderr


def test_output_file_and_settings_not_json_are_exit_2(tmp_path):
    data = _data(tmp_path / "D")
    a_file = tmp_path / "results.txt"
    a_file.write_text("mine\n")
    done = _cli("--datasets", "nq", "--data-dir", str(data), "--output", str(a_file),
                "--model", "/nonexistent")
    assert done.returncode == 2 and "is a file, not a directory" in done.stderr
    assert a_file.read_text() == "mine\n"
    out = tmp_path / "run"
    out.mkdir()
    (out / "settings.json").write_text("model: x\n")
    done = _cli("--datasets", "nq", "--data-dir", str(data), "--output", str(out),
                "--model", "/nonexistent")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{out / 'settings.json'} is not a JSON settings file" in done.stderr
    report = _cli("report", str(out))
    assert report.returncode == 2 and "not a JSON settings file" in report.stderr


def test_duplicate_ids_and_missing_answers_are_warned_and_not_scored(tmp_path):
    lines = [{"id": "a", "question": "q1", "golden_answers": ["x"]},
             {"id": "a", "question": "q2", "golden_answers": ["y"]},
             {"id": "b", "question": "q3", "golden_answers": []},
             {"id": "c", "question": "q4"},
             {"id": "d", "question": "q5", "golden_answers": ["z"]}]
    _write(tmp_path / "nq" / "test.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    chosen, notes = load_with_warnings("nq", data_dir=tmp_path)
    assert [q.id for q in chosen] == ["a", "d"] and chosen[0].question == "q1"
    assert any("2 record(s) have no golden answers (e.g. id 'b')" in n for n in notes)
    assert any("1 record(s) repeat an id already seen (e.g. 'a')" in n for n in notes)


# ---------------------------------------------------------------------------- parquet guard


def test_parquet_guard_refuses_before_materialising(tmp_path):
    path = tmp_path / "nq" / "test.parquet"
    path.parent.mkdir()
    rows = 50_000
    pd.DataFrame({"id": [str(i) for i in range(rows)], "question": ["q" * 200] * rows,
                  "golden_answers": [["a"]] * rows}).to_parquet(path)
    assert path.stat().st_size < 2**20  # repeated values compress to almost nothing
    with pytest.raises(DataError, match=r"expand to over 5 MB in memory"):
        read_parquet_guarded(path, ["id", "question"], ParquetLimits(decoded_bytes=5 * 2**20))
    with pytest.raises(DataError, match=r"50,000 rows .* over the limit of 1,000 rows"):
        read_parquet_guarded(path, ["id"], ParquetLimits(rows=1_000))
    frame = read_parquet_guarded(path, ["id", "golden_answers", "not-a-column"])
    assert list(frame.columns) == ["id", "golden_answers"] and len(frame) == rows


# ---------------------------------------------------------------------------- outages


class _DownFor:
    """A retriever that fails for the questions in `down` (a test double beside the real
    dead URL used by the CLI tests)."""

    def __init__(self, working, down: set[str]):
        self.working, self.down = working, down

    def search(self, queries, topk=3):
        from retriever.client import RetrieverError

        if any(q.strip() in self.down for q in queries):
            raise RetrieverError(f"Could not reach the retriever at {DEAD_RETRIEVER}")
        return self.working.search(queries, topk)


def test_consecutive_errors_stop_the_run_and_a_success_resets_the_count(tmp_path,
                                                                       local_retriever):
    run = tmp_path / "run"
    prepare_run_dir(run, {"model": "scripted", "datasets": ["nq"]})
    path = run / "nq.jsonl"
    qs = questions()
    every = _DownFor(local_retriever, {q.question for q in qs})
    with pytest.raises(RunStopped, match="2 questions in a row") as stop:
        list(evaluate(qs, scripted(), every, AgentSettings(), path, batch_size=1,
                      max_consecutive_errors=2))
    assert "Could not reach the retriever" in stop.value.first_error
    assert len(path.read_text().splitlines()) == 2  # stopped: the rest never ran
    # Errors that alternate with answers never reach two in a row.
    other = tmp_path / "other.jsonl"
    some = _DownFor(local_retriever, {qs[0].question, qs[2].question})
    records = list(evaluate(qs, scripted(), some, AgentSettings(), other, batch_size=1,
                            max_consecutive_errors=2))
    assert [r.stop_reason for r in records] == ["error", "answer", "error", "answer"]


def test_errored_questions_are_not_scored_as_answers(tmp_path, local_retriever):
    """An errored question is counted apart, not as an answer scoring EM 0."""
    run = tmp_path / "run"
    prepare_run_dir(run, {"model": "scripted", "datasets": ["nq"], "expected": {"nq": 4}})
    qs = questions()
    down = _DownFor(local_retriever, {qs[1].question, qs[3].question})
    list(evaluate(qs, scripted(), down, AgentSettings(), run / "nq.jsonl", batch_size=1))
    summary = write_summary(run)
    nq = summary["datasets"]["nq"]
    assert nq["n"] == 2 and nq["errored"] == 2 and nq["em"] == 1.0  # Kubrick and Leonardo
    assert summary["complete"] is False and summary["errored"] == 2
    assert "Could not reach the retriever" in summary["first_error"]
    assert "Run the same command again to resume" in summary["note"]
    assert "| nq | 2/4 (2 errored) |" in (run / "summary.md").read_text()
    # Resumed with the retriever back: complete, every question scored once.
    list(evaluate(qs, scripted(), local_retriever, AgentSettings(), run / "nq.jsonl"))
    summary = write_summary(run)
    assert summary["complete"] and summary["note"] is None
    assert summary["datasets"]["nq"]["n"] == 4 and summary["datasets"]["nq"]["errored"] == 0


def test_what_the_evaluate_tab_gets(tmp_path, local_retriever):
    """aggregate + mark_completion + completion_note: the UI's incomplete, errored, why and
    how to resume, without reading a summary file."""
    qs = questions()
    records = list(evaluate(qs, scripted(), _DownFor(local_retriever, {qs[0].question}),
                            AgentSettings(), tmp_path / "nq.jsonl", batch_size=1))
    stats = aggregate(records)
    mark_completion(stats, len(qs))
    assert stats["complete"] is False and stats["errored"] == 1 and stats["n"] == 3
    note = completion_note({"nq": stats})
    assert note.startswith("Incomplete run. 1 question(s) ended in an error")
    assert "Could not reach the retriever" in note and "resume" in note


def _retriever_that_answers_once() -> str:
    """The URL of a Search-R1-format retriever on a free loopback port that answers one
    request (the evaluator's start-up check) and then stops listening: an outage that
    begins after the run has started."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Once(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = json.dumps({"result": [[{"document": {"id": "1", "contents": '"T"\nx'},
                                            "score": 1.0}]]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            threading.Thread(target=server.shutdown).start()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Once)
    threading.Thread(target=lambda: (server.serve_forever(), server.server_close()),
                     daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/retrieve"


@pytest.mark.slow
def test_outage_through_the_cli_exits_non_zero_with_an_incomplete_summary(tmp_path,
                                                                          tiny_models):
    """A retriever that goes down after the start-up check, and --limit 8: exit 1 and a
    summary marked incomplete, never EM 0.000 over 8 'answered' questions."""
    out = tmp_path / "out"
    data = str(_data(tmp_path / "D", count=12))

    def args(url: str) -> list[str]:
        return ["--datasets", "nq", "--data-dir", data, "--limit", "8", "--model",
                str(tiny_models["scripted"]), "--retriever-url", url, "--output", str(out)]

    done = _cli(*args(_retriever_that_answers_once()))
    assert done.returncode == 1, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    nq = summary["datasets"]["nq"]
    assert nq["n"] == 0 and nq["errored"] == 8 and nq["em"] is None
    assert summary["complete"] is False and "Could not reach the retriever" in summary["note"]
    assert "Incomplete run. 8 question(s) ended in an error" in done.stdout
    assert "Run the same command again to resume" in done.stderr
    stopped = _cli(*args(_retriever_that_answers_once()), "--max-consecutive-errors", "3",
                   "--overwrite")
    assert stopped.returncode == 1
    assert "stopped after 3 questions in a row ended in an error" in stopped.stderr
    assert len(load_run(out).records["nq"]) == 3


@pytest.mark.slow
def test_limit_over_the_set_size_is_complete(tmp_path, tiny_models):
    """FlashRAG's quick-start nq/test.jsonl has 17 questions: --limit 20 gives 17/17,
    complete, not 17/20 and partial."""
    out = tmp_path / "out"
    done = _cli("--datasets", "nq", "--data-dir", str(_data(tmp_path / "D", count=17)),
                "--limit", "20", "--model", str(tiny_models["scripted"]), "--engine", "bm25s",
                "--batch-size", "6", "--output", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    summary = summarize_run(out)
    assert summary["datasets"]["nq"]["n"] == 17 and summary["datasets"]["nq"]["expected"] == 17
    assert summary["complete"] and "Partial" not in done.stdout
    assert "| nq | 17 |" in done.stdout


def test_compare_with_a_dataset_whose_every_question_errored(tmp_path, local_retriever):
    from evaluator.compare import compare_runs

    qs = questions()
    runs = []
    for name, retriever in (("up", local_retriever),
                            ("down", _DownFor(local_retriever, {q.question for q in qs}))):
        run = tmp_path / name
        prepare_run_dir(run, {"model": "scripted", "datasets": ["nq"], "expected": {"nq": 4}})
        list(evaluate(qs, scripted(), retriever, AgentSettings(), run / "nq.jsonl",
                      max_consecutive_errors=0))
        runs.append(run)
    text = compare_runs(runs)
    assert "| nq | 0.500 ± 0.250 | -* | - |" in text  # no EM for 0 scored, never 0.000
    assert "avg (shared" not in text and "ended in an error" in text
