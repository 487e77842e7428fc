"""One interface for every engine: `search(queries, topk) -> list[list[Doc]]`."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from retriever.corpus import resolve_corpus
from retriever.doc import Doc

ENGINES = ("bm25", "bm25s", "dense")


class Engine(Protocol):
    name: str
    num_docs: int

    def search(self, queries: list[str], topk: int) -> list[list[Doc]]: ...


def open_engine(engine: str = "bm25", corpus: str | None = "default", index: str | None = None,
                encoder: str | None = None, threads: int | None = None) -> Engine:
    """Open (building and caching on first use) an engine over a corpus."""
    if engine == "bm25":
        from retriever.lucene import open_lucene

        # A prebuilt or existing Lucene index carries its own documents: no corpus needed.
        return open_lucene(None if index else resolve_corpus(corpus), index, threads=threads)
    if engine == "bm25s":
        from retriever.sparse import SparseBM25

        return SparseBM25(resolve_corpus(corpus), index_dir=None if index is None else Path(index))
    if engine == "dense":
        from retriever.dense import DEFAULT_ENCODER, DenseRetriever

        return DenseRetriever(resolve_corpus(corpus), index=index,
                              encoder=encoder or DEFAULT_ENCODER)
    raise ValueError(f"Unknown engine {engine!r}: choose one of {', '.join(ENGINES)}.")
