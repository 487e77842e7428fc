"""Start the studio: `python -m app` (or `python app.py`, or the `llds-studio` command)
`[--model ID|PATH|nano] [--retriever-url URL] [--port 7860]`.

The model and retriever flags are `agent.config`'s, as for `python -m app.infer` and the
evaluator; every flag has an environment fallback (for Hugging Face Spaces, which set
GRADIO_SERVER_NAME themselves to listen on all interfaces; the port is GRADIO_SERVER_PORT,
else PORT, else 7860). With no flags: the in-process
BM25 retriever over the embedded corpus, 127.0.0.1:7860, and the default model of
`agent.models.default_model` (the flagship where a GPU and the checkpoint are at hand, else
the nano agent). At start the retriever runs one search, and a nano default model is loaded
and asked one question, while the page loads, so a visitor's first question is not the
slow one (`--no-warm-up` skips this); a GGUF default (`--model ID:q4_k_m`, run by llama.cpp)
is converted on the first start and loaded, its progress on the Ask tab's status line.

Bound beyond loopback (`--host 0.0.0.0`) or with `--share`, visitors may load only the
registry's models and those named here, and no server paths (`app.ui.access`), unless
`--allow-local-paths`; and only the models this machine's free memory and disk hold
(`app.capacity`; `--memory-budget-gb` caps the memory, exposed or not).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agent.config import add_model_flags, add_retriever_flags, env


def _on(name: str) -> bool:
    return (env(name) or "").lower() in ("1", "true", "yes")


def port_number(value: str) -> int:
    """argparse `type` of --port (and of its env fallbacks): a TCP port, 1-65535."""
    try:
        port = int(value)
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a port (1-65535): fix --port, GRADIO_SERVER_PORT or PORT")
    return port


def budget_gb(value: str) -> float:
    """argparse `type` of --memory-budget-gb: a positive number of GB."""
    try:
        size = float(value)
    except ValueError:
        size = 0.0
    if not 0 < size < float("inf"):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a memory size in GB (a positive number, e.g. 15): fix "
            "--memory-budget-gb or LLDS_MEMORY_BUDGET_GB")
    return size


def default_port() -> str:
    """GRADIO_SERVER_PORT (Gradio's own variable), else PORT (what many hosts set), else
    7860; a string, so argparse checks it with `port_number` only when --port is absent."""
    return env("GRADIO_SERVER_PORT") or env("PORT") or "7860"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    started_as = Path(sys.argv[0]).name  # app.py, llds-studio, or __main__.py for -m
    parser = argparse.ArgumentParser(
        prog="python -m app" if started_as == "__main__.py" else started_as,
        description="LLDS Search-Agent Studio (Gradio).")
    add_model_flags(parser)
    add_retriever_flags(parser)
    group = parser.add_argument_group("studio")
    group.add_argument("--baseline", default=env("LLDS_BASELINE"),
                       help="Compare tab's model A (B is --model); default: beside the nano "
                            "agent its GRPO and LLDS versions side by side, else the Search-R1 "
                            "PPO baseline (env LLDS_BASELINE)")
    group.add_argument("--host", default=env("GRADIO_SERVER_NAME") or "127.0.0.1",
                       help="address to listen on; 0.0.0.0 exposes the studio to the network "
                            "(env GRADIO_SERVER_NAME, which a Space sets to 0.0.0.0)")
    group.add_argument("--port", type=port_number, default=default_port(),
                       help="port to listen on (env GRADIO_SERVER_PORT, else PORT, else 7860)")
    group.add_argument("--share", action="store_true", default=_on("LLDS_SHARE"),
                       help="a public Gradio share link (env LLDS_SHARE)")
    group.add_argument("--allow-local-paths", action="store_true",
                       default=_on("LLDS_ALLOW_LOCAL_PATHS"),
                       help="when bound beyond loopback or shared, still let visitors load "
                            "any model (a directory on this server or any hub repo) and read "
                            "any data directory; RISK: anyone who reaches the page can then "
                            "read datasets on this machine and fill its disk and memory "
                            "(env LLDS_ALLOW_LOCAL_PATHS)")
    group.add_argument("--memory-budget-gb", type=budget_gb,
                       default=env("LLDS_MEMORY_BUDGET_GB") or None,
                       help="memory the models may take, in GB (RAM on a CPU, GPU memory on "
                            "a GPU); default: what is free when a model loads. Exposed, or "
                            "with this set, models that don't fit are shown unavailable and "
                            "refused (env LLDS_MEMORY_BUDGET_GB)")
    group.add_argument("--concurrency", type=int, default=int(env("LLDS_CONCURRENCY", "32")),
                       help="questions the page takes at once (env LLDS_CONCURRENCY); each "
                            "model answers those asked of it together, up to --max-batch at "
                            "once, the rest in line; past this many, visitors wait in "
                            "Gradio's queue")
    group.add_argument("--max-batch", type=int, default=int(env("LLDS_MAX_BATCH", "16")),
                       help="questions one model answers together (env LLDS_MAX_BATCH)")
    group.add_argument("--no-warm-up", action="store_true",
                       help="don't warm the retriever (and a nano default model) at start")
    return parser.parse_args(argv)


def studio_plan(args: argparse.Namespace):
    """(the Compare tab's pair (A, B), the access policy) that the flags ask for."""
    from agent.models import default_pair
    from app.ui.access import Access

    pair = (args.baseline, args.model) if args.baseline else default_pair(args.model)
    access = Access.for_launch(args.host, args.share, args.allow_local_paths,
                               named=(args.model, *pair))
    return pair, access


def studio_capacity(args: argparse.Namespace, access):
    """The hardware check (`app.capacity.Capacity`) for a studio that runs its models here
    and is exposed or given a memory budget; None otherwise (on loopback the operator loads
    what they like)."""
    if args.backend == "openai" or not (access.exposed or args.memory_budget_gb):
        return None
    from app.capacity import Capacity

    return Capacity.for_launch(args.device, args.memory_budget_gb)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from agent.config import backend_options, make_retriever
    from agent.models import is_gguf, is_nano
    from app.gguf_cache import studio_loader
    from app.ui import build_app, launch_options
    from app.ui.model_pool import warm_up, warm_up_model

    pair, access = studio_plan(args)
    retriever = make_retriever(args)
    load = studio_loader(backend_options(args).load)  # ID:q4_k_m names run on llama.cpp
    demo = build_app(load, retriever, default_model=args.model,
                     baseline_model=pair[0], concurrency=args.concurrency,
                     max_batch=args.max_batch,
                     access=access, compare_pair=pair,
                     capacity=studio_capacity(args, access))
    if not args.no_warm_up:  # while the page loads
        studio = demo.studio  # type: ignore[attr-defined]
        if is_nano(args.model):  # small enough to load and run at once, on a CPU
            warm_up_model(studio.pool, args.model, retriever, studio.first_example())
        elif is_gguf(args.model):  # converted (first start) and loaded before a visitor asks
            warm_up_model(studio.pool, args.model, retriever, question=None)
        else:
            warm_up(retriever)
    demo.launch(**launch_options(args.host, args.port, args.share))


if __name__ == "__main__":
    main()
