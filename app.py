"""Start the studio: `python app.py [--model ID|PATH] [--retriever-url URL] [--port 7860]`.

The model and retriever flags are `agent.config`'s, as for `python -m app.infer` and the
evaluator; every flag has an environment fallback (for Hugging Face Spaces, which set
GRADIO_SERVER_NAME themselves to listen on all interfaces). With no flags: the in-process
BM25 retriever over the embedded corpus, the flagship model loaded on first use,
127.0.0.1:7860.
"""

from __future__ import annotations

import argparse

from agent.config import add_model_flags, add_retriever_flags, env
from agent.models import DEFAULT_BASELINE


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="LLDS Search-Agent Studio (Gradio).")
    add_model_flags(parser)
    add_retriever_flags(parser)
    group = parser.add_argument_group("studio")
    group.add_argument("--baseline", default=env("LLDS_BASELINE", DEFAULT_BASELINE),
                       help="Compare tab's other model (env LLDS_BASELINE)")
    group.add_argument("--host", default=env("GRADIO_SERVER_NAME", "127.0.0.1"))
    group.add_argument("--port", type=int, default=int(env("GRADIO_SERVER_PORT", "7860")))
    group.add_argument("--share", action="store_true",
                       default=(env("LLDS_SHARE") or "").lower() in ("1", "true", "yes"))
    group.add_argument("--concurrency", type=int, default=int(env("LLDS_CONCURRENCY", "4")),
                       help="runs the queue serves at once (env LLDS_CONCURRENCY)")
    group.add_argument("--no-warm-up", action="store_true",
                       help="don't open the in-process retriever at start-up")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from agent.config import backend_options, make_retriever
    from app.ui import build_app, launch_options
    from app.ui.evaluate_tab import evaluate_tab
    from app.ui.model_pool import warm_up

    retriever = make_retriever(args)
    if not args.no_warm_up:
        warm_up(retriever)  # the JVM and the index start while the page loads
    demo = build_app(backend_options(args).load, retriever, default_model=args.model,
                     baseline_model=args.baseline, concurrency=args.concurrency,
                     extra_tabs=[evaluate_tab])
    demo.launch(**launch_options(args.host, args.port, args.share))


if __name__ == "__main__":
    main()
