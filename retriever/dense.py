"""Dense retrieval: a Hugging Face encoder and a FAISS inner-product index.

Defaults follow Search-R1's e5 retriever: e5-base-v2, mean pooling over the attention mask,
`query: ` / `passage: ` prefixes, L2-normalised embeddings, a flat inner-product index.
Other encoders take their own prefixes and pooling (`mean`, `cls`: the first token,
`last`: the last non-padding token, for decoder-style embedders); `prefixes_for` gives the
prefixes Search-R1's server picks from its `--retriever_name`.
It loads an existing Search-R1 asset pair (`e5_Flat.index` + `wiki-18.jsonl`), or any index
built from it (`python -m retriever compress`), optionally memory-mapped, or builds a flat
index for a small corpus and caches it. A big corpus is read through a line-offset table
(`corpus.open_records`), so neither the index nor the documents need to fit in RAM.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

from retriever import faiss_index
from retriever.base import IsolatedSearch
from retriever.corpus import CorpusError, cache_dir, corpus_key, open_records
from retriever.doc import Doc

DEFAULT_ENCODER = "intfloat/e5-base-v2"
DEFAULT_QUERY_PREFIX = "query: "
DEFAULT_PASSAGE_PREFIX = "passage: "
POOLINGS = ("mean", "cls", "last")
BGE_QUERY_PREFIX = "Represent this sentence for searching relevant passages: "
log = logging.getLogger("retriever")


def prefixes_for(retriever_name: str) -> tuple[str, str]:
    """(query prefix, passage prefix) for a Search-R1 `--retriever_name`: e5 models get
    `query: ` / `passage: `, bge models their search instruction on queries only, any
    other name none."""
    name = retriever_name.lower()
    if "e5" in name:
        return DEFAULT_QUERY_PREFIX, DEFAULT_PASSAGE_PREFIX
    if "bge" in name:
        return BGE_QUERY_PREFIX, ""
    return "", ""


def pool(hidden, mask, pooling: str):
    """One vector per row of `hidden` (batch x tokens x dim) under the 0/1 `mask`."""
    if pooling == "mean":
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "last":
        import torch

        # The highest position the mask keeps: right or left padding alike.
        positions = torch.arange(mask.shape[1], device=mask.device)
        last = (mask.long() * positions).argmax(dim=1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    raise ValueError(f"pooling {pooling!r}: choose one of {', '.join(POOLINGS)}.")


class Encoder:
    def __init__(self, model: str = DEFAULT_ENCODER, max_length: int = 256,
                 device: str | None = None, pooling: str = "mean"):
        import torch
        from transformers import AutoModel, AutoTokenizer

        if pooling not in POOLINGS:
            raise ValueError(f"pooling {pooling!r}: choose one of {', '.join(POOLINGS)}.")
        self.pooling = pooling
        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.model = AutoModel.from_pretrained(model).to(self.device).eval()
        self.max_length = max_length

    def encode(self, texts: list[str], batch_size: int = 64):
        import numpy as np

        torch = self.torch
        # Batches of similar length waste less compute on padding; order is restored below.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        ordered = [texts[i] for i in order]
        out = []
        with torch.inference_mode():
            for start in range(0, len(ordered), batch_size):
                batch = self.tokenizer(ordered[start:start + batch_size], padding=True,
                                       truncation=True, max_length=self.max_length,
                                       return_tensors="pt").to(self.device)
                hidden = self.model(**batch).last_hidden_state
                pooled = pool(hidden, batch["attention_mask"], self.pooling)
                out.append(torch.nn.functional.normalize(pooled, dim=-1).float().cpu().numpy())
        if not out:
            return np.zeros((0, 0), dtype="float32")
        stacked = np.concatenate(out)
        vectors = np.empty_like(stacked)
        vectors[order] = stacked
        return vectors


class DenseRetriever(IsolatedSearch):
    name = "dense"

    def __init__(self, corpus: Path, index: str | Path | None = None,
                 encoder: str = DEFAULT_ENCODER, query_prefix: str = DEFAULT_QUERY_PREFIX,
                 passage_prefix: str = DEFAULT_PASSAGE_PREFIX, pooling: str = "mean",
                 mmap: bool = False, nprobe: int | None = None, ef_search: int | None = None,
                 rerank_flat: str | Path | None = None, gpu: str = "auto"):
        import faiss

        if pooling not in POOLINGS:
            raise ValueError(f"pooling {pooling!r}: choose one of {', '.join(POOLINGS)}.")
        self.records = open_records(corpus)
        self.query_prefix = query_prefix
        start = time.perf_counter()
        if index is not None:
            path = Path(index).expanduser()
            self.index = faiss_index.read_index(path, mmap=mmap)
            self._check_pair(self.index.ntotal, path)
            self.encoder = Encoder(encoder, pooling=pooling)
        else:
            self.encoder = Encoder(encoder, pooling=pooling)
            # Mean pooling keeps the key it always had, so existing caches stay valid.
            key = f"{encoder}|{passage_prefix}" + ("" if pooling == "mean" else f"|{pooling}")
            tag = hashlib.sha1(key.encode()).hexdigest()[:10]
            path = cache_dir() / "indexes" / corpus_key(corpus) / f"dense-{tag}.faiss"
            if not path.is_file():
                passages = [passage_prefix + r["contents"] for r in self.records]
                built = faiss.IndexFlatIP(self.encoder.encode(passages[:1]).shape[1])
                built.add(self.encoder.encode(passages))
                path.parent.mkdir(parents=True, exist_ok=True)
                faiss.write_index(built, str(path) + ".tmp")
                Path(str(path) + ".tmp").replace(path)  # whole, or not at all
            self.index = faiss_index.read_index(path, mmap=mmap)
            self._check_pair(self.index.ntotal, path)
        faiss_index.set_search_params(self.index, nprobe=nprobe, ef_search=ef_search)
        if rerank_flat is not None:
            flat = faiss_index.read_index(rerank_flat, mmap=True)
            self._flat_for_rerank = flat  # the refine index does not own it
            self.index = faiss_index.with_rerank(self.index, flat)
        self.label = faiss_index.describe(self.index, path, mmap=mmap)
        self.index, self.device = faiss_index.to_device(self.index, gpu)
        log.info("dense index %s on %s", self.label, self.device)
        self.build_seconds = time.perf_counter() - start
        self.index_path = path
        self.num_docs = len(self.records)

    def _check_pair(self, vectors: int, path: Path) -> None:
        if vectors != len(self.records):
            raise CorpusError(f"The index {path} holds {vectors} vectors but the corpus has "
                              f"{len(self.records)} records: they must be the same pair "
                              "(the index built from this corpus, in the same order).")

    @property
    def details(self) -> dict:
        """What /health and reports say about this engine: which index, where it runs."""
        return {"index": self.label, "device": self.device}

    def search_batch(self, queries: list[str], topk: int) -> list[list[Doc]]:
        if not queries:
            return []
        vectors = self.encoder.encode([self.query_prefix + q for q in queries])
        scores, ids = self.index.search(vectors, min(topk, self.num_docs))
        rows = []
        for row_ids, row_scores in zip(ids, scores, strict=True):
            row = []
            for i, s in zip(row_ids.tolist(), row_scores.tolist(), strict=True):
                if i >= 0:
                    record = self.records[i]
                    row.append(Doc(id=record["id"], contents=record["contents"], score=s))
            rows.append(row)
        return rows


def recall_queries(engine: DenseRetriever, sample: int = 1000, seed: int = 0):
    """Query vectors for recall checks: the titles of sampled documents, encoded as
    queries (question-like, and the corpus at hand is all it takes)."""
    import numpy as np

    rows = np.random.default_rng(seed).choice(engine.num_docs, min(sample, engine.num_docs),
                                              replace=False)
    titles = [engine.records[int(i)]["contents"].split("\n", 1)[0].strip('" ') for i in rows]
    return engine.encoder.encode([engine.query_prefix + t for t in titles])


def check_recall(engine: DenseRetriever, flat_path: str | Path, sample: int = 1000,
                 k: int = 3) -> float:
    """recall@k of the engine's index against a flat index over the same corpus."""
    flat = faiss_index.read_index(flat_path, mmap=True)
    if faiss_index.kind_of(flat) != "flat":
        raise faiss_index.DenseIndexError(f"--check-recall needs the flat index; {flat_path} "
                                          f"is {faiss_index.kind_of(flat)}.")
    return faiss_index.check_recall(flat, engine.index, recall_queries(engine, sample), k)
