"""What llama.cpp offers these cores, side by side, and our backend against llama.cpp itself.

    python -m benchmarks.llamacpp speed --work DIR --prepare-only     # the 3B files, once
    python -m benchmarks.llamacpp_knobs --work DIR [--types q4_0,iq4_nl,q4_k_m,q8_0]
        [--ubatch 512,256] [--flash on,off] [--kv f16,q8_0] [--mmap on,off]
        [--repack off,on] [--threads 2,1] [--json OUT]

On Qwen2.5-3B's shape (random weights) at each quantization type, each setting in a process
of its own: the base setting (the first value of every list), then each other value of one
knob at a time. A setting is timed two ways on the same file, in the same process:
  - our backend, `LlamaCppBackend.stream` (what the agent loop calls): --prompt-tokens of
    real text from an empty cache (seconds to the first generated token), then
    --decode-tokens (tokens/s over those after the first);
  - llama.cpp itself through llama-cpp-python's `Llama.eval` (the naive way, no agent):
    the same prompt ids in one eval, then one eval per token, the argmax of its logits fed
    back.
`backend / llama.cpp` is the backend's decode speed over llama.cpp's; `RSS GB` the process's
peak before llama.cpp's own copy is loaded (the backend's). `question s` is what
a Search-R1 question of the `speed` benchmark's shape would take at these rates
(QUESTION_PROMPT tokens read, QUESTION_DECODE generated). Run on otherwise idle cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.cpu import describe, llama_cpp_info
from benchmarks.llamacpp import GGUF_KINDS, ROOT, first_token_clock, peak_rss_mb

# The whole question of `benchmarks.llamacpp speed`: the tokens fed after the instruction
# (the question, two observations of 500 tokens, the turns fed back) and those generated.
QUESTION_PROMPT, QUESTION_DECODE = 1100, 144
# Flash attention: the backend leaves it to llama.cpp ("auto"), which turns it on on a CPU.
FLASH = {"on": True, "off": False}


def _text(work: Path) -> str:
    data = json.loads((work / "documents.json").read_text())
    return "".join(data["observations"]) * 8


def measure(work: Path, kind: str, threads: int, ubatch: int, flash: str, kv: str,
            mmap: str, repack: str, prompt_tokens: int, decode_tokens: int) -> dict:
    """One setting, in this process: the backend's rates, then llama.cpp's own."""
    import os

    import numpy as np

    os.environ["LLDS_LLAMA_EXTRA_BUFTS"] = "1" if repack == "on" else "0"

    from agent.backends.base import Sampling
    from agent.backends.llamacpp import LlamaCppBackend, load_llama_cpp

    path = work / kind / "model.gguf"
    backend = LlamaCppBackend(str(path), slots=1, threads=threads, n_ubatch=ubatch,
                              flash_attn=FLASH[flash], kv_type=kv, reuse_cache=False,
                              mmap=mmap == "on")
    context = backend.truncate(_text(work), prompt_tokens)
    ids = backend.context_ids([context])
    first = first_token_clock(backend)
    list(backend.stream(["warm up"], 2, Sampling()))
    first.clear()
    start = time.perf_counter()
    *_, out = backend.stream([context], decode_tokens + 1, Sampling())
    end = time.perf_counter()
    ours = {"prompt_tps": len(ids) / (first[0] - start),
            "decode_tps": (out.new_tokens - 1) / (end - first[0])}
    rss = peak_rss_mb()  # the backend's alone: llama.cpp's own copy comes next
    del backend

    llama_cpp = load_llama_cpp()
    bindings = sys.modules["llama_cpp.llama_cpp"]  # what `Llama` calls
    defaults = bindings.llama_model_default_params

    def model_params():  # `Llama` takes no repack argument: the same choice as the backend
        params = defaults()
        params.use_extra_bufts = repack == "on"
        return params

    bindings.llama_model_default_params = model_params
    kv_type = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0}[kv]
    llm = llama_cpp.Llama(str(path), n_ctx=len(ids) + decode_tokens + 64, n_batch=512,
                          n_ubatch=ubatch, n_threads=threads, n_threads_batch=threads,
                          flash_attn=FLASH[flash], type_k=kv_type, type_v=kv_type,
                          use_mmap=mmap == "on", verbose=False)
    n_vocab = llm.n_vocab()

    def next_token() -> int:  # the argmax of the last logits (Llama keeps none itself)
        pointer = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(pointer, shape=(n_vocab,))))

    llm.eval(ids[:8])  # warm up
    llm.reset()
    start = time.perf_counter()
    llm.eval(ids)
    prompt_s = time.perf_counter() - start
    token = next_token()
    start = time.perf_counter()
    for _ in range(decode_tokens):
        llm.eval([token])
        token = next_token()
    decode_s = time.perf_counter() - start
    theirs = {"prompt_tps": len(ids) / prompt_s, "decode_tps": decode_tokens / decode_s}
    return {"type": kind, "threads": threads, "ubatch": ubatch, "flash": flash, "kv": kv,
            "mmap": mmap, "repack": repack, "prompt_tokens": len(ids),
            "decode_tokens": decode_tokens,
            "backend": ours, "llama_cpp": theirs, "peak_rss_mb": rss,
            "question_s": QUESTION_PROMPT / ours["prompt_tps"]
            + QUESTION_DECODE / ours["decode_tps"]}


def settings(args) -> list[dict]:
    """The base setting of each type, then one knob moved at a time."""
    lists = {"threads": [int(t) for t in args.threads.split(",")],
             "ubatch": [int(u) for u in args.ubatch.split(",")],
             "flash": args.flash.split(","), "kv": args.kv.split(","),
             "mmap": args.mmap.split(","), "repack": args.repack.split(",")}
    base = {k: v[0] for k, v in lists.items()}
    out = []
    for kind in args.types.split(","):
        out.append({"type": kind, **base})
        for knob, values in lists.items():
            out += [{"type": kind, **base, knob: value} for value in values[1:]]
    for setting in out:  # llama.cpp quantizes the V cache only with flash attention
        if setting["kv"] != "f16":
            setting["flash"] = "on"
    return out


def run(args) -> list[dict]:
    results = []
    for setting in settings(args):
        command = [sys.executable, "-m", "benchmarks.llamacpp_knobs", "--work", args.work,
                   "--one", json.dumps(setting), "--prompt-tokens", str(args.prompt_tokens),
                   "--decode-tokens", str(args.decode_tokens)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{setting}: failed\n{done.stderr[-2000:]}", flush=True)
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(result)
        print(row(result), flush=True)
    return results


HEADER = (f"{'type':7s} {'thr':>3s} {'ubatch':>6s} {'flash':>5s} {'kv':>5s} {'mmap':>4s} "
          f"{'repack':>6s} "
          f"{'prompt tok/s':>12s} {'decode tok/s':>12s} {'llama.cpp p/d':>14s} "
          f"{'backend/llama.cpp':>17s} {'question s':>10s} {'RSS GB':>6s}")


def row(r: dict) -> str:
    ours, theirs = r["backend"], r["llama_cpp"]
    return (f"{r['type']:7s} {r['threads']:3d} {r['ubatch']:6d} {r['flash']:>5s} {r['kv']:>5s} "
            f"{r['mmap']:>4s} {r['repack']:>6s} "
            f"{ours['prompt_tps']:12.1f} {ours['decode_tps']:12.2f} "
            f"{theirs['prompt_tps']:6.1f}/{theirs['decode_tps']:<7.2f} "
            f"{ours['decode_tps'] / theirs['decode_tps']:17.2f} {r['question_s']:10.1f} "
            f"{r['peak_rss_mb'] / 1024:6.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llamacpp_knobs",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True, help="the folder `speed` prepared")
    parser.add_argument("--types", default=",".join(GGUF_KINDS))
    parser.add_argument("--threads", default="2")
    parser.add_argument("--ubatch", default="512,256")
    parser.add_argument("--flash", default="on,off")
    parser.add_argument("--kv", default="f16,q8_0")
    parser.add_argument("--mmap", default="on", help="weights mapped from the file, or read")
    parser.add_argument("--repack", default="off,on",
                        help="weights repacked at load (llama.cpp's extra buffer types)")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=24)
    parser.add_argument("--json")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    work = Path(args.work)
    if args.one:
        s = json.loads(args.one)
        print(json.dumps(measure(work, s["type"], s["threads"], s["ubatch"], s["flash"],
                                 s["kv"], s["mmap"], s["repack"], args.prompt_tokens,
                                 args.decode_tokens)))
        return 0
    missing = [k for k in args.types.split(",") if not (work / k / "model.gguf").is_file()]
    if missing:
        print(f"error: {work} holds no {', '.join(missing)} model: run `python -m "
              f"benchmarks.llamacpp speed --work {work} --prepare-only` first",
              file=sys.stderr)
        return 2
    cpu, info = describe(), llama_cpp_info()
    print(cpu)
    print(info)
    print(f"Qwen2.5-3B shape, random weights; {args.prompt_tokens} prompt tokens, "
          f"{args.decode_tokens} decoded; question s: {QUESTION_PROMPT} read + "
          f"{QUESTION_DECODE} generated at the backend's rates")
    print(HEADER, flush=True)
    results = run(args)
    if results:
        best = min(results, key=lambda r: r["question_s"])
        print(f"fastest question: {best['type']}, {best['threads']} threads, ubatch "
              f"{best['ubatch']}, flash {best['flash']}, kv {best['kv']}, mmap "
              f"{best['mmap']}, repack {best['repack']}: {best['question_s']:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu, "llama_cpp": info,
                                               "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
