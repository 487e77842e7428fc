"""The retriever server under hostile or greedy clients: a cap on results per request, small
requests served while a big one runs, memory returned after a big answer, deep JSON
refused, half-open connections timed out, a body below the minimum rate cut, a connection
limit with a clean refusal that slow bodies cannot hold, and a log that a flood cannot
grow. Real Lucene servers on loopback."""

from __future__ import annotations

import os
import select
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
# The slow-body server: a small connection limit that a test-sized flood fills.
SLOW_MAX_CONNECTIONS = 20
MIN_BODY_RATE = 100.0
BODY_GRACE = 4.0


@pytest.fixture(scope="module")
def guarded_server(default_corpus):
    """A Lucene server with a low results cap (set through its environment variable), a
    short header timeout and a small connection limit."""
    port = free_port()
    process = start_process(
        ["-m", "retriever", "serve", "--port", str(port), "--java-heap", "512m",
         "--header-timeout", str(HEADER_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT),
         # A grace beyond the body timeout: here the timeout alone cuts a stalled body.
         "--body-grace", "10", "--max-connections", str(MAX_CONNECTIONS)],
        f"http://127.0.0.1:{port}/health", env={"RETRIEVER_MAX_RESULTS": str(MAX_RESULTS)})
    process.port = port  # type: ignore[attr-defined]
    yield process
    stop_process(process)


@pytest.fixture(scope="module")
def slow_body_server(default_corpus):
    """A Lucene server with 20 connections, whose bodies must average 100 bytes/s after
    their first 4 s (and the default 60 s body timeout)."""
    port = free_port()
    process = start_process(
        ["-m", "retriever", "serve", "--port", str(port), "--java-heap", "512m",
         "--max-connections", str(SLOW_MAX_CONNECTIONS), "--min-body-rate",
         str(MIN_BODY_RATE), "--body-grace", str(BODY_GRACE)],
        f"http://127.0.0.1:{port}/health")
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
    (["--min-body-rate", "0"], "--min-body-rate must be positive"),
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


def _pump(sockets: list[socket.socket], chunk: bytes, every: float, stop: threading.Event,
          limit: float = 20.0) -> threading.Thread:
    """A thread that sends `chunk` on each socket every `every` seconds until `stop` is
    set (or `limit` seconds pass); a socket the server closed is left alone after."""
    def run() -> None:
        alive = list(sockets)
        ends = time.monotonic() + limit
        while alive and not stop.wait(every) and time.monotonic() < ends:
            for sock in list(alive):
                try:
                    sock.sendall(chunk)
                except OSError:
                    alive.remove(sock)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _post_head(port: int, length: int | None = None, close: bool = False) -> socket.socket:
    """A /retrieve request's headers: Content-Length `length`, or a chunked body."""
    sock = socket.create_connection(("127.0.0.1", port))
    framing = (f"Content-Length: {length}" if length is not None
               else "Transfer-Encoding: chunked").encode()
    sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\n" + framing + b"\r\n"
                 + (b"Connection: close\r\n" if close else b"") + b"\r\n")
    return sock


@pytest.mark.slow
def test_when_every_connection_is_busy_a_newcomer_is_refused(guarded_server):
    # Requests whose bodies arrive steadily, far above the minimum rate, but never end:
    # each holds its connection as a request in flight that is making progress.
    busy = [_post_head(guarded_server.port, length=10**6) for _ in range(MAX_CONNECTIONS)]
    stop = threading.Event()
    pump = _pump(busy, b" " * 200, 0.1, stop)  # 2,000 bytes/s each
    try:
        time.sleep(1.5)  # older than the guard's one-second look at a body's rate
        with socket.create_connection(("127.0.0.1", guarded_server.port)) as newcomer:
            answer = _closed_by_server(newcomer, 2.0)
        assert answer is not None and answer.startswith(b"HTTP/1.1 503"), answer
        assert b"--max-connections" in answer
        # None of the busy ones was dropped to make room: the server sent none of them
        # anything (checked at once: the body timeout closes them all at 3 s).
        assert select.select(busy, [], [], 0)[0] == []
    finally:
        stop.set()
        pump.join()
        for sock in busy:
            sock.close()
    time.sleep(0.3)
    assert httpx.post(_url(guarded_server), json={"queries": ["Paris"]}).status_code == 200


@pytest.mark.slow
def test_a_slow_body_flood_does_not_lock_out_real_requests(slow_body_server):
    """More connections than the limit, each sending its headers and then a chunked body a
    byte every 0.5 s: real requests are still answered at once (the bound is loose: test
    machines are shared), because a body that far behind the minimum rate makes room."""
    port = slow_body_server.port
    flood = [_post_head(port) for _ in range(SLOW_MAX_CONNECTIONS + 10)]
    stop = threading.Event()
    pump = _pump(flood, b"1\r\nx\r\n", 0.5, stop)
    try:
        time.sleep(1.5)  # the flood holds every connection, each body over a second old
        latencies = []
        with httpx.Client(timeout=10) as client:
            for query in ("Paris", "Rome", "Berlin"):
                start = time.monotonic()
                # A new connection each time, as a client such as requests.post makes.
                response = client.post(_url(slow_body_server), json={"queries": [query]},
                                       headers={"connection": "close"})
                assert response.status_code == 200, response.text
                assert response.json()["result"][0]
                latencies.append(time.monotonic() - start)
        assert max(latencies) < 3.0, latencies
        answers = [_closed_by_server(sock, 0.01) for sock in flood]
        # A stalled body made room for the first request (this 503, not the rate rule's
        # 408); each request's connection then closed and left its place to the next.
        made_room = [a for a in answers if a and b"made room" in a]
        assert made_room, answers
        assert made_room[0].startswith(b"HTTP/1.1 503") and b"--min-body-rate" in made_room[0]
    finally:
        stop.set()
        pump.join()
        for sock in flood:
            sock.close()


@pytest.mark.slow
def test_a_body_below_the_minimum_rate_is_cut_after_the_grace(slow_body_server):
    with _post_head(slow_body_server.port) as sock:
        start = time.monotonic()
        answer = None
        while answer is None and time.monotonic() - start < BODY_GRACE + 5:
            sock.sendall(b"1\r\n{\r\n")  # ~12 bytes/s, framing included
            answer = _closed_by_server(sock, 0.5)
        elapsed = time.monotonic() - start
    assert answer is not None and answer.startswith(b"HTTP/1.1 408"), answer
    assert b"--min-body-rate" in answer
    assert BODY_GRACE - 0.5 < elapsed < BODY_GRACE + 2, elapsed  # not the 60 s timeout


@pytest.mark.slow
def test_a_body_above_the_minimum_rate_may_take_longer_than_the_grace(slow_body_server):
    body = b'{"queries": ["Paris"], "pad": "' + b"x" * 1200 + b'"}'
    with _post_head(slow_body_server.port, length=len(body), close=True) as sock:
        start = time.monotonic()
        for i in range(0, len(body), 50):  # 250 bytes/s for about 5 s
            sock.sendall(body[i:i + 50])
            time.sleep(0.2)
        assert time.monotonic() - start > BODY_GRACE
        answer = _closed_by_server(sock, 5.0)
    assert answer is not None and answer.startswith(b"HTTP/1.1 200"), answer


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
