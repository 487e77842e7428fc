"""Run the agent over benchmark questions and append one record per finished question.

Resuming is the normal path: finished ids are read back and skipped, so a killed run loses
at most the questions that were in flight. The run directory's files and rules are
`evaluator.rundir`'s.

A run of consecutive errored questions (a retriever outage, a dead model server) stops the
run with `RunStopped` instead of writing hundreds of error records: those questions are
not scored, and running the same command again retries them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from agent.loop import AgentSettings, run_agent_batch
from evaluator.benchmarks import Question
from evaluator.rundir import Record, append_record, finished_ids, make_record

# Questions in a row that may end in an error before the run stops (0: never stop).
DEFAULT_MAX_CONSECUTIVE_ERRORS = 20


class RunStopped(RuntimeError):
    """The run stopped after `errors` consecutive errored questions; `first_error` is the
    first of their messages (usually the cause: the retriever or the model server is down)."""

    def __init__(self, errors: int, first_error: str | None) -> None:
        self.errors = errors
        self.first_error = first_error or "no message"
        super().__init__(
            f"stopped after {errors} questions in a row ended in an error (first error: "
            f"{self.first_error}). Fix the cause, then run the same command again: finished "
            "questions are kept and the errored ones run again.")


def evaluate(questions: Sequence[Question], backend, retriever, settings: AgentSettings,
             out_path: Path, batch_size: int = 8,
             max_consecutive_errors: int = DEFAULT_MAX_CONSECUTIVE_ERRORS) -> Iterator[Record]:
    """Answer the questions not yet in `out_path`, appending each record as it finishes.

    Raises RunStopped (after the record that reached it is written and yielded) once
    `max_consecutive_errors` questions in a row have ended in an error; 0 never stops.
    """
    done = finished_ids(out_path)
    pending = [q for q in questions if q.id not in done]
    streak, first_error = 0, None
    with out_path.open("a", encoding="utf-8") as out:
        for start in range(0, len(pending), batch_size):
            chunk = pending[start:start + batch_size]
            for i, finished in run_agent_batch([q.question for q in chunk], backend, retriever,
                                               settings):
                record = make_record(chunk[i], finished)
                append_record(out, record)
                if record.stop_reason == "error":
                    streak += 1
                    first_error = first_error or record.error
                else:
                    streak, first_error = 0, None
                yield record
                if max_consecutive_errors and streak >= max_consecutive_errors:
                    raise RunStopped(streak, first_error)
