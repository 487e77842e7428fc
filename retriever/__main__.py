"""`python -m retriever serve | search | index | compress | download`."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from retriever import faiss_index
from retriever.corpus import CorpusError
from retriever.dense import POOLINGS, prefixes_for
from retriever.engine import ENGINE_ALIASES, ENGINES, canonical_engine, open_engine
from retriever.faiss_index import KINDS
from retriever.pyserini_compat import DEFAULT_JAVA_HEAP, set_java_heap


def _engine_flags(parser: argparse.ArgumentParser) -> None:
    # Search-R1's retrieval_server.py flag names are accepted too: --index_path,
    # --corpus_path, --retriever_model, --retriever_name, --faiss_gpu (and --topk).
    parser.add_argument("--engine", choices=(*ENGINES, *ENGINE_ALIASES), type=str.lower,
                        default=None,
                        help="lucene (pyserini's Lucene BM25, default; bm25 is the same), "
                             "bm25s (BM25 without a JVM), dense (FAISS); env RETRIEVER_ENGINE")
    parser.add_argument("--retriever_name", metavar="NAME",
                        help="Search-R1's retriever name: bm25 = --engine lucene; any other "
                             "(e5, bge, ...) = --engine dense, with the query/passage prefixes "
                             "Search-R1 gives that name (e5: 'query: '/'passage: ', bge: its "
                             "search instruction on queries, others: none)")
    parser.add_argument("--corpus", "--corpus_path", dest="corpus",
                        default=os.environ.get("RETRIEVER_CORPUS", "default"),
                        help="'default' (embedded Wikipedia summaries) or a .jsonl(.gz) path")
    parser.add_argument("--index", "--index_path", dest="index",
                        default=os.environ.get("RETRIEVER_INDEX"),
                        help="an existing index: Lucene dir or pyserini prebuilt name (lucene), "
                             "bm25s dir, or a FAISS file such as e5_Flat.index (dense)")
    parser.add_argument("--encoder", "--retriever_model", dest="encoder",
                        default=os.environ.get("RETRIEVER_ENCODER"),
                        help="dense encoder, hub id or path (default intfloat/e5-base-v2)")
    parser.add_argument("--java-heap", default=os.environ.get("RETRIEVER_JAVA_HEAP",
                                                              DEFAULT_JAVA_HEAP),
                        help="the lucene engine's JVM heap limit, as java -Xmx (default "
                             f"{DEFAULT_JAVA_HEAP})")
    dense = parser.add_argument_group("dense index options")
    dense.add_argument("--mmap", action="store_true",
                       default=os.environ.get("RETRIEVER_MMAP", "") not in ("", "0"),
                       help="memory-map the FAISS index instead of reading it into RAM")
    dense.add_argument("--nprobe", type=int, help="IVF lists searched per query")
    dense.add_argument("--ef-search", type=int, help="HNSW candidate list size")
    dense.add_argument("--rerank-flat", help="re-score a compressed index's candidates "
                                             "exactly with this flat index (memory-mapped)")
    dense.add_argument("--gpu", choices=("auto", "shard", "off"), default=None,
                       help="auto (default; env RETRIEVER_GPU): all GPUs if FAISS has GPU "
                            "support; shard: split the index over them; off: CPU")
    dense.add_argument("--faiss_gpu", action="store_true",
                       help="Search-R1's flag: the index sharded over all GPUs (--gpu shard); "
                            "an error where FAISS sees no GPU")
    dense.add_argument("--query-prefix", default=os.environ.get("RETRIEVER_QUERY_PREFIX"),
                       help="text put before each query (default 'query: ', e5's; '' for "
                            "none)")
    dense.add_argument("--passage-prefix", default=os.environ.get("RETRIEVER_PASSAGE_PREFIX"),
                       help="text put before each passage when building an index (default "
                            "'passage: ', e5's)")
    dense.add_argument("--pooling", choices=POOLINGS,
                       default=os.environ.get("RETRIEVER_POOLING"),
                       help="token vectors to one vector: mean (default, e5's), cls (first "
                            "token), last (last non-padding token)")
    dense.add_argument("--check-recall", metavar="FLAT_INDEX",
                       help="print recall@3 of --index against this flat index first")


def _resolve_search_r1_flags(args: argparse.Namespace) -> None:
    """Fold Search-R1's --retriever_name and --faiss_gpu into --engine, the prefixes and
    --gpu; a clash with our own flags is an error, not a silent choice."""
    if args.retriever_name is not None:
        implied = "lucene" if args.retriever_name.strip().lower() == "bm25" else "dense"
        if args.engine is not None and canonical_engine(args.engine) != implied:
            raise ValueError(f"--retriever_name {args.retriever_name} means --engine "
                             f"{implied}, but --engine {args.engine} was given; pass one.")
        args.engine = implied
        if implied == "dense":
            query, passage = prefixes_for(args.retriever_name)
            args.query_prefix = query if args.query_prefix is None else args.query_prefix
            args.passage_prefix = passage if args.passage_prefix is None else args.passage_prefix
    if args.faiss_gpu:
        if args.gpu not in (None, "shard"):
            raise ValueError(f"--faiss_gpu means --gpu shard, but --gpu {args.gpu} was given.")
        if faiss_index.gpu_count() == 0:
            raise ValueError("--faiss_gpu: FAISS sees no GPU here (the installed FAISS has no "
                             "GPU support, e.g. faiss-cpu, or no GPU is visible); drop "
                             "--faiss_gpu to search on the CPU.")
        args.gpu = "shard"
    args.engine = canonical_engine(args.engine or os.environ.get("RETRIEVER_ENGINE", "lucene"))
    args.gpu = args.gpu or os.environ.get("RETRIEVER_GPU", "auto")


def _open(args: argparse.Namespace):
    _resolve_search_r1_flags(args)
    if args.engine == "lucene":
        set_java_heap(args.java_heap)
    dense = {"mmap": args.mmap, "nprobe": args.nprobe, "ef_search": args.ef_search,
             "rerank_flat": args.rerank_flat, "gpu": args.gpu}
    encoding = {"query_prefix": args.query_prefix, "passage_prefix": args.passage_prefix,
                "pooling": args.pooling}
    dense.update((k, v) for k, v in encoding.items() if v is not None)
    if args.engine != "dense":
        asked = [f"--{k.replace('_', '-')}" for k, v in dense.items()
                 if v not in (None, False, "auto")]
        if asked or args.check_recall:
            raise ValueError(f"{' '.join(asked) or '--check-recall'}: options of --engine dense.")
        dense = None
    engine = open_engine(args.engine, corpus=args.corpus, index=args.index,
                         encoder=args.encoder, dense=dense)
    if dense is not None:
        print(f"dense index {engine.label} on {engine.device}", file=sys.stderr)
        if args.check_recall:
            from retriever.dense import check_recall

            print(f"recall@3 of {engine.label} against {args.check_recall}: "
                  f"{check_recall(engine, args.check_recall):.3f}", file=sys.stderr)
    return engine


def cmd_serve(args: argparse.Namespace) -> None:
    from retriever.connections import raise_open_files_limit
    from retriever.server import ServerLimits, serve

    limits = ServerLimits(max_queries=args.max_queries, max_results=args.max_results,
                          max_body_mb=args.max_body_mb, max_connections=args.max_connections,
                          header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                          min_body_rate=args.min_body_rate, body_grace=args.body_grace)
    raise_open_files_limit(limits.max_connections)  # checked before the engine loads
    engine = _open(args)
    print(f"{engine.name} over {engine.num_docs} documents; POST "
          f"http://{args.host}:{args.port}/retrieve", file=sys.stderr)
    serve(engine, host=args.host, port=args.port, default_topk=args.topk, limits=limits)


def cmd_search(args: argparse.Namespace) -> None:
    from retriever.doc import render_documents

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


def cmd_compress(args: argparse.Namespace) -> None:
    import faiss

    from retriever import faiss_index

    flat_path = Path(args.flat).expanduser()
    out = Path(args.out or flat_path.with_name(f"{flat_path.stem}.{args.kind}.index"))
    if out.exists():
        raise ValueError(f"{out} exists; pass another --out (nothing is overwritten).")
    flat = faiss_index.read_index(flat_path, mmap=True)
    start = time.perf_counter()
    index = faiss_index.build_from_flat(flat, args.kind, nlist=args.nlist, pq_m=args.pq_m,
                                        hnsw_m=args.hnsw_m,
                                        progress=lambda m: print(m, file=sys.stderr))
    seconds = time.perf_counter() - start
    faiss.write_index(index, str(out) + ".partial")
    Path(str(out) + ".partial").replace(out)
    print(f"built {out} ({args.kind}) in {seconds:.1f}s, {out.stat().st_size / 2**20:.1f} MB "
          f"(flat: {flat_path.stat().st_size / 2**20:.1f} MB); FAISS on CPU")
    if args.corpus:
        from retriever.dense import DEFAULT_ENCODER, DenseRetriever, check_recall

        engine = DenseRetriever(Path(args.corpus), index=out,
                                encoder=args.encoder or DEFAULT_ENCODER, nprobe=args.nprobe,
                                ef_search=args.ef_search, gpu="off")
        recall = check_recall(engine, flat_path, sample=args.recall_sample)
        what = f"{min(args.recall_sample, engine.num_docs)} title queries"
    else:
        faiss_index.set_search_params(index, nprobe=args.nprobe, ef_search=args.ef_search)
        sample = faiss_index.sample_rows(flat, sorted_sample(flat.ntotal, args.recall_sample))
        recall = faiss_index.check_recall(flat, index, sample)
        what = f"{len(sample)} stored vectors as queries (pass --corpus for real queries)"
    print(f"recall@3 against flat: {recall:.3f} on {what}; "
          f"{faiss_index.describe(index, out)}")


def sorted_sample(n: int, size: int):
    import numpy as np

    return np.sort(np.random.default_rng(0).choice(n, min(n, size), replace=False))


def cmd_download(args: argparse.Namespace) -> None:
    from retriever.download import default_dir, download, serve_command

    steps = download(args.name, args.engine, Path(args.dir) if args.dir else default_dir(),
                     dry_run=args.dry_run)
    print(("next: " if all(s.done for s in steps) or not args.dry_run else "then: ")
          + serve_command(steps, args.engine))


def main(argv: list[str] | None = None) -> int:
    from retriever import server as limits

    parser = argparse.ArgumentParser(prog="python -m retriever",
                                     description="Search-R1 compatible retrieval.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the /retrieve HTTP server")
    _engine_flags(serve)
    serve.add_argument("--topk", type=int, default=int(os.environ.get("RETRIEVER_TOPK", 3)))
    serve.add_argument("--host", default=os.environ.get("RETRIEVER_HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(os.environ.get("RETRIEVER_PORT", 8000)))
    serve.add_argument("--max-queries", type=int,
                       default=int(os.environ.get("RETRIEVER_MAX_QUERIES", limits.MAX_QUERIES)),
                       help="queries allowed in one request (Search-R1 training sends a whole "
                            f"rollout batch at once; default {limits.MAX_QUERIES})")
    serve.add_argument("--max-results", type=int,
                       default=int(os.environ.get("RETRIEVER_MAX_RESULTS", limits.MAX_RESULTS)),
                       help="queries x topk allowed in one request (default "
                            f"{limits.MAX_RESULTS}); more get a 422")
    serve.add_argument("--max-body-mb", type=float,
                       default=float(os.environ.get("RETRIEVER_MAX_BODY_MB", limits.MAX_BODY_MB)),
                       help=f"largest request body in MiB (default {limits.MAX_BODY_MB}); "
                            "bigger ones get a 413")
    serve.add_argument("--max-connections", type=int,
                       default=int(os.environ.get("RETRIEVER_MAX_CONNECTIONS",
                                                  limits.MAX_CONNECTIONS)),
                       help="open connections (default "
                            f"{limits.MAX_CONNECTIONS}); more are answered 503 and closed")
    serve.add_argument("--header-timeout", type=float,
                       default=float(os.environ.get("RETRIEVER_HEADER_TIMEOUT",
                                                    limits.HEADER_TIMEOUT)),
                       help="seconds a client has to send a request's headers (default "
                            f"{limits.HEADER_TIMEOUT:g}); then it gets a 408 and is closed")
    serve.add_argument("--body-timeout", type=float,
                       default=float(os.environ.get("RETRIEVER_BODY_TIMEOUT",
                                                    limits.BODY_TIMEOUT)),
                       help="seconds a client has to send a request's body (default "
                            f"{limits.BODY_TIMEOUT:g})")
    serve.add_argument("--min-body-rate", type=float,
                       default=float(os.environ.get("RETRIEVER_MIN_BODY_RATE",
                                                    limits.MIN_BODY_RATE)),
                       help="bytes/s a request's body must average after --body-grace "
                            f"(default {limits.MIN_BODY_RATE:g}); slower gets a 408 and the "
                            "connection closes, and at --max-connections makes room")
    serve.add_argument("--body-grace", type=float,
                       default=float(os.environ.get("RETRIEVER_BODY_GRACE",
                                                    limits.BODY_GRACE)),
                       help="seconds a body may take before --min-body-rate applies "
                            f"(default {limits.BODY_GRACE:g})")
    search = sub.add_parser("search", help="print the documents retrieved for one query")
    search.add_argument("query")
    search.add_argument("--topk", type=int, default=3)
    _engine_flags(search)
    index = sub.add_parser("index", help="build (or find cached) index and report on it")
    _engine_flags(index)
    compress = sub.add_parser("compress", help="build a compressed FAISS index from a flat "
                                               "one (no re-encoding) and report its recall")
    compress.add_argument("--flat", required=True, help="the flat index, e.g. e5_Flat.index")
    compress.add_argument("--kind", required=True, choices=KINDS[1:])
    compress.add_argument("--out", help="where to write it (default beside the flat index)")
    compress.add_argument("--nlist", type=int, help="IVF lists (default about 4·sqrt(n))")
    compress.add_argument("--pq-m", type=int, default=96, help="PQ bytes per vector")
    compress.add_argument("--hnsw-m", type=int, default=32, help="HNSW links per node")
    compress.add_argument("--nprobe", type=int, help="IVF lists probed for the recall check")
    compress.add_argument("--ef-search", type=int, help="HNSW efSearch for the recall check")
    compress.add_argument("--corpus", help="the flat index's corpus: recall on real queries")
    compress.add_argument("--encoder", help="query encoder (default intfloat/e5-base-v2)")
    compress.add_argument("--recall-sample", type=int, default=1000)
    fetch = sub.add_parser("download", help="fetch wiki-18 and its index (Search-R1's assets)")
    fetch.add_argument("name", help="the data set: wiki-18")
    fetch.add_argument("--engine", choices=("dense", "lucene", "bm25"), default="dense")
    fetch.add_argument("--dir", default=None, help="target directory (default "
                                                   "$RETRIEVER_DATA_DIR, else the cache)")
    fetch.add_argument("--dry-run", action="store_true", help="print the plan only")
    args = parser.parse_args(argv)
    try:
        {"serve": cmd_serve, "search": cmd_search, "index": cmd_index,
         "compress": cmd_compress, "download": cmd_download}[args.command](args)
    except (CorpusError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
