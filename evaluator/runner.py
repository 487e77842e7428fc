"""Run the agent over benchmark questions and append one record per finished question.

Resuming is the normal path: finished ids are read back and skipped, so a killed run loses
at most the questions that were in flight. The run directory's files and rules are
`evaluator.rundir`'s.

A run of consecutive errored questions (a retriever outage, a dead model server) stops the
run with `RunStopped` instead of writing hundreds of error records: those questions are
not scored, and running the same command again retries them. A question whose text cannot
be encoded, is not a string in the file, or is over its size limit (`Question.problem`),
never reaches the model: it is recorded as an error of its own, and the questions beside it
run. A record that cannot be written (a full disk) stops the run with `RunWriteError`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from agent.events import Finished
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


class RunWriteError(OSError):
    """A record could not be appended to the results file; the message says what is kept."""


def encoding_problem(text: str) -> str | None:
    """Why `text` cannot go to a tokenizer or a UTF-8 file (a lone surrogate), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return (f"the question text cannot be encoded as UTF-8 ({error.reason} "
                f"{text[error.start]!r} at position {error.start}); fix that record in the "
                "benchmark file")
    return None


def unencodable_record(question: Question, problem: str) -> Record:
    """The error record of a question that never reached the model (its text cannot be
    encoded, or `Question.problem` says why not), its text escaped so the record can be
    written."""
    finished = Finished(stop_reason="error", turns=0, searches=0, new_tokens=0, seconds=0.0,
                        trajectory="", prompt="", error=problem)
    printable = question.question.encode("utf-8", "backslashreplace").decode("utf-8")
    return make_record(dataclasses.replace(question, question=printable), finished)


def _append(out, record: Record, path: Path, written: int) -> None:
    try:
        append_record(out, record)
    except OSError as error:
        raise RunWriteError(
            f"could not write to {path} ({error.strerror or error}); the {written} finished "
            "question(s) before it are kept. Free space (or fix the cause), then run the same "
            "command again to resume.") from error


def evaluate(questions: Sequence[Question], backend, retriever, settings: AgentSettings,
             out_path: Path, batch_size: int = 8,
             max_consecutive_errors: int = DEFAULT_MAX_CONSECUTIVE_ERRORS,
             on_turn: Callable[[int, int], None] | None = None) -> Iterator[Record]:
    """Answer the questions not yet in `out_path`, appending each record as it finishes
    (`on_turn`: `run_agent_batch`'s, for each batch).

    Raises RunStopped (after the record that reached it is written and yielded) once
    `max_consecutive_errors` questions in a row have ended in an error; 0 never stops.
    """
    done = finished_ids(out_path)
    written = len(done)
    pending = [q for q in questions if q.id not in done]
    streak, first_error = 0, None
    out = out_path.open("a", encoding="utf-8")
    try:
        for start in range(0, len(pending), batch_size):
            chunk, records = [], []
            for question in pending[start:start + batch_size]:
                problem = question.problem or encoding_problem(question.question)
                if problem:
                    records.append(unencodable_record(question, problem))
                else:
                    chunk.append(question)
            finished_ones = run_agent_batch([q.question for q in chunk], backend, retriever,
                                            settings, on_turn) if chunk else ()
            answered = (make_record(chunk[i], finished) for i, finished in finished_ones)
            for record in itertools.chain(records, answered):  # each written as it finishes
                _append(out, record, out_path, written)
                written += 1
                if record.stop_reason == "error":
                    streak += 1
                    first_error = first_error or record.error
                else:
                    streak, first_error = 0, None
                yield record
                if max_consecutive_errors and streak >= max_consecutive_errors:
                    raise RunStopped(streak, first_error)
    finally:
        try:
            out.close()
        except OSError:  # only after a failed write, already raised: records are flushed
            pass
