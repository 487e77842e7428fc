"""Opening an engine by name: `lucene` (pyserini's Lucene BM25, the Search-R1 reference),
`bm25s` (BM25 in Python, no JVM) or `dense` (FAISS). `bm25` is accepted for `lucene`: it is
the name Search-R1's own scripts give their Lucene BM25 retriever (`--retriever_name bm25`).
"""

from __future__ import annotations

from pathlib import Path

from retriever.base import Engine
from retriever.corpus import resolve_corpus

ENGINES = ("lucene", "bm25s", "dense")
# Search-R1's names for our engines.
ENGINE_ALIASES = {"bm25": "lucene"}


def canonical_engine(name: str) -> str:
    """The engine's canonical name (`bm25` -> `lucene`); a ValueError for an unknown one."""
    engine = ENGINE_ALIASES.get(name, name)
    if engine not in ENGINES:
        raise ValueError(f"Unknown engine {name!r}: choose one of {', '.join(ENGINES)} "
                         "(bm25 is accepted for lucene).")
    return engine


def open_engine(engine: str = "lucene", corpus: str | None = "default", index: str | None = None,
                encoder: str | None = None, threads: int | None = None,
                dense: dict | None = None) -> Engine:
    """Open (building and caching on first use) an engine over a corpus. `dense` holds the
    dense engine's index options (mmap, nprobe, ef_search, rerank_flat, gpu)."""
    engine = canonical_engine(engine)
    if dense and engine != "dense":
        raise ValueError(f"{', '.join(sorted(dense))}: options of the dense engine, not "
                         f"{engine}.")
    if engine == "lucene":
        from retriever.lucene import open_lucene

        # A prebuilt or existing Lucene index carries its own documents: no corpus needed.
        return open_lucene(None if index else resolve_corpus(corpus), index, threads=threads)
    if engine == "bm25s":
        from retriever.bm25s_engine import BM25sEngine

        return BM25sEngine(resolve_corpus(corpus),
                           index_dir=None if index is None else Path(index))
    from retriever.dense import DEFAULT_ENCODER, DenseRetriever

    return DenseRetriever(resolve_corpus(corpus), index=index,
                          encoder=encoder or DEFAULT_ENCODER, **(dense or {}))
