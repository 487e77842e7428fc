"""BM25 with bm25s: the same scoring as Lucene without a JVM.

Parameters follow Lucene's defaults in Search-R1's BM25 (k1 0.9, b 0.4), and the analysis
mirrors Lucene's EnglishAnalyzer as closely as bm25s allows: lowercase, its 33 English
stopwords, the original Porter stemmer, possessive `'s` dropped, one-character tokens kept.

bm25s indexes; a batch is scored here as one sparse product (query term counts times bm25s's
term-by-document score matrix), the same sums bm25s makes one query at a time.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import numpy
import scipy.sparse

from retriever.base import IsolatedSearch
from retriever.corpus import cache_dir, corpus_key, load_records
from retriever.doc import Doc

_POSSESSIVE = re.compile(r"['’]s\b")
TOKEN_PATTERN = r"(?u)\b\w+\b"


def _bm25s():
    """bm25s, imported so that it leaves the GPU alone. Importing bm25s runs a JAX top-k
    when JAX is installed, and JAX by default preallocates most of a GPU's memory in every
    process that imports it, leaving none for a model on the same GPU. Only bm25s's own
    import uses JAX here (this engine scores with scipy), so JAX is kept on the CPU and its
    preallocation off, unless the user has set either variable or imported JAX already."""
    if "jax" not in sys.modules:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import bm25s

    return bm25s


def _stemmer():
    import Stemmer

    return Stemmer.Stemmer("porter")


# Score at most this many (query, document) pairs at once: a bound on the product's size
# should every document match (64 MB of float32).
MAX_SCORES_AT_ONCE = 16 * 2**20


def _tokenize(texts: list[str], stemmer, return_ids: bool = True):
    bm25s = _bm25s()
    texts = [_POSSESSIVE.sub("", t) for t in texts]
    return bm25s.tokenize(texts, lower=True, token_pattern=TOKEN_PATTERN, stopwords="en",
                          stemmer=stemmer, show_progress=False, return_ids=return_ids)


class BM25sEngine(IsolatedSearch):
    name = "bm25s"

    def __init__(self, corpus: Path, index_dir: Path | None = None, k1: float = 0.9,
                 b: float = 0.4):
        bm25s = _bm25s()
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
        # Row t holds term t's BM25 weight in every document that contains it.
        scores = self.model.scores
        self.term_scores = scipy.sparse.csr_matrix(
            (scores["data"], scores["indices"], scores["indptr"]),
            shape=(len(scores["indptr"]) - 1, scores["num_docs"]))

    def _score(self, queries: list[str]) -> scipy.sparse.csr_matrix:
        """(queries x documents) BM25 scores, stored for matching documents only; a repeated
        query term counts again, as in bm25s and in Anserini's bag-of-words queries."""
        vocab = self.model.vocab_dict
        rows, cols = [], []
        for row, terms in enumerate(_tokenize(queries, self.stemmer, return_ids=False)):
            for term in terms:
                col = vocab.get(term)
                if col is not None:
                    rows.append(row)
                    cols.append(col)
        counts = scipy.sparse.csr_matrix(
            (numpy.ones(len(rows), dtype=numpy.float32), (rows, cols)),
            shape=(len(queries), self.term_scores.shape[0]))
        return counts @ self.term_scores

    def _top(self, docs: numpy.ndarray, scores: numpy.ndarray, k: int) -> list[Doc]:
        if len(scores) > k:
            best = numpy.argpartition(-scores, k - 1)[:k]
            docs, scores = docs[best], scores[best]
        order = numpy.lexsort((docs, -scores))  # by score, ties by corpus order
        return [Doc(id=self.records[i]["id"], contents=self.records[i]["contents"], score=s)
                for i, s in zip(docs[order].tolist(), scores[order].tolist(), strict=True)
                if s > 0]

    def search_batch(self, queries: list[str], topk: int) -> list[list[Doc]]:
        if not queries:
            return []
        k = min(topk, self.num_docs)
        step = max(1, MAX_SCORES_AT_ONCE // self.num_docs)
        results = []
        for start in range(0, len(queries), step):
            scores = self._score(queries[start:start + step])
            for row in range(scores.shape[0]):
                lo, hi = scores.indptr[row], scores.indptr[row + 1]
                results.append(self._top(scores.indices[lo:hi], scores.data[lo:hi], k))
        return results
