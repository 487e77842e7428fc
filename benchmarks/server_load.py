"""The retriever server under a greedy client, a slowloris flood and a slow-body flood.

    python -m benchmarks.server_load [--big-queries 8192 --big-topk 8] [--clients 50]
                                     [--half-open 20000] [--header-timeout 10]
                                     [--slow-bodies 1000 --flood-seconds 30]
                                     [--root DIR] [--legacy] [--skip SCENARIO ...]

1. Greedy client: one request of --big-queries x --big-topk results (the server's cap by
   default), then --clients threads each sending one-query requests until it is answered.
   Reports the small requests' p50/p95 latency, the big one's time, and the server's RSS
   before, at the peak and 2 s after. Goal: p95 < 1 s.
2. Slowloris: --half-open connections that send part of their headers (opened by child
   processes, 10,000 each, so no process runs out of descriptors), then: descriptors the
   server holds at the peak and --header-timeout + 5 s later, whether a real request is
   answered meanwhile, and how much the server's log grew.
3. Slow bodies: --slow-bodies connections (the server's default connection limit) that send
   their headers and then a chunked body one byte every 2 s, reconnecting whenever the
   server closes one, for --flood-seconds. Meanwhile a real client posts a one-query
   request every 0.25 s on a new connection: the share answered 200, their p50/p95/max
   latency, and what the flood's connections were told.

`--root DIR` serves the retriever package found in DIR (e.g. an older checkout unpacked
with `git archive`), `--legacy` for a server without the limit flags.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from agent.testing import free_port, wait_for_http
from retriever.corpus import load_records, resolve_corpus

ROOT = Path(__file__).resolve().parent.parent
PER_PROCESS = 10_000


def start(root: Path, legacy: bool, header_timeout: float,
          log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args = [sys.executable, "-m", "retriever", "serve", "--engine", "bm25", "--port", str(port)]
    if not legacy:
        args += ["--header-timeout", str(header_timeout)]
    log = log_path.open("wb")
    process = subprocess.Popen(args, cwd=root, stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONPATH": str(root)})
    base = f"http://127.0.0.1:{port}"
    wait_for_http(base + "/health", process)
    return process, base


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def greedy(base: str, pid: int, titles: list[str], big_queries: int, big_topk: int,
           clients: int) -> dict:
    url = base + "/retrieve"
    httpx.post(url, json={"queries": titles[:2000], "topk": 3}, timeout=300)  # JIT warm-up
    before = rss_mb(pid)
    peak = [before]
    done = threading.Event()
    big: dict = {}

    def send_big() -> None:
        start = time.monotonic()
        response = httpx.post(url, json={"queries": [titles[i % len(titles)]
                                                     for i in range(big_queries)],
                                         "topk": big_topk, "return_scores": True},
                              timeout=600)
        big.update(status=response.status_code, seconds=time.monotonic() - start,
                   mb=len(response.content) / 2**20)
        done.set()

    def sample() -> None:
        while not done.is_set():
            peak.append(rss_mb(pid))
            time.sleep(0.05)

    latencies: list[float] = []

    def small(i: int) -> None:
        with httpx.Client(timeout=600) as client:
            n = 0
            while not done.is_set() or n == 0:
                start = time.monotonic()
                client.post(url, json={"queries": [titles[(i * 7 + n) % len(titles)]],
                                       "topk": 3}).raise_for_status()
                latencies.append(time.monotonic() - start)
                n += 1

    threads = [threading.Thread(target=send_big), threading.Thread(target=sample)]
    for t in threads:
        t.start()
    time.sleep(0.2)  # the big request is in
    smalls = [threading.Thread(target=small, args=(i,)) for i in range(clients)]
    for t in smalls:
        t.start()
    for t in threads + smalls:
        t.join()
    time.sleep(2)
    latencies.sort()
    return {"big": big, "small_requests": len(latencies),
            "small_p50_s": round(statistics.median(latencies), 3),
            "small_p95_s": round(latencies[int(0.95 * (len(latencies) - 1))], 3),
            "rss_before_mb": round(before), "rss_peak_mb": round(max(peak)),
            "rss_after_mb": round(rss_mb(pid))}


def hold(port: int, count: int, seconds: float, report) -> None:
    """Child process: `count` connections with partial headers, held `seconds`; reports
    (opened, closed by the server)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sockets = []
    for _ in range(count):
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            sockets.append(sock)
        except OSError:
            break
    report.send(("opened", len(sockets)))
    time.sleep(seconds)
    closed = 0
    for sock in sockets:
        sock.setblocking(False)
        try:
            closed += sock.recv(1 << 16, socket.MSG_PEEK) is not None
        except BlockingIOError:
            pass  # still open, nothing sent
        except OSError:
            closed += 1
    report.send(("closed", closed))
    for sock in sockets:
        sock.close()


