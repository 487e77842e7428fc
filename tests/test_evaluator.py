"""The evaluator end to end: scripted and tiny real models, the real default retriever,
fixture benchmarks written here, resume after a kill, refusal, reports."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.loop import AgentSettings
from agent.testing import ROOT
from evaluator.benchmarks import Question
from evaluator.report import write_summary
from evaluator.rundir import COMPARED, RunMismatch, load_run, prepare_run_dir, run_settings
from evaluator.runner import evaluate
from tests.scripted_backend import ScriptedBackend

FACTS = {  # question -> (golden answers, what the scripted model answers)
    "Who directed 2001: A Space Odyssey?": (["Stanley Kubrick"], "Stanley Kubrick"),
    "What is the capital of France?": (["Paris"], "the city of Paris"),
    "Who painted the Mona Lisa?": (["Leonardo da Vinci", "Leonardo"], "Leonardo da Vinci"),
    "What is the largest planet?": (["Jupiter"], "Saturn"),
}


def write_fixture(root: Path, name: str = "nq", n_copies: int = 1) -> Path:
    lines = []
    for copy in range(n_copies):
        for i, (question, (golden, _)) in enumerate(FACTS.items()):
            lines.append(json.dumps({"id": f"{name}-{copy}-{i}", "question": question,
                                     "golden_answers": golden, "metadata": {}}))
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "test.jsonl").write_text("\n".join(lines) + "\n")
    return root


def scripted() -> ScriptedBackend:
    def script(question: str, n: int) -> str:
        if n == 0:
            return f"<think>Look it up.</think>\n<search> {question} </search>"
        return f"<answer> {FACTS[question][1]} </answer>"

    return ScriptedBackend(script)


def questions(name="nq") -> list[Question]:
    return [Question(f"{name}-0-{i}", name, q, golden, {})
            for i, (q, (golden, _)) in enumerate(FACTS.items())]


def test_scores_and_records(tmp_path, local_retriever):
    run = tmp_path / "run"
    prepare_run_dir(run, {"model": "scripted", "datasets": ["nq"]})
    records = list(evaluate(questions(), scripted(), local_retriever, AgentSettings(),
                            run / "nq.jsonl", batch_size=3))
    assert len(records) == 4
    by_question = {r.question: r for r in records}
    assert by_question["Who directed 2001: A Space Odyssey?"].metrics["em"] == 1
    paris = by_question["What is the capital of France?"].metrics
    assert paris["em"] == 0 and paris["sub_em"] == 1 and 0 < paris["f1"] < 1
    assert by_question["What is the largest planet?"].metrics["em"] == 0
    kubrick = by_question["Who directed 2001: A Space Odyssey?"]
    assert kubrick.metrics["retrieval_recall"] == 1 and kubrick.searches == 1
    assert kubrick.trajectory.endswith("<answer> Stanley Kubrick </answer>")
    assert "<information>Doc 1(Title: " in kubrick.response
    stored = [json.loads(x) for x in (run / "nq.jsonl").read_text().splitlines()]
    assert stored == [r.to_dict() for r in records]
    summary = write_summary(run)
    assert summary is not None
    assert (run / "summary.md").read_text().count("nq") >= 1
    for name in ("summary.json", "summary.csv", "summary.md"):
        assert (run / name).is_file()
    # Resuming skips what is done.
    assert list(evaluate(questions(), scripted(), local_retriever, AgentSettings(),
                         run / "nq.jsonl")) == []


def test_refuses_other_settings(tmp_path):
    run = tmp_path / "run"
    prepare_run_dir(run, {"model": "a", "max_turns": 4, "datasets": ["nq"]})
    with pytest.raises(RunMismatch, match="max_turns: stored 4, now 2"):
        prepare_run_dir(run, {"model": "a", "max_turns": 2, "datasets": ["nq"]})
    prepare_run_dir(run, {"model": "a", "max_turns": 4, "datasets": ["hotpotqa"]})
    assert json.loads((run / "settings.json").read_text())["datasets"] == ["nq", "hotpotqa"]
    prepare_run_dir(run, {"model": "a", "max_turns": 2, "datasets": ["nq"]}, overwrite=True)


def test_a_truncated_last_line_is_repaired_on_resume(tmp_path, local_retriever):
    run = tmp_path / "run"
    prepare_run_dir(run, {"model": "scripted", "datasets": ["nq"]})
    path = run / "nq.jsonl"
    first = list(evaluate(questions()[:2], scripted(), local_retriever, AgentSettings(), path))
    with path.open("a") as f:
        f.write('{"id": "nq-0-2", "trunc')  # a kill mid-write
    rest = list(evaluate(questions(), scripted(), local_retriever, AgentSettings(), path))
    assert [r.id for r in rest] == ["nq-0-2", "nq-0-3"] and len(first) == 2
    ids = [json.loads(x)["id"] for x in path.read_text().splitlines()]
    assert ids == ["nq-0-0", "nq-0-1", "nq-0-2", "nq-0-3"]


def _cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evaluator", *args], cwd=ROOT,
                          capture_output=True, text=True, **kwargs)


@pytest.mark.slow
def test_cli_with_the_tiny_real_model_resumes_after_a_kill(tmp_path, tiny_models):
    data = write_fixture(tmp_path / "data", n_copies=6)  # 24 questions
    out = tmp_path / "runs" / "tiny"
    args = ["--datasets", "nq", "--data-dir", str(data), "--model", str(tiny_models["scripted"]),
            "--engine", "bm25s", "--batch-size", "2", "--output", str(out)]
    process = subprocess.Popen([sys.executable, "-m", "evaluator", *args], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    results = out / "nq.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if results.is_file() and len(results.read_text().splitlines()) >= 4:
            break
        if process.poll() is not None:
            pytest.fail(f"evaluator ended early: {process.stdout.read().decode()[-2000:]}")
        time.sleep(0.05)
    process.kill()
    process.wait()
    before = len(results.read_text().splitlines())
    assert 4 <= before < 24, "the kill should land mid-run"
    done = _cli(*args, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ids = [json.loads(x)["id"] for x in results.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 24  # nothing lost, nothing twice
    assert "| nq" in done.stdout and (out / "summary.md").is_file()
    run = load_run(out)
    # The tiny model searches first; its 500-token-capped observations then vary.
    assert all(r.searches >= 1 and r.turns >= 2 for r in run.records["nq"])
    # Same output, other settings: refused, with the way out.
    refused = _cli(*args, "--max-turns", "2")
    assert refused.returncode == 2 and "--overwrite" in refused.stderr
    # Reports over stored runs.
    report = _cli("report", str(out), str(out))
    assert report.returncode == 0 and "nq" in report.stdout
    show = _cli("show", str(out), "--dataset", "nq")
    assert show.returncode == 0


@pytest.mark.slow
def test_cli_errors_are_clear(tmp_path):
    assert "--all or --datasets" in _cli().stderr
    offline = _cli("--datasets", "bamboogle", "--model", "x/y", env={
        **__import__("os").environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert offline.returncode == 2 and "--data-dir" in offline.stderr
    missing = _cli("--datasets", "nq", "--data-dir", str(tmp_path))
    assert missing.returncode == 2 and "nq" in missing.stderr
    assert _cli("report", str(tmp_path)).returncode == 2


def test_errored_questions_run_again_on_resume(tmp_path, local_retriever):
    from retriever.client import RetrieverError

    class Down:
        def search(self, queries, topk=3):
            raise RetrieverError("Could not reach the retriever at http://127.0.0.1:9/retrieve")

    run = tmp_path / "run"
    prepare_run_dir(run, {"model": "scripted", "datasets": ["nq"]})
    path = run / "nq.jsonl"
    failed = list(evaluate(questions(), scripted(), Down(), AgentSettings(), path))
    assert [r.stop_reason for r in failed] == ["error"] * 4
    again = list(evaluate(questions(), scripted(), local_retriever, AgentSettings(), path))
    assert len(again) == 4 and all(r.stop_reason == "answer" for r in again)
    assert len(load_run(run).records["nq"]) == 4  # the last record of each id counts


def test_run_settings_hold_every_compared_setting():
    """The CLI and the Evaluate tab both store run_settings: none can miss a setting."""
    stored = run_settings("m", "ui", "app", AgentSettings(max_obs_tokens=300), seed=1,
                          limit=None, sample=5, datasets=["nq"])
    assert set(COMPARED) <= set(stored) and stored["max_obs_tokens"] == 300
