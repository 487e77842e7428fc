"""BM25 with bm25s: the same scoring as Lucene without a JVM.

Parameters follow Lucene's defaults in Search-R1's BM25 (k1 0.9, b 0.4), and the analysis
mirrors Lucene's EnglishAnalyzer as closely as bm25s allows: lowercase, its 33 English
stopwords, the original Porter stemmer, possessive `'s` dropped, one-character tokens kept.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from retriever.corpus import cache_dir, corpus_key, load_records
from retriever.doc import Doc

_POSSESSIVE = re.compile(r"['’]s\b")
TOKEN_PATTERN = r"(?u)\b\w+\b"


def _stemmer():
    import Stemmer

    return Stemmer.Stemmer("porter")


def _tokenize(texts: list[str], stemmer):
    import bm25s

    texts = [_POSSESSIVE.sub("", t) for t in texts]
    return bm25s.tokenize(texts, lower=True, token_pattern=TOKEN_PATTERN, stopwords="en",
                          stemmer=stemmer, show_progress=False)


class SparseBM25:
    name = "bm25s"

    def __init__(self, corpus: Path, index_dir: Path | None = None, k1: float = 0.9,
                 b: float = 0.4):
        import bm25s

        self.records = load_records(corpus)
        self.stemmer = _stemmer()
        index_dir = index_dir or cache_dir() / "indexes" / corpus_key(corpus) / "bm25s"
        start = time.perf_counter()
        if (index_dir / "params.index.json").is_file():
            self.model = bm25s.BM25.load(str(index_dir), show_progress=False)
        else:
            self.model = bm25s.BM25(k1=k1, b=b, method="lucene")
            tokens = _tokenize([r["contents"] for r in self.records], self.stemmer)
            self.model.index(tokens, show_progress=False)
            index_dir.mkdir(parents=True, exist_ok=True)
            self.model.save(str(index_dir), show_progress=False)
        self.build_seconds = time.perf_counter() - start
        self.index_path = index_dir
        self.num_docs = len(self.records)

    def search(self, queries: list[str], topk: int) -> list[list[Doc]]:
        if not queries:
            return []
        k = min(topk, self.num_docs)
        tokens = _tokenize(list(queries), self.stemmer)
        ids, scores = self.model.retrieve(tokens, k=k, show_progress=False, n_threads=0)
        results = []
        for row_ids, row_scores in zip(ids, scores, strict=True):
            # A query with no matching term scores everything 0; Lucene returns no hits then.
            results.append([
                Doc(id=self.records[int(i)]["id"], contents=self.records[int(i)]["contents"],
                    score=float(s))
                for i, s in zip(row_ids, row_scores, strict=True) if s > 0
            ])
        return results
