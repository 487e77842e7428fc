"""Flags shared by every front end (CLI, evaluator, app), with env-var fallbacks."""

from __future__ import annotations

import argparse
import os

from agent.loop import AgentSettings
from agent.models import DEFAULT_MODEL


def env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--model", default=env("LLDS_MODEL", DEFAULT_MODEL),
                       help="hub id or local path (env LLDS_MODEL)")
    group.add_argument("--backend", choices=("transformers", "openai"),
                       default=env("LLDS_BACKEND", "transformers"))
    group.add_argument("--base-url", default=env("LLDS_BASE_URL", "http://127.0.0.1:8001/v1"),
                       help="OpenAI-compatible server for --backend openai")
    group.add_argument("--tokenizer", default=env("LLDS_TOKENIZER"),
                       help="tokenizer for --backend openai (default: the model's)")
    group.add_argument("--device", default=env("LLDS_DEVICE", "auto"))
    group.add_argument("--trust-remote-code", action="store_true",
                       help="allow model repos to run their own code (off unless asked)")


def add_retriever_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("retriever")
    group.add_argument("--retriever-url", default=env("RETRIEVER_URL"),
                       help="a Search-R1 /retrieve server; default: in-process retriever")
    group.add_argument("--corpus", default=env("RETRIEVER_CORPUS", "default"))
    group.add_argument("--engine", choices=("bm25", "bm25s", "dense"),
                       default=env("RETRIEVER_ENGINE", "bm25"))
    group.add_argument("--index", default=env("RETRIEVER_INDEX"))


def add_agent_flags(parser: argparse.ArgumentParser, max_new_tokens: int = 500) -> None:
    group = parser.add_argument_group("agent")
    group.add_argument("--max-turns", type=int, default=4)
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


def agent_settings(args: argparse.Namespace) -> AgentSettings:
    sampling = args.temperature is not None and args.temperature > 0
    return AgentSettings(max_turns=args.max_turns, topk=args.topk,
                         max_new_tokens=args.max_new_tokens,
                         max_obs_tokens=args.max_obs_tokens, greedy=not sampling,
                         temperature=args.temperature if sampling else 1.0, top_p=args.top_p,
                         seed=args.seed, stop_on_eos=args.stop_on_eos)


def make_backend(args: argparse.Namespace):
    if args.backend == "openai":
        from agent.backends.openai_compat import OpenAIBackend

        return OpenAIBackend(args.model, base_url=args.base_url, tokenizer=args.tokenizer,
                             concurrency=getattr(args, "concurrency", 16))
    from agent.backends.hf import TransformersBackend

    return TransformersBackend(args.model, device=args.device,
                               trust_remote_code=args.trust_remote_code)


def make_retriever(args: argparse.Namespace):
    from retriever.client import open_retriever

    return open_retriever(args.retriever_url, args.corpus, args.engine, args.index)


def retriever_label(args: argparse.Namespace) -> str:
    if args.retriever_url:
        return args.retriever_url
    return f"{args.engine}:{args.corpus}" + (f":{args.index}" if args.index else "")
