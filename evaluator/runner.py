"""Run the agent over benchmark questions and append one record per finished question.

Resuming is the normal path: finished ids are read back and skipped, so a killed run loses
at most the questions that were in flight. The run directory's files and rules are
`evaluator.rundir`'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from agent.loop import AgentSettings, run_agent_batch
from evaluator.benchmarks import Question
from evaluator.rundir import Record, append_record, finished_ids, make_record


def evaluate(questions: Sequence[Question], backend, retriever, settings: AgentSettings,
             out_path: Path, batch_size: int = 8) -> Iterator[Record]:
    """Answer the questions not yet in `out_path`, appending each record as it finishes."""
    done = finished_ids(out_path)
    pending = [q for q in questions if q.id not in done]
    with out_path.open("a", encoding="utf-8") as out:
        for start in range(0, len(pending), batch_size):
            chunk = pending[start:start + batch_size]
            for i, finished in run_agent_batch([q.question for q in chunk], backend, retriever,
                                               settings):
                record = make_record(chunk[i], finished)
                append_record(out, record)
                yield record
