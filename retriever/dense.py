"""Dense retrieval: a Hugging Face encoder and a FAISS inner-product index.

Defaults follow Search-R1's e5 retriever: e5-base-v2, mean pooling over the attention mask,
`query: ` / `passage: ` prefixes, L2-normalised embeddings, a flat inner-product index.
It loads an existing Search-R1 asset pair (`e5_Flat.index` + `wiki-18.jsonl`) or builds an
index for a small corpus and caches it.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from retriever.corpus import CorpusError, cache_dir, corpus_key, load_records
from retriever.doc import Doc
from retriever.engine import IsolatedSearch

DEFAULT_ENCODER = "intfloat/e5-base-v2"


class Encoder:
    def __init__(self, model: str = DEFAULT_ENCODER, max_length: int = 256,
                 device: str | None = None):
        import torch
        from transformers import AutoModel, AutoTokenizer

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
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
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
                 encoder: str = DEFAULT_ENCODER, query_prefix: str = "query: ",
                 passage_prefix: str = "passage: "):
        import faiss

        self.records = load_records(corpus)
        self.encoder = Encoder(encoder)
        self.query_prefix = query_prefix
        start = time.perf_counter()
        if index is not None:
            path = Path(index).expanduser()
            if not path.is_file():
                raise CorpusError(f"No FAISS index at {path}.")
            self.index = faiss.read_index(str(path))
        else:
            tag = hashlib.sha1(f"{encoder}|{passage_prefix}".encode()).hexdigest()[:10]
            path = cache_dir() / "indexes" / corpus_key(corpus) / f"dense-{tag}.faiss"
            if path.is_file():
                self.index = faiss.read_index(str(path))
            else:
                passages = [passage_prefix + r["contents"] for r in self.records]
                vectors = self.encoder.encode(passages)
                self.index = faiss.IndexFlatIP(vectors.shape[1])
                self.index.add(vectors)
                path.parent.mkdir(parents=True, exist_ok=True)
                faiss.write_index(self.index, str(path))
        if self.index.ntotal != len(self.records):
            raise CorpusError(f"The index holds {self.index.ntotal} vectors but the corpus has "
                              f"{len(self.records)} records: they must be the same pair.")
        self.build_seconds = time.perf_counter() - start
        self.index_path = path
        self.num_docs = len(self.records)

    def search_batch(self, queries: list[str], topk: int) -> list[list[Doc]]:
        if not queries:
            return []
        vectors = self.encoder.encode([self.query_prefix + q for q in queries])
        scores, ids = self.index.search(vectors, min(topk, self.num_docs))
        return [
            [Doc(id=self.records[i]["id"], contents=self.records[i]["contents"], score=float(s))
             for i, s in zip(row_ids, row_scores, strict=True) if i >= 0]
            for row_ids, row_scores in zip(ids, scores, strict=True)
        ]
