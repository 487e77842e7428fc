"""Scoring the nano agent on vitalqa (the benchmark and the tests share it): one question at
a time, as the UI runs it (per-question seconds mean something), or batched, as the
evaluator runs it (the same answers, several times faster)."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from agent.loop import AgentSettings, run_agent, run_agent_batch
from evaluator.metrics import exact_match
from nano.questions import stable_int

BENCHMARK = Path(__file__).resolve().parent.parent / "assets" / "vitalqa" / "test.jsonl"


class EmptyRetriever:
    """A retriever with nothing in it: every search returns no documents."""

    def search(self, queries: list[str], topk: int = 3) -> list[list]:
        return [[] for _ in queries]


def load_questions(path: Path = BENCHMARK, limit: int | None = None) -> list[dict]:
    """The benchmark's records; with a limit, a fixed sample spread over the families."""
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
               if line.strip()]
    if limit:
        records = sorted(records, key=lambda r: stable_int("sample:" + r["id"]))[:limit]
    return records


def run_one_by_one(records: list[dict], backend, retriever, settings: AgentSettings) -> list:
    out = []
    for record in records:
        finished = None
        for event in run_agent(record["question"], backend, retriever, settings):
            finished = event
        out.append(finished)
    return out


def run_batched(records: list[dict], backend, retriever, settings: AgentSettings,
                batch_size: int = 16) -> list:
    """Finished runs in record order, `batch_size` questions per run_agent_batch call."""
    out: list = [None] * len(records)
    for start in range(0, len(records), batch_size):
        chunk = records[start:start + batch_size]
        for i, run in run_agent_batch([r["question"] for r in chunk], backend, retriever,
                                      settings):
            out[start + i] = run
    return out


def score(records: list[dict], finished: list) -> dict:
    by_family: dict[str, list[int]] = defaultdict(list)
    ems = []
    for record, run in zip(records, finished, strict=True):
        em = exact_match(run.answer, record["golden_answers"])
        ems.append(em)
        by_family[record["metadata"]["family"]].append(em)
    seconds = [run.seconds for run in finished]
    return {
        "questions": len(records),
        "em": statistics.mean(ems),
        "well_formed": statistics.mean(run.answer is not None for run in finished),
        "searches": statistics.mean(run.searches for run in finished),
        "per_family": {f: round(statistics.mean(v), 3) for f, v in sorted(by_family.items())},
        "family_counts": {f: len(v) for f, v in sorted(by_family.items())},
        "p50_s": statistics.median(seconds),
        "p90_s": sorted(seconds)[int(0.9 * (len(seconds) - 1))],
    }
