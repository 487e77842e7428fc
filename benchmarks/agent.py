"""Benchmark the agent loop on CPU with tiny Qwen2 models (built into a temporary directory).

    python -m benchmarks.agent [--questions 32] [--max-turns 4] [--max-new-tokens 64]
                               [--models random,scripted] [--threads 1]

Seconds per question, the same questions for every configuration:
  (a)  naive: an infer.py-style loop written here. Every turn re-encodes the whole context
       text (tokenizer(full_text), then model.generate with stop strings, no cache reuse) and
       searches with one HTTP request per turn (requests.post, as Search-R1's infer.py does)
       against `python -m retriever serve --engine bm25s` on loopback;
  (b)  ours: run_agent with TransformersBackend(reuse_cache=True) and LocalRetriever;
  (b') ours with reuse_cache=False, which isolates the effect of the KV cache;
  (c)  run_agent_batch, batch sizes 8 and 32 (compared with (b), one question at a time).

Two tiny models: `random` never emits a tag, so every turn runs to --max-new-tokens and is an
invalid action; the context grows by a full turn each round (KV reuse matters, no searches).
`scripted` searches once, then answers after the observation: short turns, real retrieval.
Both protocols are identical across (a), (b) and (c), and all decoding is greedy, so every
configuration does the same work; the table shows the new tokens and answers to prove it.

--threads sets torch's intra-op threads (default 1). On a small shared machine torch's
default (one thread per core) makes batched generation spin on busy cores and slows it down
by an order of magnitude, which would measure the neighbours rather than the code.

The naive loop it measures against is written out here in full, as a baseline must be.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ[_name] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if "LLDS_CACHE_DIR" not in os.environ:  # a private cache: never a user's prebuilt index
    os.environ["LLDS_CACHE_DIR"] = tempfile.mkdtemp(prefix="llds-bench-cache-")

import requests  # noqa: E402

from agent import protocol  # noqa: E402
from agent.events import Finished  # noqa: E402
from agent.loop import AgentSettings, run_agent, run_agent_batch  # noqa: E402

ENGINE = "bm25s"
HOST = "127.0.0.1"

# -----------------------------------------------------------------------------
# set-up: tiny models, questions from the corpus, a retrieval server


def build_models(root: Path) -> dict[str, Path]:
    """The tests' tiny models, saved under `root`, plus two of ~10M parameters, big enough
    that re-encoding a long context costs real compute: `small` (random weights, long
    invalid turns) and `small-search` (scripted: searches every turn, so the context grows
    by whole observations as in real Search-R1 rollouts)."""
    from agent.testing import build_random, build_scripted, build_tokenizer, scripted_paths
    from retriever.corpus import load_records, resolve_corpus

    def search_every_turn(tokenizer) -> dict[str, list[str]]:
        search = scripted_paths(tokenizer)["\n"]
        return {"\n": search, "\n\n": search}

    texts = [r["contents"] for r in load_records(resolve_corpus("default"))[:2000]]
    tokenizer = build_tokenizer(root / "tokenizer", texts)
    return {"random": build_random(root / "random", tokenizer),
            "small": build_random(root / "small", tokenizer, hidden_size=384, layers=6),
            "small-search": build_scripted(root / "small-search", tokenizer,
                                           paths=search_every_turn(tokenizer),
                                           hidden_size=384, layers=6),
            "scripted": build_scripted(root / "scripted", tokenizer)}


def corpus_titles(count: int) -> list[str]:
    """`count` document titles spread evenly over the default corpus."""
    from retriever.corpus import load_records, resolve_corpus

    records = load_records(resolve_corpus("default"))
    step = max(1, len(records) // count)
    titles = [protocol.split_title(r["contents"])[0].strip('"') for r in records[::step]]
    return titles[:count]


def question_for(title: str) -> str:
    return f"who or what is {title}"


def start_server(engine: str = ENGINE):
    """`python -m retriever serve` on a free loopback port: (process, /retrieve URL)."""
    from agent.testing import free_port, start_process

    port = free_port()
    process = start_process(["-m", "retriever", "serve", "--engine", engine, "--port", str(port)],
                            f"http://{HOST}:{port}/health")
    return process, f"http://{HOST}:{port}/retrieve"


def set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


# -----------------------------------------------------------------------------
# (a) the naive baseline: Search-R1 infer.py's mechanics, this project's protocol


@dataclass
class NaiveResult:
    answer: str | None
    new_tokens: int
    searches: int


class NaiveAgent:
    """One question at a time; each turn re-encodes the full text; one HTTP search per turn."""

    def __init__(self, model_dir: Path, url: str, settings: AgentSettings,
                 device: str = "cpu"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from agent.backends.hf import auto_dtype

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        dtype = getattr(torch, auto_dtype(device))  # the dtype our backend picks there
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
        self.model.eval()
        self.url = url
        self.settings = settings
        self.eos_ids = [self.tokenizer.convert_tokens_to_ids(t)
                        for t in ("<|im_end|>", "<|endoftext|>")]

    def search(self, query: str) -> str:
        payload = {"queries": [query], "topk": self.settings.topk, "return_scores": True}
        docs = requests.post(self.url, json=payload, timeout=30).json()["result"][0]
        return protocol.render_documents(d["document"]["contents"] for d in docs)

    def truncate(self, text: str, max_tokens: int) -> str:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return text if len(ids) <= max_tokens else self.tokenizer.decode(ids[:max_tokens])

    def answer(self, question: str) -> NaiveResult:
        import torch

        s = self.settings
        text = protocol.build_prompt(question, self.tokenizer)
        new_tokens = searches = 0
        for round_ in range(s.max_turns + 1):
            inputs = self.tokenizer(text, return_tensors="pt")  # the whole context, again
            inputs = inputs.to(self.model.device)
            budget = min(s.max_new_tokens, s.max_context_tokens - inputs["input_ids"].shape[1])
            if budget <= 0:
                break
            with torch.inference_mode():
                out = self.model.generate(
                    **inputs, max_new_tokens=budget, stop_strings=list(protocol.STOP_STRINGS),
                    tokenizer=self.tokenizer, eos_token_id=self.eos_ids,
                    pad_token_id=self.eos_ids[1], do_sample=False, temperature=None,
                    top_p=None, top_k=None)
            generated = out[0, inputs["input_ids"].shape[1]:].tolist()
            new_tokens += len(generated)
            turn = protocol.cut_turn(self.tokenizer.decode(generated, skip_special_tokens=True))
            text += turn
            action = protocol.parse_action(turn)
            if action.kind == "answer":
                return NaiveResult(action.content, new_tokens, searches)
            if round_ == s.max_turns:
                break
            if action.kind == "search":
                searches += 1
                observation = protocol.observation(self.search(action.content))
                text += self.truncate(observation, s.max_obs_tokens)
            else:
                text += protocol.INVALID_ACTION_MESSAGE
        return NaiveResult(None, new_tokens, searches)


# -----------------------------------------------------------------------------
# timing the configurations


@dataclass
class Outcome:
    label: str
    seconds: float
    answers: list[str | None]
    new_tokens: int
    searches: int

    @property
    def per_question(self) -> float:
        return self.seconds / len(self.answers)


def timed(label: str, run: Callable[[], list[tuple[str | None, int, int]]]) -> Outcome:
    """Run once; `run` returns (answer, new tokens, searches) per question."""
    start = time.perf_counter()
    rows = run()
    seconds = time.perf_counter() - start
    return Outcome(label, seconds, [r[0] for r in rows], sum(r[1] for r in rows),
                   sum(r[2] for r in rows))


def naive_all(agent: NaiveAgent, questions: Sequence[str]) -> list[tuple[str | None, int, int]]:
    rows = []
    for question in questions:
        result = agent.answer(question)
        rows.append((result.answer, result.new_tokens, result.searches))
    return rows


def one_by_one(backend, retriever, questions: Sequence[str],
               settings: AgentSettings) -> list[tuple[str | None, int, int]]:
    rows = []
    for question in questions:
        finished = list(run_agent(question, backend, retriever, settings))[-1]
        assert isinstance(finished, Finished) and finished.error is None, finished
        rows.append((finished.answer, finished.new_tokens, finished.searches))
    return rows


def batched(backend, retriever, questions: Sequence[str], settings: AgentSettings,
            batch_size: int) -> list[tuple[str | None, int, int]]:
    rows: list[tuple[str | None, int, int]] = []
    for start in range(0, len(questions), batch_size):
        chunk = questions[start:start + batch_size]
        done: dict[int, Finished] = dict(run_agent_batch(chunk, backend, retriever, settings))
        for i in range(len(chunk)):
            assert done[i].error is None, done[i]
            rows.append((done[i].answer, done[i].new_tokens, done[i].searches))
    return rows


def print_table(title: str, outcomes: list[Outcome], reference: Outcome) -> None:
    print(f"\n{title}")
    print(f"{'configuration':<44} {'s/question':>10} {'total s':>8} {'new tok':>8} "
          f"{'searches':>8} {'answered':>8} {'same as b':>9}")
    for o in outcomes:
        same = sum(a == b for a, b in zip(o.answers, reference.answers, strict=True))
        answered = sum(a is not None for a in o.answers)
        print(f"{o.label:<44} {o.per_question:>10.3f} {o.seconds:>8.1f} {o.new_tokens:>8} "
              f"{o.searches:>8} {answered:>8} {same:>5}/{len(o.answers)}")


def ratio_line(name: str, slow: Outcome, fast: Outcome) -> str:
    return f"  {name:<28} {slow.per_question / fast.per_question:6.2f}x"


def bench_model(name: str, model_dir: Path, url: str, retriever, questions: list[str],
                settings: AgentSettings, batch_sizes: Sequence[int]) -> None:
    from agent.backends.hf import TransformersBackend

    naive = NaiveAgent(model_dir, url, settings)
    ours = TransformersBackend(str(model_dir), device="cpu", reuse_cache=True)
    no_cache = TransformersBackend(str(model_dir), device="cpu", reuse_cache=False)
    # Warm-up, untimed: first-call costs (stop-string tables, lazy imports, the index).
    naive.answer(questions[0])
    one_by_one(ours, retriever, questions[:1], settings)
    one_by_one(no_cache, retriever, questions[:1], settings)
    batched(ours, retriever, questions[:2], settings, 2)

    a = timed("(a)  naive: re-encode + HTTP search per turn", lambda: naive_all(naive, questions))
    b = timed("(b)  run_agent, reuse_cache=True", lambda: one_by_one(ours, retriever, questions,
                                                                    settings))
    b2 = timed("(b') run_agent, reuse_cache=False",
               lambda: one_by_one(no_cache, retriever, questions, settings))
    batch_outcomes = [
        timed(f"(c)  run_agent_batch, batch size {size}",
              lambda size=size: batched(ours, retriever, questions, settings, size))
        for size in batch_sizes]
    print_table(f"model={name}  questions={len(questions)}  max_turns={settings.max_turns}  "
                f"max_new_tokens={settings.max_new_tokens}", [a, b, b2, *batch_outcomes], b)
    print("ratios (seconds per question, same run):")
    print(ratio_line("a / b   (naive / ours)", a, b))
    print(ratio_line("b' / b  (KV reuse)", b2, b))
    for size, outcome in zip(batch_sizes, batch_outcomes, strict=True):
        print(ratio_line(f"one-by-one / batched-{size}", b, outcome))
    if len(questions) < max(batch_sizes):
        print(f"  note: only {len(questions)} questions, so batch size {max(batch_sizes)} runs "
              f"batches of {len(questions)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--models", default="small-search,small",
                        help="comma-separated: small-search, small, random, scripted")
    parser.add_argument("--batch-sizes", default="8,32")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args(argv)
    set_threads(args.threads)

    from agent.testing import stop_process
    from retriever.client import LocalRetriever

    settings = AgentSettings(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                             max_obs_tokens=4000)  # whole observations: `scripted` needs them
    batch_sizes = [int(s) for s in args.batch_sizes.split(",")]
    print(f"cache: {os.environ['LLDS_CACHE_DIR']}  torch threads: {args.threads}  "
          f"cpus: {os.cpu_count()}  load average: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="llds-bench-models-") as tmp:
        start = time.perf_counter()
        models = build_models(Path(tmp))
        questions = [question_for(t) for t in corpus_titles(args.questions)]
        retriever = LocalRetriever(engine=ENGINE)
        retriever.search(["warm up"])  # builds the bm25s index, then the server loads it
        process, url = start_server()
        print(f"set-up (models, index, server): {time.perf_counter() - start:.1f}s")
        try:
            for name in args.models.split(","):
                bench_model(name, models[name], url, retriever, questions, settings,
                            batch_sizes)
        finally:
            stop_process(process)
    return 0


if __name__ == "__main__":
    sys.exit(main())
