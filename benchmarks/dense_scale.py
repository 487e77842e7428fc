"""Dense indexes at scale: flat in RAM (the naive way, as Search-R1 serves it), flat
memory-mapped, IVF-SQ8, IVF-PQ, IVF-PQ re-ranked against the mapped flat, and HNSW, on
synthetic clustered 768-d unit vectors; then each extrapolated to wiki-18's 21,015,324.

    python -m benchmarks.dense_scale                         # 100k (a few minutes)
    python -m benchmarks.dense_scale --sizes 100000,1000000  # and 1M (needs ~8 GB, longer)

Measured per size: build time (from the flat index, no re-encoding), file size, resident
memory while serving (anonymous = what the process must hold; file = mapped pages the OS
may drop), queries/s at batch 1 and 256, recall@3 of the flat top-3. Serving runs in a
fresh process per index so its memory is its own.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
import time
from pathlib import Path

import numpy as np

from retriever import faiss_index

WIKI18 = 21_015_324
DIM = 768
CONFIGS = ("flat", "flat-mmap", "ivf-sq8", "ivf-pq", "ivf-pq+rerank", "hnsw")


def clustered(n: int, seed: int, clusters: int, dim: int = DIM) -> np.ndarray:
    """Unit vectors around `clusters` centres that lie in a 96-d subspace (embeddings are
    anisotropic): nearest neighbours are close (cos ~0.55) but not trivially separable."""
    import faiss

    basis_rng = np.random.default_rng(12345)
    basis = basis_rng.standard_normal((96, dim), dtype=np.float32)
    centres = basis_rng.standard_normal((clusters, 96), dtype=np.float32) @ basis
    faiss.normalize_L2(centres)
    rng = np.random.default_rng(seed)
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 65536):
        m = min(65536, n - start)
        block = centres[rng.integers(0, clusters, m)] + rng.standard_normal(
            (m, dim), dtype=np.float32) * np.float32(1 / np.sqrt(dim))
        faiss.normalize_L2(block)
        out[start:start + m] = block
    return out


def _memory() -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text()
                  .splitlines() if ":" in line)
    return (int(fields["RssAnon"].split()[0]) / 1024, int(fields["RssFile"].split()[0]) / 1024)


def _rate(index, queries: np.ndarray, batch: int, seconds: float) -> float:
    done, start = 0, time.perf_counter()
    while True:
        at = done % len(queries)
        block = queries[at:at + batch]
        if len(block) < batch:
            block = queries[:batch]
        index.search(block, 3)
        done += len(block)
        if time.perf_counter() - start >= seconds:
            return done / (time.perf_counter() - start)


def serve_child(path: str, config: str, queries: np.ndarray, flat_path: str, params: dict,
                seconds: float, threads: int, out) -> None:
    """In a fresh process: open the index as served, measure speed and memory."""
    import faiss

    faiss.omp_set_num_threads(threads)
    index = faiss_index.read_index(path, mmap=config == "flat-mmap")
    faiss_index.set_search_params(index, **params)
    if config == "ivf-pq+rerank":
        flat = faiss_index.read_index(flat_path, mmap=True)
        index = faiss_index.with_rerank(index, flat, 8)
    ids = index.search(queries, 3)[1]
    result = {"qps1": _rate(index, queries, 1, seconds),
              "qps256": _rate(index, queries, 256, seconds), "ids": ids.tolist()}
    result["rss_anon_mb"], result["rss_file_mb"] = _memory()
    out.put(result)


def measure(path: Path, config: str, queries, flat_path: Path, params: dict, seconds: float,
            threads: int) -> dict:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    child = context.Process(target=serve_child, args=(str(path), config, queries,
                                                      str(flat_path), params, seconds,
                                                      threads, out))
    child.start()
    result = out.get()
    child.join()
    return result


def run_size(n: int, args, work: Path) -> list[dict]:
    import faiss

    faiss.omp_set_num_threads(args.threads)
    print(f"\n== {n:,} vectors ==", flush=True)
    clusters = max(16, n // 20)
    start = time.perf_counter()
    vectors = clustered(n, 1, clusters)
    queries = clustered(args.queries, 2, clusters)
    flat = faiss.IndexFlatIP(DIM)
    flat.add(vectors)
    del vectors
    flat_path = work / f"flat-{n}.index"
    faiss.write_index(flat, str(flat_path))
    flat_build = time.perf_counter() - start
    reference = flat.search(queries, 3)[1]
    nlist = args.nlist or faiss_index.default_nlist(n)
    rows = []
    built: dict[str, tuple[Path, float]] = {"flat": (flat_path, flat_build)}
    for kind in ("ivf-sq8", "ivf-pq", "hnsw"):
        if kind == "hnsw" and n > args.hnsw_max:
            continue
        start = time.perf_counter()
        index = faiss_index.build_from_flat(flat, kind, nlist=nlist, pq_m=args.pq_m,
                                            train_size=40 * nlist)
        seconds = time.perf_counter() - start
        path = work / f"{kind}-{n}.index"
        faiss.write_index(index, str(path))
        built[kind] = (path, seconds)
        print(f"built {kind} in {seconds:.1f}s", flush=True)
        del index
    del flat
    for config in CONFIGS:
        kind = {"flat-mmap": "flat", "ivf-pq+rerank": "ivf-pq"}.get(config, config)
        if kind not in built:
            continue
        path, seconds = built[kind]
        params = {"nprobe": args.nprobe} if kind.startswith("ivf") else \
            {"ef_search": args.ef_search} if kind == "hnsw" else {}
        got = measure(path, config, queries, flat_path, params, args.seconds, args.threads)
        recall = faiss_index.recall_at_k(reference, np.array(got.pop("ids")), 3)
        row = {"n": n, "config": config, "build_s": seconds,
               "file_mb": path.stat().st_size / 2**20, "recall3": recall, **got}
        rows.append(row)
        print(f"{config:14s} recall@3 {recall:.3f}  {row['qps1']:8.1f} q/s (b1) "
              f"{row['qps256']:8.1f} q/s (b256)  anon {row['rss_anon_mb']:7.0f} MB "
              f"file {row['rss_file_mb']:7.0f} MB", flush=True)
    for path, _ in built.values():
        path.unlink()
    return rows


def extrapolate(row: dict, threads: int) -> dict:
    """To wiki-18: sizes grow with n; flat and IVF (lists grown with n, so the same share is
    scanned for the same recall: conservative) take time in proportion to n, HNSW to log n;
    queries/s on 16 cores = batch-256 rate x 16 / threads used (perfect parallel scaling
    assumed). Build time is scaled linearly too (IVF training on a capped sample scales
    less, HNSW insertion a little more). Sizes in GB (10^9 bytes)."""
    scale = WIKI18 / row["n"]
    config = row["config"]
    index_gb = row["file_mb"] * 2**20 * scale / 1e9
    # flat-mmap holds nothing itself (vectors come from the page cache or disk); the
    # re-ranked IVF-PQ holds its codes, and reads a few flat vectors per query from disk.
    resident = 0.0 if config == "flat-mmap" else index_gb
    time_scale = np.log(WIKI18) / np.log(row["n"]) if config == "hnsw" else scale
    return {"config": config, "index_gb": index_gb, "resident_gb": resident,
            "build_h": row["build_s"] * scale / 3600,
            "qps16": row["qps256"] / time_scale * 16 / threads,
            "latency_ms": 1000 / row["qps1"] * time_scale, "recall3": row["recall3"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100000", help="comma-separated vector counts")
    parser.add_argument("--queries", type=int, default=256)
    parser.add_argument("--nlist", type=int, default=None, help="IVF lists (default ~4√n)")
    parser.add_argument("--nprobe", type=int, default=32)
    parser.add_argument("--pq-m", type=int, default=96)
    parser.add_argument("--ef-search", type=int, default=128)
    parser.add_argument("--hnsw-max", type=int, default=200_000,
                        help="build HNSW only up to this size (its build is the slowest)")
    parser.add_argument("--seconds", type=float, default=3.0, help="per speed measurement")
    parser.add_argument("--threads", type=int, default=1, help="FAISS threads")
    parser.add_argument("--json", help="also write the measured rows here")
    parser.add_argument("--from-json", help="print the tables from rows written by --json")
    args = parser.parse_args(argv)
    if args.from_json:
        rows = json.loads(Path(args.from_json).read_text())
    else:
        with tempfile.TemporaryDirectory(prefix="dense-scale-") as tmp:
            rows = [r for n in map(int, args.sizes.split(","))
                    for r in run_size(n, args, Path(tmp))]
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    largest = max(r["n"] for r in rows)
    base = {r["n"]: r for r in rows if r["config"] == "flat"}
    print(f"\nMeasured (FAISS threads: {args.threads}; ratios against flat in RAM, the naive "
          "way, at the same size)")
    print(f"{'n':>9} {'index':14} {'build s':>8} {'file MB':>8} {'anon MB':>8} {'file-RSS':>8} "
          f"{'q/s b1':>8} {'q/s b256':>9} {'x flat':>7} {'recall@3':>8}")
    for r in rows:
        print(f"{r['n']:>9,} {r['config']:14} {r['build_s']:8.1f} {r['file_mb']:8.0f} "
              f"{r['rss_anon_mb']:8.0f} {r['rss_file_mb']:8.0f} {r['qps1']:8.1f} "
              f"{r['qps256']:9.1f} {r['qps256'] / base[r['n']]['qps256']:7.1f} "
              f"{r['recall3']:8.3f}")
    print(f"\nExtrapolated to wiki-18 ({WIKI18:,} vectors) from the {largest:,} row: sizes "
          "and build time linear in n; flat and IVF search time linear in n (IVF lists grown "
          "with n to keep recall), HNSW in log n; 16 cores assumed to scale linearly. "
          "Recall is the measured one.")
    print(f"{'index':14} {'index GB':>9} {'held GB':>7} {'build h':>8} {'q/s 16c':>8} "
          f"{'ms/query':>9} {'recall@3':>8}  fits 16 GB at recall>=0.95")
    winners = []
    for r in (r for r in rows if r["n"] == largest):
        e = extrapolate(r, args.threads)
        fits = e["resident_gb"] + 1.5 <= 16 and e["recall3"] >= 0.95  # + encoder, ids, corpus
        if fits and r["config"] != "flat-mmap":
            winners.append(e)
        print(f"{e['config']:14} {e['index_gb']:9.1f} {e['resident_gb']:7.1f} "
              f"{e['build_h']:8.2f} {e['qps16']:8.1f} {e['latency_ms']:9.1f} "
              f"{e['recall3']:8.3f}  {'yes' if fits else 'no'}")
    print("(flat-mmap holds nothing itself, but runs at disk speed unless the OS can cache "
          "its 64.6 GB.)")
    if winners:
        best = max(winners, key=lambda e: e["qps16"])
        print(f"\nFits 16 GB at recall@3 >= 0.95: {best['config']} "
              f"(~{best['resident_gb']:.1f} GB resident, recall@3 {best['recall3']:.3f}, "
              f"~{best['qps16']:.0f} q/s on 16 cores, extrapolated).")


if __name__ == "__main__":
    main()
