"""`python -m retriever serve | search | index`."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from retriever.corpus import CorpusError
from retriever.engine import ENGINES, open_engine
from retriever.pyserini_compat import DEFAULT_JAVA_HEAP, set_java_heap


def _engine_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=ENGINES,
                        default=os.environ.get("RETRIEVER_ENGINE", "bm25"),
                        help="bm25 (pyserini Lucene, default), bm25s (no JVM), dense (FAISS)")
    parser.add_argument("--corpus", default=os.environ.get("RETRIEVER_CORPUS", "default"),
                        help="'default' (embedded Wikipedia summaries) or a .jsonl(.gz) path")
    parser.add_argument("--index", default=os.environ.get("RETRIEVER_INDEX"),
                        help="an existing index: Lucene dir or pyserini prebuilt name (bm25), "
                             "bm25s dir, or a FAISS file such as e5_Flat.index (dense)")
    parser.add_argument("--encoder", default=os.environ.get("RETRIEVER_ENCODER"),
                        help="dense encoder, hub id or path (default intfloat/e5-base-v2)")
    parser.add_argument("--java-heap", default=os.environ.get("RETRIEVER_JAVA_HEAP",
                                                              DEFAULT_JAVA_HEAP),
                        help="the bm25 engine's JVM heap limit, as java -Xmx (default "
                             f"{DEFAULT_JAVA_HEAP})")


def _open(args: argparse.Namespace):
    if args.engine == "bm25":
        set_java_heap(args.java_heap)
    return open_engine(args.engine, corpus=args.corpus, index=args.index, encoder=args.encoder)


def cmd_serve(args: argparse.Namespace) -> None:
    from retriever.server import serve

    if args.max_queries < 1 or args.max_body_mb <= 0:
        raise ValueError("--max-queries and --max-body-mb must be positive.")
    engine = _open(args)
    print(f"{engine.name} over {engine.num_docs} documents; POST "
          f"http://{args.host}:{args.port}/retrieve", file=sys.stderr)
    serve(engine, host=args.host, port=args.port, default_topk=args.topk,
          max_queries=args.max_queries, max_body_mb=args.max_body_mb)


def cmd_search(args: argparse.Namespace) -> None:
    from app.protocol import render_documents

    docs = _open(args).search([args.query], args.topk)[0]
    if not docs:
        print("(no documents matched)")
    print(render_documents(d.contents for d in docs), end="")


def cmd_index(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    engine = _open(args)
    seconds = time.perf_counter() - start
    where = getattr(engine, "index_path", None)
    size = sum(f.stat().st_size for f in Path(where).rglob("*") if f.is_file()) if where else 0
    print(f"engine={engine.name} docs={engine.num_docs} seconds={seconds:.1f}"
          + (f" index={where} size_mb={size / 2**20:.1f}" if where else ""))


def main(argv: list[str] | None = None) -> int:
    from retriever.server import MAX_BODY_MB, MAX_QUERIES

    parser = argparse.ArgumentParser(prog="python -m retriever",
                                     description="Search-R1 compatible retrieval.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the /retrieve HTTP server")
    _engine_flags(serve)
    serve.add_argument("--topk", type=int, default=int(os.environ.get("RETRIEVER_TOPK", 3)))
    serve.add_argument("--host", default=os.environ.get("RETRIEVER_HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(os.environ.get("RETRIEVER_PORT", 8000)))
    serve.add_argument("--max-queries", type=int,
                       default=int(os.environ.get("RETRIEVER_MAX_QUERIES", MAX_QUERIES)),
                       help="queries allowed in one request (Search-R1 training sends a whole "
                            f"rollout batch at once; default {MAX_QUERIES})")
    serve.add_argument("--max-body-mb", type=float,
                       default=float(os.environ.get("RETRIEVER_MAX_BODY_MB", MAX_BODY_MB)),
                       help=f"largest request body in MiB (default {MAX_BODY_MB}); bigger "
                            "ones get a 413")
    search = sub.add_parser("search", help="print the documents retrieved for one query")
    search.add_argument("query")
    search.add_argument("--topk", type=int, default=3)
    _engine_flags(search)
    index = sub.add_parser("index", help="build (or find cached) index and report on it")
    _engine_flags(index)
    args = parser.parse_args(argv)
    try:
        {"serve": cmd_serve, "search": cmd_search, "index": cmd_index}[args.command](args)
    except (CorpusError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
