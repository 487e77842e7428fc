"""What Search-R1's stop rule costs: generated tokens with and without an early `</answer>` stop.

    python -m benchmarks.stop_rule                          # tiny models built here (CPU)
    python -m benchmarks.stop_rule --model PATH_OR_HUB_ID   # any causal LM, e.g. the nano agent
    python -m benchmarks.stop_rule --model M --questions 64 --max-new-tokens 500 --device cuda

Search-R1 generates each turn to EOS or the budget and cuts afterwards; the project now
stops early only at `</search>` (which cannot change the cut) and generates on past
`</answer>`. Measured in the same run, on the same questions, greedy:
  (old) `TransformersBackend(stop_strings=("</search>", "</answer>"))`: the former early stop;
  (new) the default backend: Search-R1's outcome for every continuation.
Printed: new tokens per question, seconds, the ratio new/old, and how many questions end
with another trajectory (the cases the early stop got wrong).

Without --model, three tiny Qwen2 models (agent/testing.py): `scripted` (searches, then
answers and ends with EOS right after `</answer>`: a well-trained model), `chatty` (after
`</answer>` writes two more tokens before EOS) and `random` (never writes a tag: the rules
cannot differ). Questions are titles of the embedded corpus; retrieval is in-process bm25s.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from agent.loop import AgentSettings, run_agent_batch  # noqa: E402

OLD_STOPS = ("</search>", "</answer>")


def build_tiny_models(root: Path) -> dict[str, Path]:
    from agent.testing import build_random, build_scripted, build_tokenizer, scripted_paths
    from retriever.corpus import load_records, resolve_corpus

    texts = [r["contents"] for r in load_records(resolve_corpus("default"))[:2000]]
    tokenizer = build_tokenizer(root / "tokenizer", texts)
    paths = scripted_paths(tokenizer)
    # Two more tokens after `</answer>` before EOS (tags no other path uses).
    chatty = {**paths, "\n\n": [*paths["\n\n"][:-1], "<information>", "</information>",
                                  "<|im_end|>"]}
    return {"scripted": build_scripted(root / "scripted", tokenizer),
            "chatty": build_scripted(root / "chatty", tokenizer, paths=chatty),
            "random": build_random(root / "random", tokenizer)}


def questions_from_corpus(count: int) -> list[str]:
    from agent.protocol import split_title
    from retriever.corpus import load_records, resolve_corpus

    records = load_records(resolve_corpus("default"))
    step = max(1, len(records) // count)
    return [f"who or what is {split_title(r['contents'])[0].strip(chr(34))}"
            for r in records[::step]][:count]


def run_all(backend, retriever, questions, settings, batch_size):
    start, done = time.perf_counter(), {}
    for first in range(0, len(questions), batch_size):
        chunk = questions[first:first + batch_size]
        for i, finished in run_agent_batch(chunk, backend, retriever, settings):
            if finished.error:
                raise RuntimeError(finished.error)
            done[first + i] = finished
    return [done[i] for i in range(len(questions))], time.perf_counter() - start


def measure(name: str, model: str, retriever, questions, settings, args) -> None:
    from agent.backends.hf import TransformersBackend

    old = TransformersBackend(model, device=args.device, stop_strings=OLD_STOPS)
    new = TransformersBackend(model, device=args.device)
    run_all(old, retriever, questions[:1], settings, 1)  # warm-up: tables, lazy imports
    run_all(new, retriever, questions[:1], settings, 1)
    old_runs, old_s = run_all(old, retriever, questions, settings, args.batch_size)
    new_runs, new_s = run_all(new, retriever, questions, settings, args.batch_size)
    old_tokens = sum(r.new_tokens for r in old_runs)
    new_tokens = sum(r.new_tokens for r in new_runs)
    differ = sum(a.trajectory != b.trajectory for a, b in zip(old_runs, new_runs, strict=True))
    answers = sum(r.stop_reason == "answer" for r in new_runs)
    n = len(questions)
    print(f"\nmodel={name}  questions={n}  max_turns={settings.max_turns}  "
          f"max_new_tokens={settings.max_new_tokens}  batch={args.batch_size}")
    print(f"{'rule':<44} {'tokens/q':>9} {'s/q':>8} {'answered':>9}")
    print(f"{'(old) stop at </search> or </answer>':<44} {old_tokens / n:>9.2f} "
          f"{old_s / n:>8.3f} {sum(r.stop_reason == 'answer' for r in old_runs):>9}")
    print(f"{'(new) stop at </search>, cut after EOS':<44} {new_tokens / n:>9.2f} "
          f"{new_s / n:>8.3f} {answers:>9}")
    extra = (new_tokens - old_tokens) / n
    print(f"  new/old generated tokens: {new_tokens / max(old_tokens, 1):.3f}x "
          f"({extra:+.2f} tokens per question; "
          f"{(new_tokens - old_tokens) / max(answers, 1):+.2f} per answered question)")
    print(f"  new/old seconds: {new_s / max(old_s, 1e-9):.3f}x")
    print(f"  questions whose trajectory differs: {differ}/{n}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="hub id or local path (default: tiny models)")
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args(argv)
    if "LLDS_CACHE_DIR" not in os.environ:  # a private cache: never a user's prebuilt index
        os.environ["LLDS_CACHE_DIR"] = tempfile.mkdtemp(prefix="llds-bench-cache-")

    import torch

    from retriever.client import LocalRetriever

    torch.set_num_threads(args.threads)
    settings = AgentSettings(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                             max_obs_tokens=4000)
    retriever = LocalRetriever(engine="bm25s")
    questions = questions_from_corpus(args.questions)
    print(f"cpus: {os.cpu_count()}  load average: {os.getloadavg()[0]:.1f}  "
          f"torch threads: {args.threads}")
    if args.model:
        measure(args.model, args.model, retriever, questions, settings, args)
        return 0
    with tempfile.TemporaryDirectory(prefix="llds-bench-models-") as tmp:
        for name, path in build_tiny_models(Path(tmp)).items():
            measure(name, str(path), retriever, questions, settings, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
