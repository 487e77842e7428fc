"""Run the agent over benchmark questions and append one JSON line per finished question.

Resuming is the normal path: finished ids are read back and skipped, so a killed run loses
at most the questions that were in flight.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from agent.events import Finished
from agent.loop import AgentSettings, run_agent_batch
from evaluator.benchmarks import Question
from evaluator.metrics import score_question
from evaluator.report import SUMMARY_FILES, read_jsonl

# Settings that change the numbers: a stored run with other values is not resumed.
COMPARED = ("model", "backend", "retriever", "max_turns", "topk", "max_new_tokens",
            "max_obs_tokens", "greedy", "temperature", "top_p", "seed", "limit", "sample",
            "stop_on_eos")


class RunMismatch(ValueError):
    """The output directory holds a run made with other settings."""


def prepare_run_dir(run_dir: Path, settings: dict[str, Any], overwrite: bool = False) -> None:
    """Create, check or reset `run_dir`; refuse to mix results from different settings."""
    stored_path = run_dir / "settings.json"
    if stored_path.is_file() and overwrite:
        shutil.rmtree(run_dir)
    elif stored_path.is_file():
        stored = json.loads(stored_path.read_text(encoding="utf-8"))
        diffs = [f"{k}: stored {stored.get(k)!r}, now {settings.get(k)!r}"
                 for k in COMPARED if stored.get(k) != settings.get(k)]
        if diffs:
            raise RunMismatch(
                f"{run_dir} holds a run with other settings ({'; '.join(diffs)}). "
                "Use another --output, or --overwrite to discard the stored results.")
        settings = {**settings,
                    "datasets": list(dict.fromkeys([*stored.get("datasets", []),
                                                    *settings.get("datasets", [])]))}
    run_dir.mkdir(parents=True, exist_ok=True)
    stored_path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    for name in SUMMARY_FILES:  # stale once more results come in
        (run_dir / name).unlink(missing_ok=True)


def _repair_tail(path: Path) -> None:
    """Drop a half-written last line (a kill mid-write) so appends start on a fresh line."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def finished_ids(path: Path) -> set[str]:
    """Ids with a result; a question that ended in an error (a retriever outage, say) is
    not finished and runs again on resume (reports keep each id's last record)."""
    _repair_tail(path)
    if not path.is_file():
        return set()
    return {str(r["id"]) for r in read_jsonl(path) if r.get("stop_reason") != "error"}


def failure_reason(finished: Finished) -> str | None:
    if finished.stop_reason == "answer":
        return None
    if finished.stop_reason in ("context_full", "error"):
        return finished.stop_reason
    if finished.invalid_actions and not finished.searches:
        return "invalid_action"
    if finished.stop_reason == "max_turns":
        return "max_turns"
    return "no_answer"


def make_record(question: Question, finished: Finished) -> dict[str, Any]:
    metrics = score_question(finished.response, question.golden_answers, finished.retrieved)
    return {
        "id": question.id, "dataset": question.dataset, "question": question.question,
        "golden_answers": question.golden_answers, "prediction": finished.answer,
        "response": finished.response, "trajectory": finished.trajectory,
        "retrieved": finished.retrieved, "metrics": metrics,
        "answered": finished.answer is not None, "failure": failure_reason(finished),
        "searches": finished.searches, "turns": finished.turns,
        "invalid_actions": finished.invalid_actions, "new_tokens": finished.new_tokens,
        "seconds": round(finished.seconds, 3), "stop_reason": finished.stop_reason,
        "error": finished.error,
    }


def evaluate(questions: Sequence[Question], backend, retriever, settings: AgentSettings,
             out_path: Path, batch_size: int = 8,
             on_record: Callable[[dict], None] | None = None) -> Iterator[dict]:
    """Answer the questions not yet in `out_path`, appending each record as it finishes."""
    done = finished_ids(out_path)
    pending = [q for q in questions if q.id not in done]
    with out_path.open("a", encoding="utf-8") as out:
        for start in range(0, len(pending), batch_size):
            chunk = pending[start:start + batch_size]
            for i, finished in run_agent_batch([q.question for q in chunk], backend, retriever,
                                               settings):
                record = make_record(chunk[i], finished)
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                out.flush()  # on disk before the next question: a kill loses nothing done
                if on_record is not None:
                    on_record(record)
                yield record