def slowloris(base: str, pid: int, port: int, total: int, header_timeout: float,
              log_path: Path) -> dict:
    log_before = log_path.stat().st_size
    fds_before = open_fds(pid)
    wait = header_timeout + 5
    pipes, children = [], []
    for n in range(0, total, PER_PROCESS):
        parent, child = multiprocessing.Pipe()
        process = multiprocessing.Process(target=hold, args=(port, min(PER_PROCESS, total - n),
                                                             wait + 60, child))
        process.start()
        pipes.append(parent)
        children.append(process)
    opened = sum(p.recv()[1] for p in pipes)
    opened_at = time.monotonic()
    peak = open_fds(pid)
    try:
        during = httpx.post(base + "/retrieve", json={"queries": ["Paris"]}, timeout=30)
        real_during = during.status_code
    except httpx.HTTPError as err:
        real_during = type(err).__name__
    time.sleep(max(0.0, wait - (time.monotonic() - opened_at)))
    after = open_fds(pid)
    try:
        real_after = httpx.post(base + "/retrieve", json={"queries": ["Paris"]},
                                timeout=30).status_code
    except httpx.HTTPError as err:
        real_after = type(err).__name__
    for process in children:
        process.kill()
        process.join()
    return {"half_open": opened, "server_fds_before": fds_before, "server_fds_peak": peak,
            f"server_fds_{wait:g}s_later": after, "real_request_during": real_during,
            "real_request_after": real_after,
            "log_growth_kb": round((log_path.stat().st_size - log_before) / 1024, 1)}


SLOW_HEAD = (b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")


def trickle(port: int, count: int, seconds: float, interval: float, report) -> None:
    """Child process: `count` connections that send headers, then one body byte (a chunk)
    every `interval` s; each one the server closes is opened again, until `seconds` have
    passed. Reports {"opened": n, "<status line or 'closed'>": n, ...}."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    counts: collections.Counter[str] = collections.Counter()

    async def one(stop_at: float) -> None:
        loop = asyncio.get_running_loop()
        while loop.time() < stop_at:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                counts["connect failed"] += 1
                await asyncio.sleep(0.5)
                continue
            counts["opened"] += 1
            answer = b""
            try:
                writer.write(SLOW_HEAD)
                while loop.time() < stop_at:
                    try:  # waiting for an answer is the pause between bytes
                        answer = await asyncio.wait_for(reader.read(4096), interval)
                        break  # the server answered or closed: connect again
                    except TimeoutError:
                        writer.write(b"1\r\nx\r\n")
                        await writer.drain()
            except OSError:
                pass
            finally:
                writer.close()
            if loop.time() < stop_at:
                counts[answer.split(b"\r\n", 1)[0].decode(errors="replace") or "closed"] += 1
            await asyncio.sleep(0.05)

    async def flood() -> None:
        stop_at = asyncio.get_running_loop().time() + seconds
        await asyncio.gather(*(one(stop_at) for _ in range(count)))

    asyncio.run(flood())
    report.send(dict(counts))


def slow_bodies(base: str, port: int, total: int, seconds: float) -> dict:
    parent, child = multiprocessing.Pipe()
    flood = multiprocessing.Process(target=trickle, args=(port, total, seconds, 2.0, child))
    flood.start()
    time.sleep(min(5.0, seconds / 4))  # the flood is in place
    stop_at = time.monotonic() + seconds - min(5.0, seconds / 4) - 2
    statuses: collections.Counter[str] = collections.Counter()
    latencies = []
    while time.monotonic() < stop_at:
        start = time.monotonic()
        try:  # a new connection each time, as Search-R1's requests.post makes
            status = str(httpx.post(base + "/retrieve", json={"queries": ["Paris"]},
                                    timeout=10).status_code)
        except httpx.HTTPError as err:
            status = type(err).__name__
        statuses[status] += 1
        if status == "200":
            latencies.append(time.monotonic() - start)
        time.sleep(max(0.0, 0.25 - (time.monotonic() - start)))
    flood_counts = parent.recv()
    flood.join()
    latencies.sort()
    sent = sum(statuses.values())

    def at(q: float) -> float | None:
        return round(latencies[int(q * (len(latencies) - 1))], 3) if latencies else None

    return {"slow_bodies": total, "real_requests": sent, "statuses": dict(statuses),
            "share_200": round(statuses["200"] / max(1, sent), 3), "p50_s": at(0.5),
            "p95_s": at(0.95), "max_s": at(1.0), "flood": flood_counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big-queries", type=int, default=8192)
    parser.add_argument("--big-topk", type=int, default=8)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--half-open", type=int, default=20_000)
    parser.add_argument("--header-timeout", type=float, default=10.0)
    parser.add_argument("--slow-bodies", type=int, default=1000)
    parser.add_argument("--flood-seconds", type=float, default=30.0)
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--legacy", action="store_true")
    parser.add_argument("--skip", choices=("greedy", "slowloris", "slow-body"),
                        action="append", default=[])
    args = parser.parse_args()
    titles = [r["contents"].split("\n")[0].strip('"')
              for r in load_records(resolve_corpus("default"))]
    log_path = Path(tempfile.mkdtemp(prefix="server-load-")) / "server.log"
    process, base = start(args.root.resolve(), args.legacy, args.header_timeout, log_path)
    try:
        if "greedy" not in args.skip:
            print("greedy client:", greedy(base, process.pid, titles, args.big_queries,
                                           args.big_topk, args.clients), flush=True)
        port = int(base.rsplit(":", 1)[1])
        if "slowloris" not in args.skip:
            print("slowloris:", slowloris(base, process.pid, port, args.half_open,
                                          args.header_timeout, log_path), flush=True)
        if "slow-body" not in args.skip:
            httpx.post(base + "/retrieve", json={"queries": titles[:200]}, timeout=300)  # warm
            print("slow bodies:", slow_bodies(base, port, args.slow_bodies,
                                              args.flood_seconds), flush=True)
    finally:
        process.terminate()
        process.wait(30)
    print(f"server log: {log_path}")


if __name__ == "__main__":
    main()
