"""BM25 with pyserini's Lucene searcher: the Search-R1 reference engine."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy
import orjson

from retriever.base import IsolatedSearch
from retriever.corpus import CorpusError, cache_dir, corpus_key, iter_records
from retriever.doc import Doc
from retriever.pyserini_compat import index_collection, java_max_heap_mb, load_lucene

# Corpora up to this size are held in memory (the default one is ~7 MB) and their index
# stores only ids: Anserini loads every hit's stored fields, and an index that also stores
# the raw JSON makes that a quarter of the search time. wiki-18's 13 GB keeps its documents
# in the index instead.
IN_MEMORY_CORPUS_BYTES = 512 * 2**20
# Lucene refuses a query of more than 1,024 clauses (one per distinct term), and inside a
# batch that failure fails every query. 8,192 holds any query the server takes (2,000
# characters); a longer in-process query that still overflows fails alone (IsolatedSearch).
MAX_CLAUSES = 8192


def looks_like_path(index: str) -> bool:
    """A local index is a path; anything else is taken as a pyserini prebuilt index name."""
    return os.sep in index or index.startswith(".") or Path(index).expanduser().exists()


def build_index(corpus: Path, index_dir: Path | None = None, threads: int | None = None,
                store_raw: bool = True) -> Path:
    """Index a wiki-18 JSON-lines corpus with Anserini; cached by corpus content key.

    `store_raw=False` stores ids only: the documents then come from the corpus itself.
    """
    name = "lucene" if store_raw else "lucene-ids"
    index_dir = index_dir or cache_dir() / "indexes" / corpus_key(corpus) / name
    if (index_dir / "segments_1").exists() or any(index_dir.glob("segments_*")):
        return index_dir
    index_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=index_dir.parent) as tmp:
        # JsonCollection reads a directory of .jsonl files, so give it one holding the corpus.
        collection = Path(tmp) / "collection"
        collection.mkdir()
        os.symlink(corpus.resolve(), collection / ("corpus" + "".join(corpus.suffixes)))
        building = Path(tmp) / "index"
        index_collection([
            "-collection", "JsonCollection", "-input", str(collection),
            "-index", str(building), "-generator", "DefaultLuceneDocumentGenerator",
            "-threads", str(threads or os.cpu_count() or 1), "-quiet",
            *(["-storeRaw"] if store_raw else []),
        ])
        if not any(building.glob("segments_*")):
            raise CorpusError(f"Lucene indexing of {corpus} produced no index.")
        shutil.move(str(building), index_dir)  # appears whole, or not at all
    return index_dir


class LuceneBM25(IsolatedSearch):
    """pyserini LuceneSearcher over a local index or a prebuilt one (e.g. wikipedia-dpr-100w)."""

    name = "lucene"

    def __init__(self, index: str | Path, threads: int | None = None, k1: float = 0.9,
                 b: float = 0.4, contents: dict[str, str] | None = None):
        lucene = load_lucene()
        from jnius import autoclass

        self._as_list = autoclass("java.util.Arrays").asList
        autoclass("org.apache.lucene.search.IndexSearcher").setMaxClauseCount(MAX_CLAUSES)
        self.contents = contents  # id -> contents, when the corpus is at hand
        # Ids and scores are all a batch needs when the documents are in memory.
        self._hits_json = _hits_as_json() if contents is not None else None
        index = str(index)
        if looks_like_path(index):
            path = Path(index).expanduser()
            if not any(path.glob("segments_*")):
                raise CorpusError(f"No Lucene index at {path} (no segments_* file). Build one "
                                  "with `python -m retriever index --corpus PATH --engine lucene`.")
            self.searcher = lucene.LuceneSearcher(str(path))
            self.index_path = path
        else:
            # Real wiki-18 BM25 index by name; needs the network the first time.
            self.searcher = lucene.LuceneSearcher.from_prebuilt_index(index)
            if self.searcher is None:
                raise CorpusError(f"Unknown pyserini prebuilt index {index!r}.")
            self.index_path = None
        self.searcher.set_bm25(k1, b)
        self.threads = threads or os.cpu_count() or 1
        self.num_docs = self.searcher.num_docs
        if contents is None and self.num_docs and self.searcher.doc(0).raw() is None:
            raise CorpusError(f"The Lucene index {index} stores ids only, not documents. "
                              "Pass its corpus instead (--corpus PATH, without --index): its "
                              "index is found in the cache, or rebuilt.")

    @property
    def details(self) -> dict:
        """What /health reports beyond the engine's name and size."""
        return {"java_max_heap_mb": round(java_max_heap_mb())}

    def _doc(self, hit) -> Doc:
        if self.contents is not None:  # a dict lookup beats reading the stored field via JNI
            return Doc(id=hit.docid, contents=self.contents[hit.docid], score=float(hit.score))
        # The hit carries its stored document: a second lookup by id costs ~15x more.
        stored = hit.lucene_document.get("raw") if hit.lucene_document is not None else None
        raw = json.loads(stored if stored is not None else self.searcher.doc(hit.docid).raw())
        contents = raw.get("contents")
        if contents is None:  # some prebuilt indexes store title and text apart
            contents = f'"{raw.get("title", "")}"\n{raw.get("text", "")}'
        return Doc(id=str(hit.docid), contents=contents, score=float(hit.score))

    def search_batch(self, queries: list[str], topk: int) -> list[list[Doc]]:
        if not queries:
            return []
        if len(queries) == 1:
            return [[self._doc(h) for h in self.searcher.search(queries[0], k=topk)]]
        # Anserini's multi-threaded batch search, called directly: pyserini's wrapper copies
        # the lists element by element and converts the whole result map, one JNI call each.
        qids = [str(i) for i in range(len(queries))]
        hits = self.searcher.object.batch_search(
            self._as_list(*queries), self._as_list(*qids), int(topk), int(self.threads))
        if self._hits_json is not None:
            # One JSON string of ids and scores beats a Python proxy per hit
            # (three JNI calls each), which cost more than the search itself.
            rows = orjson.loads(self._hits_json(hits))
            return [[Doc(id=h["docid"], contents=self.contents[h["docid"]],
                         score=float(numpy.float32(h["score"])))  # the float32 Lucene scored
                     for h in rows.get(qid, ())] for qid in qids]
        return [[self._doc(h) for h in (hits.get(qid) or ())] for qid in qids]


