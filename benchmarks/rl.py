"""Benchmark one GRPO/LLDS training step on CPU, split into its phases.

    python -m benchmarks.rl [--model PATH] [--steps 3] [--batch-questions 4] [--group-size 5]
                            [--max-new-tokens 64] [--threads 2]

Without --model it builds the tests' `small-search` model (random Qwen2 weights, ~10M
parameters, scripted to search every turn, so every rollout runs max_turns rounds of
retrieval) in a temporary directory; pass the nano agent's directory to time the real thing.
Questions are document titles from the embedded corpus ("who or what is {title}").

Per step (averaged over --steps, after one warm-up step): seconds in rollout (generation),
retrieval, log-prob (old + reference, no grad) and update (PPO mini-batches, backward,
AdamW), steps per hour. Then, on the same step's questions and samples, two ratios against
the naive way:
  - rollouts one question group at a time (n samples of one question per agent call) vs
    all groups in one batched agent call (what the trainer does);
  - log-probs one response at a time vs micro-batches of --micro-batch responses.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

# benchmarks.agent, imported first, puts the process offline with a private cache.
from benchmarks.agent import build_models, corpus_titles, question_for  # isort: skip

from agent.loop import AgentSettings

ROOT = Path(__file__).resolve().parent.parent
os.environ["LLDS_TEST_CACHE_DIR"] = os.environ["LLDS_CACHE_DIR"]


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def one_step(backend, ref_model, optimizer, retriever, questions, config, loss_config,
             settings) -> tuple[dict[str, float], list]:
    """The trainer's step, phase by phase (the same functions nano.rl.train calls)."""
    import torch

    from nano.llds import group_advantages
    from nano.rl import batched_log_probs, update
    from nano.rollout import rollout

    retriever.seconds = 0.0
    samples, rolled = timed(rollout, backend, retriever, questions, config.group_size,
                            settings)
    advantages = group_advantages(torch.tensor([s.reward for s in samples]),
                                  [s.group for s in samples])
    start = time.perf_counter()
    old = batched_log_probs(backend.model, samples, config.micro_batch)
    ref = batched_log_probs(ref_model, samples, config.micro_batch)
    scored = time.perf_counter() - start
    _, updated = timed(update, backend.model, optimizer, samples, old, ref, advantages,
                       config, loss_config)
    return {"rollout": rolled - retriever.seconds, "retrieval": retriever.seconds,
            "log_prob": scored, "update": updated}, samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a Qwen2 model directory (default: a built one)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-questions", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=5)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--engine", default="bm25s")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = parser.parse_args(argv)

    import torch

    from agent.backends.hf import TransformersBackend
    from evaluator.benchmarks import Question
    from nano.rl import RLConfig, batched_log_probs
    from nano.rollout import TimedRetriever, rollout
    from retriever.client import LocalRetriever

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch threads: {args.threads}  cpus: {os.cpu_count()}  "
          f"load average: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="llds-bench-rl-") as tmp:
        model = args.model or str(build_models(Path(tmp))["small-search"])
        backend = TransformersBackend(model, device="cpu", dtype="float32")
        ref_model = TransformersBackend(model, device="cpu", dtype="float32").model
        params = sum(p.numel() for p in backend.model.parameters())
        titles = corpus_titles(args.batch_questions * (args.steps + 1))
        questions = [Question(id=f"bench-{i}", dataset="bench", question=question_for(t),
                              golden_answers=[t]) for i, t in enumerate(titles)]
        retriever = TimedRetriever(LocalRetriever(engine=args.engine))
        retriever.search(["warm up"])
        config = RLConfig(method="llds-a", model=model, group_size=args.group_size,
                          batch_questions=args.batch_questions, micro_batch=args.micro_batch,
                          max_new_tokens=args.max_new_tokens, max_turns=args.max_turns)
        settings = AgentSettings(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                                 max_obs_tokens=4000, greedy=False, top_p=config.top_p)
        optimizer = torch.optim.AdamW(backend.model.parameters(), lr=1e-6)
        print(f"model: {model} ({params / 1e6:.1f}M parameters); {args.batch_questions} "
              f"questions x {args.group_size} samples per step, max_turns {args.max_turns}, "
              f"{args.max_new_tokens} new tokens per turn")
        totals: dict[str, float] = {}
        samples: list = []
        for step in range(args.steps + 1):
            batch = questions[step * args.batch_questions:(step + 1) * args.batch_questions]
            phases, samples = one_step(backend, ref_model, optimizer, retriever, batch, config,
                                       config.loss(), settings)
            print(f"  step {step}: " + ", ".join(f"{k} {v:.1f}s" for k, v in phases.items())
                  + (" (warm-up, not counted)" if step == 0 else ""), flush=True)
            if step == 0:
                continue  # warm-up: first-call costs (allocator, JIT of the tokenizer paths)
            for key, value in phases.items():
                totals[key] = totals.get(key, 0.0) + value / args.steps
        step_seconds = sum(totals.values())
        print(f"\nseconds per step (mean of {args.steps}):")
        for key, value in totals.items():
            print(f"  {key:<10} {value:8.2f}  ({100 * value / step_seconds:4.1f}%)")
        print(f"  {'total':<10} {step_seconds:8.2f}   -> {3600 / step_seconds:.0f} steps/hour")
        tokens = sum(len(s.response_ids) for s in samples) / len(samples)
        print(f"  (last step: {len(samples)} responses, {tokens:.0f} response tokens each)")

        batch = questions[:args.batch_questions]
        _, batched = timed(rollout, backend, retriever, batch, args.group_size, settings)
        one_by_one = sum(timed(rollout, backend, retriever, [q], args.group_size, settings)[1]
                         for q in batch)
        print(f"\nrollouts, {len(batch)} questions x {args.group_size}: one group at a time "
              f"{one_by_one:.2f}s, batched {batched:.2f}s -> {one_by_one / batched:.1f}x")
        _, batched_lp = timed(batched_log_probs, backend.model, samples, args.micro_batch)
        _, single_lp = timed(batched_log_probs, backend.model, samples, 1)
        print(f"log-probs, {len(samples)} responses: one at a time {single_lp:.2f}s, "
              f"micro-batches of {args.micro_batch} {batched_lp:.2f}s -> "
              f"{single_lp / batched_lp:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
