"""FAISS indexes for the dense engine, pure of corpus and encoder.

- flat, in RAM or memory-mapped (FAISS's mmap read flag: RAM then holds only the pages the
  OS caches, so a 64.6 GB wiki-18 flat index serves on a machine with far less);
- compressed indexes built from a flat one without re-encoding the corpus: the stored
  vectors are read back, a sample trains the quantiser, all are added in chunks;
- recall@k of the flat top-k, the measure every compressed index reports;
- the GPU when this FAISS build has one (replicated, or sharded over several GPUs).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

KINDS = ("flat", "ivf-sq8", "ivf-pq", "hnsw", "hnsw-sq8")


class DenseIndexError(ValueError):
    """An index file that cannot be used; the message says what to do."""


def _faiss():
    import faiss

    return faiss


def read_index(path: str | Path, mmap: bool = False):
    """A FAISS index from disk; `mmap` maps a flat index's vectors (or an IVF index's
    lists) instead of reading them into RAM."""
    faiss = _faiss()
    path = Path(path).expanduser()
    if not path.exists():
        raise DenseIndexError(
            f"No FAISS index at {path}. Fetch wiki-18's with `python -m retriever download "
            "wiki-18 --engine dense`, or leave out --index to build one for the corpus.")
    if not path.is_file():
        raise DenseIndexError(f"{path} is a directory, not a FAISS index file.")
    flags = 0
    if mmap:
        # Flat vectors need the IndexFlatCodes flag (a flat file starts "IxF"); IVF lists
        # take the general one.
        with path.open("rb") as f:
            flat = f.read(3) == b"IxF"
        flags = (faiss.IO_FLAG_MMAP_IFC if flat else faiss.IO_FLAG_MMAP) | faiss.IO_FLAG_READ_ONLY
    try:
        index = faiss.read_index(str(path), flags)
    except RuntimeError as err:
        raise DenseIndexError(f"{path} is not a readable FAISS index "
                              f"({str(err).strip().splitlines()[-1][:200]}).") from err
    return index


def kind_of(index) -> str:
    faiss = _faiss()
    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexFlat):
        return "flat"
    if isinstance(index, faiss.IndexIVFScalarQuantizer):
        return "ivf-sq8"
    if isinstance(index, faiss.IndexIVFPQ):
        return "ivf-pq"
    if isinstance(index, faiss.IndexHNSW):
        storage = faiss.downcast_index(index.storage)
        return "hnsw-sq8" if isinstance(storage, faiss.IndexScalarQuantizer) else "hnsw"
    return type(index).__name__


def set_search_params(index, nprobe: int | None = None, ef_search: int | None = None) -> None:
    """Accuracy/speed knobs: IVF lists probed per query, HNSW candidate list size."""
    faiss = _faiss()
    if nprobe is not None:
        try:
            faiss.extract_index_ivf(index).nprobe = int(nprobe)
        except RuntimeError as err:
            raise DenseIndexError(f"--nprobe applies to IVF indexes; this one is "
                                  f"{kind_of(index)}.") from err
    if ef_search is not None:
        inner = faiss.downcast_index(index)
        if not isinstance(inner, faiss.IndexHNSW):
            raise DenseIndexError(f"--ef-search applies to HNSW indexes; this one is "
                                  f"{kind_of(index)}.")
        inner.hnsw.efSearch = int(ef_search)


def describe(index, path: str | Path | None = None, mmap: bool = False) -> str:
    """The label a report names the index by, e.g. `e5_Flat.index (flat, mmap, 21015324)`."""
    faiss = _faiss()
    parts = [kind_of(index)]
    try:
        ivf = faiss.extract_index_ivf(index)
        parts.append(f"nlist {ivf.nlist}, nprobe {ivf.nprobe}")
    except RuntimeError:
        pass
    inner = faiss.downcast_index(index)
    if isinstance(inner, faiss.IndexRefine):
        parts[0] = kind_of(inner.base_index)
        parts.append(f"flat re-rank x{inner.k_factor:g}")
        inner = faiss.downcast_index(inner.base_index)
    if isinstance(inner, faiss.IndexHNSW):
        parts.append(f"efSearch {inner.hnsw.efSearch}")
    if mmap:
        parts.append("mmap")
    parts.append(f"{index.ntotal} vectors")
    name = Path(path).name if path else "index"
    return f"{name} ({', '.join(parts)})"


def default_nlist(n: int) -> int:
    """About 4·sqrt(n) lists (a power of two), at least 39 training vectors each."""
    nlist = 1 << max(0, int(np.log2(max(1.0, 4 * np.sqrt(n)))))
    return max(1, min(nlist, n // 39))


def factory_string(kind: str, n: int, nlist: int | None = None, pq_m: int = 96,
                   hnsw_m: int = 32) -> str:
    if kind == "ivf-sq8":
        return f"IVF{nlist or default_nlist(n)},SQ8"
    if kind == "ivf-pq":
        # np: no polysemous training (slow, and only for Hamming filtering, unused here).
        return f"IVF{nlist or default_nlist(n)},PQ{pq_m}np"
    if kind == "hnsw":
        return f"HNSW{hnsw_m}"
    if kind == "hnsw-sq8":
        return f"HNSW{hnsw_m},SQ8"
    raise DenseIndexError(f"Unknown index kind {kind!r}: choose one of "
                          f"{', '.join(k for k in KINDS if k != 'flat')}.")


def stored_vectors(flat, start: int, stop: int) -> np.ndarray:
    """Rows start..stop of a flat index (in RAM or mapped), as float32."""
    return flat.reconstruct_n(start, stop - start)


def sample_rows(flat, rows: np.ndarray, chunk: int = 65536) -> np.ndarray:
    """The given (sorted) rows of a flat index, read a chunk at a time: memory stays at the
    sample plus one chunk, however big the index."""
    parts = []
    for start in range(0, flat.ntotal, chunk):
        lo, hi = np.searchsorted(rows, [start, start + chunk])
        if hi > lo:
            parts.append(stored_vectors(flat, start, min(flat.ntotal, start + chunk))
                         [rows[lo:hi] - start])
    return np.vstack(parts)


def build_from_flat(flat, kind: str, nlist: int | None = None, pq_m: int = 96,
                    hnsw_m: int = 32, train_size: int | None = None, chunk: int = 65536,
                    seed: int = 0, progress: Callable[[str], None] | None = None):
    """A compressed index over a flat index's own vectors: nothing is re-encoded."""
    faiss = _faiss()
    if kind_of(flat) != "flat":
        raise DenseIndexError(f"Compressed indexes are built from a flat index; this one is "
                              f"{kind_of(flat)}.")
    n, d = flat.ntotal, flat.d
    if n == 0:
        raise DenseIndexError("The flat index holds no vectors.")
    spec = factory_string(kind, n, nlist, pq_m, hnsw_m)
    if kind == "ivf-pq" and d % pq_m:
        raise DenseIndexError(f"--pq-m {pq_m} must divide the dimension {d}.")
    index = faiss.index_factory(d, spec, faiss.METRIC_INNER_PRODUCT)
    say = progress or (lambda _: None)
    if not index.is_trained:
        lists = faiss.extract_index_ivf(index).nlist if kind.startswith("ivf") else 1
        size = min(n, train_size or max(64 * lists, 65536), 1_000_000)
        if kind.startswith("ivf") and size < lists:
            raise DenseIndexError(f"{n} vectors cannot train {lists} lists; pass a smaller "
                                  "--nlist.")
        rows = np.sort(np.random.default_rng(seed).choice(n, size, replace=False))
        sample = sample_rows(flat, rows, chunk)
        say(f"training {spec} on {size} of {n} vectors")
        start = time.perf_counter()
        index.train(sample)
        say(f"trained in {time.perf_counter() - start:.1f}s")
    for start in range(0, n, chunk):
        index.add(stored_vectors(flat, start, min(n, start + chunk)))
        if (start // chunk) % 16 == 15:
            say(f"added {min(n, start + chunk)} of {n}")
    return index


def search_ids(index, queries: np.ndarray, k: int, batch: int = 4096) -> np.ndarray:
    out = []
    for start in range(0, len(queries), batch):
        out.append(index.search(np.ascontiguousarray(queries[start:start + batch]), k)[1])
    return np.vstack(out) if out else np.zeros((0, k), dtype="int64")


def recall_at_k(reference: np.ndarray, candidate: np.ndarray, k: int = 3) -> float:
    """Share of the reference (flat) top-k ids that the candidate's top-k also holds."""
    reference, candidate = np.asarray(reference)[:, :k], np.asarray(candidate)[:, :k]
    if reference.shape[0] != candidate.shape[0]:
        raise ValueError("reference and candidate must rank the same queries")
    if reference.shape[0] == 0:
        raise ValueError("recall needs at least one query")
    found = sum(len(set(r[r >= 0]) & set(c[c >= 0])) for r, c in zip(reference, candidate,
                                                                      strict=True))
    return found / (reference.shape[0] * k)


def check_recall(flat, index, queries: np.ndarray, k: int = 3) -> float:
    """recall@k of `index` against the flat index on the same vectors."""
    if flat.ntotal != index.ntotal:
        raise DenseIndexError(f"The flat index holds {flat.ntotal} vectors and the checked "
                              f"one {index.ntotal}: they are not over the same corpus.")
    return recall_at_k(search_ids(flat, queries, k), search_ids(index, queries, k), k)


def with_rerank(index, flat, k_factor: int = 8):
    """`index` proposes k·k_factor candidates, the flat index (mapped: a few pages read per
    query) scores them exactly. A compressed index in RAM plus the flat one on disk."""
    faiss = _faiss()
    if flat.ntotal != index.ntotal or flat.d != index.d:
        raise DenseIndexError(f"The re-rank flat index ({flat.ntotal} x {flat.d}) does not "
                              f"match the index ({index.ntotal} x {index.d}).")
    refined = faiss.IndexRefine(index, flat)
    refined.k_factor = float(k_factor)
    refined.own_fields = False
    return refined


def gpu_count() -> int:
    faiss = _faiss()
    return faiss.get_num_gpus() if hasattr(faiss, "StandardGpuResources") else 0


def to_device(index, gpu: str = "auto"):
    """(index, where it runs). `gpu`: auto (all GPUs, replicated, if this FAISS build has
    any), shard (split the vectors over all GPUs, for an index bigger than one), off."""
    faiss = _faiss()
    if gpu not in ("auto", "shard", "off"):
        raise DenseIndexError(f"--gpu {gpu!r}: choose auto, shard or off.")
    if gpu == "off":
        return index, "CPU"
    count = gpu_count()
    if count == 0:
        return index, "CPU (this FAISS build has no GPU support: pip's faiss-cpu)"
    if kind_of(index).startswith("hnsw"):
        return index, "CPU (FAISS has no GPU HNSW)"
    if isinstance(faiss.downcast_index(index), faiss.IndexRefine):
        return index, "CPU (flat re-ranking reads the mapped vectors on CPU)"
    options = faiss.GpuMultipleClonerOptions()
    options.shard = gpu == "shard"
    options.useFloat16 = True  # half the GPU memory, as Search-R1's server does
    placed = faiss.index_cpu_to_all_gpus(index, co=options)
    return placed, f"{count} GPU(s), {'sharded' if options.shard else 'replicated'}"
