"""Benchmark the nano agent on the held-out `vitalqa` questions, on CPU.

    python -m benchmarks.nano [--model assets/nano-agent] [--limit N] [--threads 2]
                              [--batch-size 16] [--json out.json]
                              [--questions assets/naturalqa/dev.jsonl]

For each question, greedy, with run_agent one question at a time (the loop the UI and the
CLI use; per-question seconds are only meaningful there):
  (a) with retrieval: the in-process BM25 engine on the embedded corpus, top 3, observations
      cut at 500 tokens (the defaults of every front end);
  (b) without retrieval: a retriever that returns no documents. EM here shows how much the
      model answers from its weights rather than from what it read;
then (c) run_agent_batch over the same questions with retrieval, as the evaluator runs it.
Printed: EM (Search-R1's exact match on the last <answer>), well-formed rate (runs that end
with an <answer>), searches per question, EM per question family, p50/p90 seconds per
question, and the ratios (a)/(b) for EM and (c)/(a) for questions per second.
Bar: EM >= 0.5 with retrieval, <= 0.1 without, >= 95 % well-formed, p50 < 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ[_name] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from agent.backends.hf import TransformersBackend  # noqa: E402
from agent.loop import AgentSettings  # noqa: E402
from evaluator.benchmarks import (  # noqa: E402
    LOCAL_BENCHMARKS,
    Question,
    load_local,
    question_from_record,
    read_data_file,
)
from evaluator.metrics import exact_match  # noqa: E402
from nano.data import BENCHMARK_NAME  # noqa: E402
from nano.evaluate import (  # noqa: E402
    EmptyRetriever,
    fixed_sample,
    run_batched,
    run_one_by_one,
    score,
    taught,
)
from retriever.client import LocalRetriever  # noqa: E402

DEFAULT_MODEL = ROOT / "assets" / "nano-agent"


def evaluate(model: str, questions: list[Question], settings: AgentSettings | None = None,
             batch_size: int = 0, engine: str = "bm25") -> dict:
    settings = settings or AgentSettings()
    backend = TransformersBackend(model, device="cpu")
    retriever = LocalRetriever(engine=engine)
    retriever.search(["warm up"], 3)  # open the index before any timing
    start = time.perf_counter()
    with_docs = run_one_by_one(questions, backend, retriever, settings)
    one_by_one_s = time.perf_counter() - start
    result = {"with_retrieval": score(questions, with_docs),
              "without_retrieval": score(questions, run_one_by_one(questions, backend,
                                                                    EmptyRetriever(), settings)),
              "one_by_one_qps": len(questions) / one_by_one_s}
    if batch_size:
        start = time.perf_counter()
        batched = run_batched(questions, backend, retriever, settings, batch_size)
        result["batched_qps"] = len(questions) / (time.perf_counter() - start)
        result["batched_em"] = score(questions, batched)["em"]
    if any("support" in q.metadata for q in questions):
        result["taught"] = taught_split(questions, with_docs)
    result["examples"] = [{"question": q.question, "golden": q.golden_answers,
                           "answer": run.answer, "family": q.metadata["family"]}
                          for q, run in zip(questions, with_docs, strict=True)]
    return result


def taught_split(questions: list[Question], runs: list) -> dict:
    """EM on the questions whose golden answer the data generator asks for about their
    article (`nano.evaluate.taught`, on the embedded corpus), and on the rest."""
    from nano.questions import articles_from_records
    from retriever.corpus import load_records, resolve_corpus

    articles = {a.title: a for a in articles_from_records(load_records(resolve_corpus(None)))}
    flags = taught(questions, articles)
    right = [exact_match(run.answer, q.golden_answers)
             for q, run in zip(questions, runs, strict=True)]
    return {kind: {"questions": sum(f == want for f in flags),
                   "right": sum(r for f, r in zip(flags, right, strict=True) if f == want)}
            for kind, want in (("taught", True), ("not taught", False))}


def questions_from_file(path: Path) -> list[Question]:
    """The questions of a FlashRAG JSON-lines file (naturalqa's dev split, say)."""
    return [question_from_record(record, path.parent.name, i, where)
            for i, (where, record) in enumerate(read_data_file(path))]


def report(result: dict, name: str = "vitalqa") -> str:
    a, b = result["with_retrieval"], result["without_retrieval"]
    lines = [f"{name}, {a['questions']} held-out questions, greedy, top-3 BM25, "
             "one question at a time",
             f"{'':24}{'EM':>7}{'well-formed':>13}{'searches':>10}{'p50 s':>8}{'p90 s':>8}"]
    for name, r in (("(a) with retrieval", a), ("(b) without retrieval", b)):
        lines.append(f"{name:24}{r['em']:7.3f}{r['well_formed']:13.1%}{r['searches']:10.2f}"
                     f"{r['p50_s']:8.2f}{r['p90_s']:8.2f}")
    ratio = a["em"] / b["em"] if b["em"] else float("inf")
    lines.append(f"EM ratio (a)/(b): {ratio:.1f}x (answers come from search)")
    lines.append("EM per family (a): " + ", ".join(
        f"{f} {v:.3f} (n={a['family_counts'][f]})" for f, v in a["per_family"].items()))
    lines.append("EM per family (b): " + ", ".join(
        f"{f} {v:.3f}" for f, v in b["per_family"].items()))
    lines.append("runs (a), by what they retrieved: " + ", ".join(
        f"{kind} {n}" for kind, n in a["outcomes"].items()))
    if "taught" in result:
        lines.append("(a) by whether the data generator asks for that answer about that "
                     "article: " + ", ".join(
            f"{kind} {t['right']}/{t['questions']}" for kind, t in result["taught"].items()))
    if "batched_qps" in result:
        lines.append(f"(c) run_agent_batch: {result['batched_qps']:.2f} questions/s vs "
                     f"{result['one_by_one_qps']:.2f} one by one "
                     f"({result['batched_qps'] / result['one_by_one_qps']:.1f}x), "
                     f"EM {result['batched_em']:.3f}")
    bar = (a["em"] >= 0.5, b["em"] <= 0.1, a["well_formed"] >= 0.95, a["p50_s"] < 1.0)
    lines.append("bar: EM>=0.5 {} | EM without <=0.1 {} | well-formed>=95% {} | p50<1s {}"
                 .format(*("met" if ok else "NOT met" for ok in bar)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--data-dir", default=str(LOCAL_BENCHMARKS[BENCHMARK_NAME]),
                        help="the directory holding vitalqa/test.jsonl (as the evaluator's "
                        "--data-dir)")
    parser.add_argument("--questions", default=None, help="a FlashRAG .jsonl file of questions "
                        "instead of vitalqa (assets/naturalqa/dev.jsonl)")
    parser.add_argument("--limit", type=int, default=None, help="a fixed sample of N questions")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (2 cores: 2)")
    parser.add_argument("--batch-size", type=int, default=16, help="0 skips (c)")
    parser.add_argument("--engine", default="bm25")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    if args.questions:
        path = Path(args.questions)
        if not path.is_file():
            parser.error(f"--questions {path}: no such file; pass a .jsonl of questions.")
        questions, name = questions_from_file(path), f"{path.parent.name} {path.stem}"
    else:
        questions, _, _ = load_local(Path(args.data_dir), BENCHMARK_NAME)
        name = BENCHMARK_NAME
    result = evaluate(args.model, fixed_sample(questions, args.limit),
                      batch_size=args.batch_size, engine=args.engine)
    print(report(result, name))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
