"""Benchmark the evaluator: questions per minute, tiny Qwen2 models on CPU, default corpus.

    python -m benchmarks.evaluator [--questions 64] [--batch-size 16] [--max-turns 4]
                                   [--max-new-tokens 64] [--models random,scripted]
    python -m benchmarks.evaluator --model assets/nano-agent --questions 64 --max-new-tokens 500
    python -m benchmarks.evaluator --model assets/nano-agent --device cuda --questions 256 \
        --batch-size 64 --max-new-tokens 500


A fixture benchmark is written to a temporary DIR/nq/test.jsonl: one question per corpus
title ("who or what is TITLE"), golden answer = the title; with --model (a real checkpoint,
e.g. the nano agent), the fixture is instead a fixed sample of the held-out `vitalqa`
questions with their golden answers, so both paths' EM means something. Then, per model:
  (a) one question at a time with the naive infer.py-style loop of benchmarks/agent.py
      (re-encode per turn, one HTTP search per turn against `python -m retriever serve`);
  (b) `python -m evaluator --datasets nq --data-dir DIR --model TINY --engine bm25s
      --batch-size 16 --output TMP` as a subprocess, the real CLI path, timed whole
      (start-up included: imports, model load, index load; the index is already cached);
  (b, in-run) evaluator.runner.evaluate in-process with the CLI's settings, start-up excluded.
--device cuda runs all three on the GPU (bf16). Goal: b/a >= 5, judged on the in-run rate
(the naive rate excludes its start-up too); the whole-command ratio is printed beside it.
Observations are truncated at 500 tokens, the CLI's (and Search-R1's) setting, in all three
paths. With the nano agent on a CPU the goal is out of reach (prefill-bound, see
assets/nano-agent/ATTEMPTS.md); on a GPU it is met.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from agent.loop import AgentSettings  # noqa: E402  (light: no torch, no transformers)

# benchmarks/agent.py sets the offline flags and a private LLDS_CACHE_DIR when imported.
from benchmarks.agent import (  # noqa: E402
    ENGINE,
    NaiveAgent,
    build_models,
    corpus_titles,
    question_for,
    set_threads,
    start_server,
)
from evaluator.rundir import Record  # noqa: E402

GOAL = 5.0


def write_fixture(data_dir: Path, count: int, held_out: bool = False) -> Path:
    """DIR/nq/test.jsonl: questions from corpus titles, golden answers = the titles; or,
    held_out, a fixed sample of vitalqa (what the nano agent was trained to answer)."""
    path = data_dir / "nq" / "test.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    if held_out:
        from nano.evaluate import vitalqa

        records = [{"id": f"nq_{i}", "question": q.question,
                    "golden_answers": q.golden_answers}
                   for i, q in enumerate(vitalqa(limit=count))]
    else:
        records = [{"id": f"nq_{i}", "question": question_for(title), "golden_answers": [title]}
                   for i, title in enumerate(corpus_titles(count))]
    with path.open("w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def per_minute(count: int, seconds: float) -> float:
    return 60.0 * count / seconds


def run_naive(model_dir: Path, url: str, questions: list[str], settings: AgentSettings,
              device: str) -> tuple[float, list[str | None]]:
    """(seconds, answers) for the naive loop, one question at a time, start-up excluded."""
    agent = NaiveAgent(model_dir, url, settings, device)
    agent.answer(questions[0])  # warm-up, untimed
    start = time.perf_counter()
    answers = [agent.answer(q).answer for q in questions]
    return time.perf_counter() - start, answers


def run_cli(model_dir: Path, data_dir: Path, out_dir: Path, args: argparse.Namespace,
            count: int) -> tuple[float, list[Record]]:
    """(seconds for the whole command, its records)."""
    command = [sys.executable, "-m", "evaluator", "--datasets", "nq", "--data-dir",
               str(data_dir), "--model", str(model_dir), "--engine", ENGINE,
               "--batch-size", str(args.batch_size), "--output", str(out_dir),
               "--max-turns", str(args.max_turns), "--max-new-tokens", str(args.max_new_tokens),
               "--device", args.device]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        raise RuntimeError(f"the evaluator CLI exited with {done.returncode}")
    from evaluator.rundir import read_results

    records = read_results(out_dir / "nq.jsonl")
    if len(records) != count:
        raise RuntimeError(f"the CLI wrote {len(records)} records, expected {count}")
    return seconds, records


def run_in_process(model_dir: Path, data_dir: Path, out_path: Path, settings: AgentSettings,
                   batch_size: int, device: str) -> tuple[float, list[Record]]:
    """(seconds, records) for evaluator.runner.evaluate, model and index loaded beforehand."""
    from agent.backends.hf import TransformersBackend
    from evaluator.benchmarks import load_benchmark
    from evaluator.runner import evaluate
    from retriever.client import LocalRetriever

    questions = load_benchmark("nq", data_dir=data_dir)
    backend = TransformersBackend(str(model_dir), device=device)
    retriever = LocalRetriever(engine=ENGINE)
    retriever.search(["warm up"])
    warm = out_path.with_name("warm-up.jsonl")
    list(evaluate(questions[:2], backend, retriever, settings, warm, batch_size))  # untimed
    start = time.perf_counter()
    records = list(evaluate(questions, backend, retriever, settings, out_path, batch_size))
    return time.perf_counter() - start, records


def summary(records: list[Record]) -> str:
    answered = sum(r.answered for r in records)
    em = sum(r.metrics["em"] for r in records) / len(records)
    searches = sum(r.searches for r in records)
    return f"answered {answered}/{len(records)}, searches {searches}, EM {em:.3f}"


def bench_model(name: str, model_dir: Path, url: str, data_dir: Path, work: Path,
                args: argparse.Namespace) -> bool:
    settings = AgentSettings(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens)
    from evaluator.metrics import exact_match

    fixture = [json.loads(line)
               for line in (data_dir / "nq" / "test.jsonl").read_text().splitlines()]
    questions = [r["question"] for r in fixture]
    count = len(questions)

    # The CLI first: a GPU may be in exclusive-process mode, and once this process holds a
    # CUDA context (the naive loop's model) the subprocess could not get one.
    cli_s, cli_records = run_cli(model_dir, data_dir, work / f"cli-{name}", args, count)
    naive_s, naive_answers = run_naive(model_dir, url, questions, settings, args.device)
    naive_answered = sum(a is not None for a in naive_answers)
    naive_em = sum(exact_match(a, r["golden_answers"])
                   for a, r in zip(naive_answers, fixture, strict=True)) / count
    run_s, run_records = run_in_process(model_dir, data_dir, work / f"in-process-{name}.jsonl",
                                        settings, args.batch_size, args.device)

    a = per_minute(count, naive_s)
    b_whole = per_minute(count, cli_s)
    b_run = per_minute(count, run_s)
    print(f"\nmodel={name}  device={args.device}  questions={count}  "
          f"batch_size={args.batch_size}  "
          f"max_turns={args.max_turns}  max_new_tokens={args.max_new_tokens}")
    print(f"{'path':<52} {'seconds':>8} {'q/min':>8}")
    print(f"{'(a) naive loop, one question at a time':<52} {naive_s:>8.1f} {a:>8.1f}"
          f"   answered {naive_answered}/{count}, EM {naive_em:.3f}")
    print(f"{'(b) python -m evaluator, whole command':<52} {cli_s:>8.1f} {b_whole:>8.1f}"
          f"   {summary(cli_records)}")
    print(f"{'(b) evaluator.runner.evaluate, in-run':<52} {run_s:>8.1f} {b_run:>8.1f}"
          f"   {summary(run_records)}")
    same = sum(x.prediction == y.prediction for x, y in
               zip(sorted(cli_records, key=lambda r: r.id),
                   sorted(run_records, key=lambda r: r.id), strict=True))
    print(f"CLI and in-process predictions agree on {same}/{count}")
    by_id = {r.id: r.prediction for r in run_records}
    naive_same = sum(by_id[r["id"]] == a for r, a in zip(fixture, naive_answers, strict=True))
    print(f"naive loop and evaluator predictions agree on {naive_same}/{count}")
    passed = b_run / a >= GOAL
    print(f"b/a in-run: {b_run / a:.2f}x   b/a whole command: {b_whole / a:.2f}x   "
          f"goal {GOAL:.0f}x (in-run): {'PASS' if passed else 'FAIL'}"
          f"   (whole command: {'PASS' if b_whole / a >= GOAL else 'FAIL'})")
    return passed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--models", default="small-search,small",
                        help="comma-separated: small-search, small, random, scripted")
    parser.add_argument("--model", default=None,
                        help="a checkpoint directory to benchmark instead of the tiny models "
                             "(e.g. assets/nano-agent); its questions come from vitalqa")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="where all three paths run the model (cuda: bf16, as our "
                             "backend and infer.py load it there)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads, here and in the CLI (OMP_NUM_THREADS)")
    args = parser.parse_args(argv)
    set_threads(args.threads)

    from agent.testing import stop_process
    from retriever.client import LocalRetriever

    print(f"cache: {os.environ['LLDS_CACHE_DIR']}  torch threads: {args.threads}  "
          f"cpus: {os.cpu_count()}  load average: {os.getloadavg()[0]:.1f}")
    results = []
    with tempfile.TemporaryDirectory(prefix="llds-bench-eval-") as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        if args.model:
            models = {Path(args.model).name: Path(args.model).resolve()}
        else:
            models = {name: path for name, path in build_models(work / "models").items()
                      if name in args.models.split(",")}
        data_dir = work / "data"
        write_fixture(data_dir, args.questions, held_out=bool(args.model))
        LocalRetriever(engine=ENGINE).search(["warm up"])  # builds and caches the index
        process, url = start_server()
        print(f"set-up (models, fixture, index, server): {time.perf_counter() - start:.1f}s")
        try:
            for name, path in models.items():
                results.append(bench_model(name, path, url, data_dir, work, args))
        finally:
            stop_process(process)
    print(f"\noverall: {'PASS' if all(results) else 'FAIL'}")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
