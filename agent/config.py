"""Flags and env vars -> a backend, a retriever and `AgentSettings`: the one place it happens.

`python app.py`, `python -m app.infer` and `python -m evaluator` add these flag groups and
build their objects with these functions, so a flag, its env-var twin and its default mean
the same in every front end.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from dataclasses import dataclass

from agent.backends.base import Backend
from agent.loop import CONTEXT_FULL_RULES, AgentSettings
from agent.models import AUTO, model_flag, resolve
from retriever.engine import ENGINE_ALIASES, ENGINES, canonical_engine

BACKENDS = ("transformers", "openai", "llamacpp")
DEFAULT_BASE_URL = "http://127.0.0.1:8001/v1"


def env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def default_engine() -> str:
    """The in-process engine when none is named: Lucene (Search-R1's BM25), except where the
    `spaces` package is importable (Hugging Face Spaces, ZeroGPU): there a GPU call runs in a
    forked process, which a JVM in the parent does not survive, so the JVM-free bm25s."""
    return "bm25s" if importlib.util.find_spec("spaces") is not None else "lucene"


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--model", default=env("LLDS_MODEL", AUTO), type=model_flag,
                       help="hub id, local path, or a shipped model's short name (nano); "
                            "default auto: the flagship LLDS checkpoint where a GPU and the "
                            "checkpoint are at hand, else the nano agent (env LLDS_MODEL)")
    group.add_argument("--backend", choices=BACKENDS, default=env("LLDS_BACKEND", "transformers"),
                       help="model backend; llamacpp runs a GGUF from `python -m "
                            "app.quantize` (--model DIR/model.gguf) (env LLDS_BACKEND)")
    group.add_argument("--base-url", default=env("LLDS_BASE_URL", DEFAULT_BASE_URL),
                       help="OpenAI-compatible server for --backend openai (env LLDS_BASE_URL)")
    group.add_argument("--tokenizer", default=env("LLDS_TOKENIZER"),
                       help="tokenizer for --backend openai (default: the model's; "
                            "env LLDS_TOKENIZER)")
    group.add_argument("--device", default=env("LLDS_DEVICE", "auto"),
                       help="auto, cpu, cuda, mps (env LLDS_DEVICE)")
    group.add_argument("--trust-remote-code", action="store_true",
                       help="allow model repos to run their own code (off unless asked)")


def add_retriever_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("retriever")
    group.add_argument("--retriever-url", default=env("RETRIEVER_URL"),
                       help="a Search-R1 /retrieve server; default: in-process retriever "
                            "(env RETRIEVER_URL)")
    group.add_argument("--corpus", default=env("RETRIEVER_CORPUS", "default"),
                       help="in-process corpus (env RETRIEVER_CORPUS)")
    group.add_argument("--engine", choices=(*ENGINES, *ENGINE_ALIASES), type=str.lower,
                       default=env("RETRIEVER_ENGINE") or default_engine(),
                       help="in-process engine: lucene (bm25 is the same), bm25s or dense; "
                            "default lucene, or bm25s where the `spaces` package is "
                            "(env RETRIEVER_ENGINE)")
    group.add_argument("--index", default=env("RETRIEVER_INDEX"),
                       help="in-process index (env RETRIEVER_INDEX)")


def add_agent_flags(parser: argparse.ArgumentParser, max_new_tokens: int = 500) -> None:
    group = parser.add_argument_group("agent")
    group.add_argument("--max-turns", type=int, default=4,
                       help="rounds with retrieval; one closing round without follows")
    group.add_argument("--topk", type=int, default=3)
    group.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    group.add_argument("--max-obs-tokens", type=int, default=500,
                       help="observation cap in tokens (Search-R1: 500)")
    group.add_argument("--greedy", action="store_true", default=True)
    group.add_argument("--temperature", type=float, default=None,
                       help="sample at this temperature (turns greedy off)")
    group.add_argument("--top-p", type=float, default=1.0)
    group.add_argument("--seed", type=int, default=None)
    group.add_argument("--stop-on-eos", action="store_true",
                       help="end the run at EOS (infer.py) instead of the invalid-action note")
    group.add_argument("--on-context-full", choices=CONTEXT_FULL_RULES,
                       default=env("LLDS_ON_CONTEXT_FULL", "truncate"),
                       help="when the context outgrows 4,096 tokens: truncate (keep its last "
                            "4,096 tokens and go on, as Search-R1 does) or stop (end the run "
                            "with context_full) (env LLDS_ON_CONTEXT_FULL)")


def agent_settings(args: argparse.Namespace) -> AgentSettings:
    sampling = args.temperature is not None and args.temperature > 0
    return AgentSettings(max_turns=args.max_turns, topk=args.topk,
                         max_new_tokens=args.max_new_tokens,
                         max_obs_tokens=args.max_obs_tokens, greedy=not sampling,
                         temperature=args.temperature if sampling else 1.0, top_p=args.top_p,
                         seed=args.seed, stop_on_eos=args.stop_on_eos,
                         on_context_full=args.on_context_full)


@dataclass(frozen=True)
class BackendOptions:
    """How to load any model: what the model flags say, except which model."""

    kind: str = "transformers"
    device: str = "auto"
    base_url: str = DEFAULT_BASE_URL
    tokenizer: str | None = None
    trust_remote_code: bool = False
    concurrency: int = 16  # requests in flight (openai)

    def load(self, model: str) -> Backend:
        """The backend for `model` (hub id, local path, a shipped model's short name, or a
        served name); ModelLoadError."""
        model = resolve(model)
        if self.kind == "openai":
            from agent.backends.openai_compat import OpenAIBackend

            return OpenAIBackend(model, base_url=self.base_url, tokenizer=self.tokenizer,
                                 concurrency=self.concurrency)
        if self.kind == "llamacpp":  # a GGUF written by `python -m app.quantize`
            from agent.backends.llamacpp import LlamaCppBackend

            return LlamaCppBackend(model)
        if self.kind == "transformers":
            from agent.backends.hf import TransformersBackend

            return TransformersBackend(model, device=self.device,
                                       trust_remote_code=self.trust_remote_code)
        raise ValueError(f"Unknown backend {self.kind!r}: choose one of {', '.join(BACKENDS)}.")


def backend_options(args: argparse.Namespace, concurrency: int = 16) -> BackendOptions:
    return BackendOptions(args.backend, args.device, args.base_url, args.tokenizer,
                          args.trust_remote_code, concurrency)


def make_backend(args: argparse.Namespace, concurrency: int = 16) -> Backend:
    return backend_options(args, concurrency).load(args.model)


def make_retriever(args: argparse.Namespace):
    from retriever.client import open_retriever

    return open_retriever(args.retriever_url, args.corpus, args.engine, args.index)


def retriever_label(args: argparse.Namespace) -> str:
    if args.retriever_url:
        return args.retriever_url
    label = f"{canonical_engine(args.engine)}:{args.corpus}"
    return label + (f":{args.index}" if args.index else "")
