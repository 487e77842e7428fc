"""Start the studio: `python app.py [--model ID|PATH] [--retriever-url URL] [--port 7860]`.

Every flag has an environment fallback (for Hugging Face Spaces, which set
GRADIO_SERVER_NAME themselves to listen on all interfaces). With no flags: the in-process
BM25 retriever over the embedded corpus, the flagship model loaded on first use,
127.0.0.1:7860.
"""

from __future__ import annotations

import argparse
import os

from agent.models import DEFAULT_BASELINE, DEFAULT_MODEL


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(description="LLDS Search-Agent Studio (Gradio).")
    parser.add_argument("--model", default=env("LLDS_MODEL", DEFAULT_MODEL),
                        help="default model: hub id or local path (env LLDS_MODEL)")
    parser.add_argument("--baseline", default=env("LLDS_BASELINE", DEFAULT_BASELINE),
                        help="Compare tab's other model (env LLDS_BASELINE)")
    parser.add_argument("--backend", default=env("LLDS_BACKEND", "transformers"),
                        choices=["transformers", "openai"],
                        help="model backend (env LLDS_BACKEND)")
    parser.add_argument("--base-url", default=env("LLDS_BASE_URL", "http://127.0.0.1:8001/v1"),
                        help="OpenAI-compatible server for --backend openai (env LLDS_BASE_URL)")
    parser.add_argument("--device", default=env("LLDS_DEVICE", "auto"),
                        help="auto, cpu, cuda, mps (env LLDS_DEVICE)")
    parser.add_argument("--retriever-url", default=env("RETRIEVER_URL"),
                        help="a Search-R1 /retrieve endpoint; default: in-process "
                             "(env RETRIEVER_URL)")
    parser.add_argument("--corpus", default=env("RETRIEVER_CORPUS", "default"),
                        help="in-process corpus (env RETRIEVER_CORPUS)")
    parser.add_argument("--engine", default=env("RETRIEVER_ENGINE", "bm25"),
                        choices=["bm25", "bm25s", "dense"],
                        help="in-process engine (env RETRIEVER_ENGINE)")
    parser.add_argument("--index", default=env("RETRIEVER_INDEX"),
                        help="in-process index (env RETRIEVER_INDEX)")
    parser.add_argument("--host", default=env("GRADIO_SERVER_NAME", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(env("GRADIO_SERVER_PORT", "7860")))
    parser.add_argument("--share", action="store_true",
                        default=env("LLDS_SHARE", "").lower() in ("1", "true", "yes"))
    parser.add_argument("--concurrency", type=int, default=int(env("LLDS_CONCURRENCY", "4")),
                        help="runs the queue serves at once (env LLDS_CONCURRENCY)")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="don't open the in-process retriever at start-up")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from app.ui import build_app, launch_options, make_backend_factory, make_retriever
    from app.ui.evaluate_tab import evaluate_tab
    from app.ui.session import warm_up

    retriever = make_retriever(args.retriever_url, args.corpus, args.engine, args.index)
    if not args.no_warm_up:
        warm_up(retriever)  # the JVM and the index start while the page loads
    demo = build_app(make_backend_factory(args.backend, args.device, args.base_url), retriever,
                     default_model=args.model, baseline_model=args.baseline,
                     concurrency=args.concurrency, extra_tabs=[evaluate_tab])
    demo.launch(**launch_options(args.host, args.port, args.share))


if __name__ == "__main__":
    main()