def _hits_as_json():
    """`writeValueAsString` of a Jackson mapper (bundled with Anserini) that writes a batch
    result, Map<qid, ScoredDoc[]>, as JSON: public fields only, so each hit is its docid and
    score (its Lucene document becomes empty objects). None if Jackson is not there."""
    from jnius import JavaException, autoclass

    try:
        features = "com.fasterxml.jackson.databind."
        mapper = autoclass(features + "ObjectMapper")()
        mapper_feature = autoclass(features + "MapperFeature")
        mapper.configure(mapper_feature.AUTO_DETECT_GETTERS, False)
        mapper.configure(mapper_feature.AUTO_DETECT_IS_GETTERS, False)
        mapper.configure(autoclass(features + "SerializationFeature").FAIL_ON_EMPTY_BEANS,
                         False)
    except (JavaException, ValueError, AttributeError):
        return None
    return mapper.writeValueAsString


def open_lucene(corpus: Path | None, index: str | None,
                threads: int | None = None) -> LuceneBM25:
    if index:
        return LuceneBM25(index, threads=threads)
    start = time.perf_counter()
    in_memory = corpus.stat().st_size <= IN_MEMORY_CORPUS_BYTES
    path = build_index(corpus, store_raw=not in_memory)
    contents = {r["id"]: r["contents"] for r in iter_records(corpus)} if in_memory else None
    engine = LuceneBM25(path, threads=threads, contents=contents)
    engine.build_seconds = time.perf_counter() - start
    return engine
