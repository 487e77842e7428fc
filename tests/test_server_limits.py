"""The retriever server under hostile or greedy clients: a cap on results per request, small
requests served while a big one runs, memory returned after a big answer, deep JSON
refused, half-open connections timed out, a connection limit with a clean refusal, and a
log that a flood cannot grow. Real Lucene servers on loopback."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from retriever.corpus import load_records
from tests.conftest import free_port, start_process, stop_process

MAX_RESULTS = 50_000
HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 3.0
MAX_CONNECTIONS = 60


@pytest.fixture(scope="module")
def guarded_server(default_corpus):
    """A Lucene server with a low results cap (set through its environment variable), a
    short header timeout and a small connection limit."""
    port = free_port()
    process = start_process(
        ["-m", "retriever", "serve", "--port", str(port), "--java-heap", "512m",
         "--header-timeout", str(HEADER_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT),
         "--max-connections", str(MAX_CONNECTIONS)],
        f"http://127.0.0.1:{port}/health", env={"RETRIEVER_MAX_RESULTS": str(MAX_RESULTS)})
    process.port = port  # type: ignore[attr-defined]
    yield process
    stop_process(process)


def _url(process, path: str = "/retrieve") -> str:
    return f"http://127.0.0.1:{process.port}{path}"


def _titles(corpus: Path, n: int) -> list[str]:
    titles = [r["contents"].split("\n")[0].strip('"') for r in load_records(corpus)]
    return [titles[i % len(titles)] for i in range(n)]


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_results_cap_names_the_limit_and_the_flag(guarded_server, default_corpus):
    health = httpx.get(_url(guarded_server, "/health")).json()
    assert health["max_results"] == MAX_RESULTS  # from RETRIEVER_MAX_RESULTS
    over = httpx.post(_url(guarded_server), json={"queries": _titles(default_corpus, 501),
                                                  "topk": 100}, timeout=60)
    assert over.status_code == 422
    detail = over.json()["detail"]
    assert "50100" in detail and str(MAX_RESULTS) in detail and "--max-results" in detail
    at_cap = httpx.post(_url(guarded_server), json={"queries": _titles(default_corpus, 500),
                                                    "topk": 100}, timeout=120)
    assert at_cap.status_code == 200 and len(at_cap.json()["result"]) == 500


@pytest.mark.slow
def test_small_requests_are_served_while_a_big_one_runs(guarded_server, default_corpus):
    big_queries = _titles(default_corpus, MAX_RESULTS // 10)[::-1]
    finished: dict[str, float] = {}

    def big() -> None:
        response = httpx.post(_url(guarded_server), json={"queries": big_queries, "topk": 10},
                              timeout=300)
        assert response.status_code == 200
        finished["big"] = time.monotonic()

    thread = threading.Thread(target=big)
    thread.start()
    time.sleep(0.3)  # the big request is being searched
    latencies = []
    with httpx.Client(timeout=300) as client:
        for query in _titles(default_corpus, 5):
            start = time.monotonic()
            response = client.post(_url(guarded_server), json={"queries": [query], "topk": 3})
            assert response.status_code == 200
            latencies.append(time.monotonic() - start)
            finished.setdefault("small", time.monotonic())
    thread.join()
    assert finished["small"] < finished["big"], (latencies, finished)
    assert max(latencies) < 1.0, latencies


@pytest.mark.slow
def test_memory_returns_after_a_big_answer(guarded_server, default_corpus):
    pid = guarded_server.pid
    queries = _titles(default_corpus, MAX_RESULTS // 100)
    payload = {"queries": queries, "topk": 100, "return_scores": True}
    httpx.post(_url(guarded_server), json=payload, timeout=300)  # first use: caches, JIT
    baseline = _rss_mb(pid)
    for _ in range(3):
        response = httpx.post(_url(guarded_server), json=payload, timeout=300)
        assert response.status_code == 200
        del response
    assert _rss_mb(pid) - baseline < 40, (baseline, _rss_mb(pid))


@pytest.mark.slow
def test_deeply_nested_json_is_a_422(guarded_server):
    depth = 100_000
    response = httpx.post(_url(guarded_server), content=b"[" * depth + b"]" * depth,
                          headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert "nested" in response.json()["detail"]
    assert httpx.get(_url(guarded_server, "/health")).status_code == 200


def _half_open(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    return sock


def _closed_by_server(sock: socket.socket, timeout: float) -> bytes | None:
    """What the server sent before closing; None when it kept the socket open."""
    sock.settimeout(timeout)
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return received


@pytest.mark.slow
def test_half_open_connections_are_closed_and_a_real_request_succeeds(guarded_server):
    pid = guarded_server.pid
    before = _open_fds(pid)
    sockets = [_half_open(guarded_server.port) for _ in range(MAX_CONNECTIONS - 10)]
    try:
        time.sleep(0.3)
        assert _open_fds(pid) >= before + len(sockets) - 5  # the server holds them
        assert httpx.post(_url(guarded_server), json={"queries": ["Paris"]}).status_code == 200
        for sock in sockets:
            answer = _closed_by_server(sock, HEADER_TIMEOUT + 5)
            assert answer is not None and answer.startswith(b"HTTP/1.1 408"), answer
        time.sleep(0.3)
        assert _open_fds(pid) <= before + 2
    finally:
        for sock in sockets:
            sock.close()
    assert httpx.post(_url(guarded_server), json={"queries": ["Paris"]}).status_code == 200


@pytest.mark.slow
def test_partial_headers_after_a_kept_alive_request_time_out(guarded_server):
    sock = socket.create_connection(("127.0.0.1", guarded_server.port))
    with sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 1")
        start = time.monotonic()
        assert _closed_by_server(sock, HEADER_TIMEOUT + 5) is not None
        assert time.monotonic() - start < HEADER_TIMEOUT + 2


@pytest.mark.slow
def test_a_body_that_does_not_arrive_in_time_is_a_408(guarded_server):
    with socket.create_connection(("127.0.0.1", guarded_server.port)) as sock:
        sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        start = time.monotonic()
        answer = _closed_by_server(sock, BODY_TIMEOUT + 5)
        assert answer is not None and answer.startswith(b"HTTP/1.1 408"), answer
        assert b"--body-timeout" in answer
        assert time.monotonic() - start < BODY_TIMEOUT + 2


@pytest.mark.parametrize(("flags", "needle"), [
    (["--max-results", "0"], "--max-results must be positive"),
    (["--header-timeout", "-1"], "--header-timeout must be positive"),
    (["--max-connections", "100000000"], "ulimit -n"),
])
@pytest.mark.slow
def test_bad_limits_exit_2_before_the_engine_loads(flags, needle):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "retriever", "serve", "--engine", "dense",
                             "--corpus", "/nonexistent.jsonl", *flags],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and needle in result.stderr, result.stderr


@pytest.mark.slow
def test_over_the_limit_the_longest_waiting_connection_makes_room(guarded_server):
    sockets = [_half_open(guarded_server.port) for _ in range(MAX_CONNECTIONS + 20)]
    try:
        time.sleep(0.3)
        # A real request gets in: the oldest half-open connection is closed with a 503.
        response = httpx.post(_url(guarded_server), json={"queries": ["Paris"]})
        assert response.status_code == 200
        evicted = [_closed_by_server(sock, 0.5) for sock in sockets[:21]]
        assert all(a is not None and a.startswith(b"HTTP/1.1 503") for a in evicted), evicted
        assert b"--max-connections" in evicted[0]
        assert _closed_by_server(sockets[-1], 0.5) is None  # the newest still wait
    finally:
        for sock in sockets:
            sock.close()


@pytest.mark.slow
def test_when_every_connection_is_busy_a_newcomer_is_refused(guarded_server):
    # Requests whose body never comes: each holds its connection as a request in flight.
    busy = []
    for _ in range(MAX_CONNECTIONS):
        sock = socket.create_connection(("127.0.0.1", guarded_server.port))
        sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n")
        busy.append(sock)
    try:
        time.sleep(0.5)
        with socket.create_connection(("127.0.0.1", guarded_server.port)) as newcomer:
            answer = _closed_by_server(newcomer, 2.0)
        assert answer is not None and answer.startswith(b"HTTP/1.1 503"), answer
        assert b"--max-connections" in answer
    finally:
        for sock in busy:
            sock.close()
    time.sleep(0.3)
    assert httpx.post(_url(guarded_server), json={"queries": ["Paris"]}).status_code == 200


@pytest.mark.slow
def test_a_flood_of_bad_requests_does_not_grow_the_log(guarded_server):
    log = Path(guarded_server.log_path)
    before = log.stat().st_size
    for _ in range(500):
        with socket.create_connection(("127.0.0.1", guarded_server.port)) as sock:
            sock.sendall(b"\x00garbage\r\n\r\n")
            _closed_by_server(sock, 2.0)
    grown = log.stat().st_size - before
    assert grown < 4000, log.read_text(errors="replace")[-1000:]
    assert httpx.get(_url(guarded_server, "/health")).status_code == 200


def test_the_log_limit_lets_a_burst_through_then_counts_what_it_dropped():
    import io
    import logging

    from retriever.connections import RateLimit

    stream = io.StringIO()
    logger = logging.getLogger("test-rate-limit")
    logger.addHandler(logging.StreamHandler(stream))
    logger.propagate = False
    logger.addFilter(RateLimit(burst=3, period=0.3))
    for n in range(1000):
        logger.warning("bad request %d", n)
    logger.warning("another kind")
    assert stream.getvalue().splitlines() == ["bad request 0", "bad request 1",
                                              "bad request 2", "another kind"]
    time.sleep(0.35)
    logger.warning("bad request %d", 1000)
    assert stream.getvalue().splitlines()[-1] == (
        "bad request 1000 (997 more like this in the last 0.3 s were not logged)")
