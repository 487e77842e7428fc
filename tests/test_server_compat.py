"""Search-R1 server compatibility: topk 0, training-size batches, a body limit,
bad queries that fail alone, dropped clients' work skipped, a bounded JVM heap.
Real Lucene servers on loopback and the real in-process engines."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from retriever.corpus import load_records
from tests.conftest import free_port, start_process, stop_process

# Serves or runs models: outside the fast loop (`pytest -m "not slow"`).
pytestmark = pytest.mark.slow

QUESTION = "Who directed the film 2001: A Space Odyssey?"
# 1,100 distinct one-character terms: more than Lucene's default 1,024 clauses, within the
# server's 2,000-character limit (each CJK ideograph is a term of its own).
MANY_TERMS = "".join(chr(0x4E00 + i) for i in range(1100))
# A lone surrogate, as JSON can carry it ("\ud800"): valid JSON, not encodable UTF-16.
SURROGATE_BODY = b'{"queries": ["capital of \\ud800 France"], "topk": 3}'


@pytest.fixture(scope="module")
def small_server(default_corpus):
    """A Lucene server with a small heap and a 4 MiB body limit."""
    port = free_port()
    process = start_process(["-m", "retriever", "serve", "--port", str(port), "--java-heap",
                             "300m", "--max-body-mb", "4"], f"http://127.0.0.1:{port}/health")
    yield f"http://127.0.0.1:{port}"
    stop_process(process)


def _ids(body: dict) -> list[list[str]]:
    return [[item.get("document", item)["id"] for item in row] for row in body["result"]]


def test_topk_zero_null_or_missing_means_the_default(small_server):
    url = small_server + "/retrieve"
    for payload in ({"queries": [QUESTION], "topk": 0}, {"queries": [QUESTION], "topk": None},
                    {"queries": [QUESTION]}):
        response = httpx.post(url, json={**payload, "return_scores": True})
        assert response.status_code == 200, response.text
        assert len(response.json()["result"][0]) == 3
    negative = httpx.post(url, json={"queries": [QUESTION], "topk": -1})
    assert negative.status_code == 422 and "topk" in negative.json()["detail"]


def test_a_training_batch_fits_in_one_request(small_server, default_corpus):
    health = httpx.get(small_server + "/health").json()
    assert health["max_queries"] >= 8192
    titles = [r["contents"].split("\n")[0] for r in load_records(default_corpus)]
    queries = [titles[i % len(titles)] for i in range(2560)]  # 512 prompts x 5 samples
    response = httpx.post(small_server + "/retrieve", json={"queries": queries, "topk": 3},
                          timeout=120)
    assert response.status_code == 200, response.text[:300]
    assert len(response.json()["result"]) == 2560
    rows = _ids(response.json())
    assert all(1 <= len(row) <= 3 for row in rows)  # every title finds its article
    # The same as five requests of 512.
    parts = [httpx.post(small_server + "/retrieve", json={"queries": queries[i:i + 512]},
                        timeout=120).json() for i in range(0, 2560, 512)]
    assert rows == [row for part in parts for row in _ids(part)]


def test_body_limit_names_the_limit_and_the_flag(small_server):
    url = small_server + "/retrieve"
    big = b'{"queries": ["' + b"x" * (5 * 2**20) + b'"]}'
    for content in (big, iter([big[:2**20], big[2**20:]])):  # Content-Length, then chunked
        response = httpx.post(url, content=content, headers={"content-type": "application/json"},
                              timeout=60)
        assert response.status_code == 413
        assert "4 MiB" in response.json()["detail"]
        assert "--max-body-mb" in response.json()["detail"]
    assert httpx.post(url, json={"queries": [QUESTION]}).status_code == 200


def test_java_heap_is_capped(small_server, retriever_server):
    assert 200 <= httpx.get(small_server + "/health").json()["java_max_heap_mb"] <= 300
    # Without the flag: the 4g default, not a quarter of the machine's memory.
    assert httpx.get(retriever_server + "/health").json()["java_max_heap_mb"] <= 4096
    bad = subprocess.run([sys.executable, "-m", "retriever", "search", "q", "--java-heap",
                          "lots"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Bad Java heap size 'lots'" in bad.stderr


def test_bad_queries_fail_no_one_else(small_server):
    url = small_server + "/retrieve"
    clean = httpx.post(url, json={"queries": [QUESTION, "capital city of France"]}).json()
    # In one request, merged into one engine batch: every query is answered.
    body = json.dumps({"queries": [QUESTION, "capital of @ France", MANY_TERMS,
                                   "capital city of France"]})
    mixed = httpx.post(url, content=body.replace("@", "\\ud800").encode(),
                       headers={"content-type": "application/json"})
    assert mixed.status_code == 200, mixed.text[:300]
    rows = _ids(mixed.json())
    assert [rows[0], rows[3]] == _ids(clean)
    assert len(rows[1]) == 3  # the surrogate was dropped; "capital of France" was searched
    # Many clients at once, bad ones among them: nobody gets an error status.
    statuses: list[int] = []

    def client(i: int) -> None:
        with httpx.Client(timeout=60) as http:
            for j in range(5):
                if i % 4 == 0:
                    r = http.post(url, content=SURROGATE_BODY,
                                  headers={"content-type": "application/json"})
                elif i % 4 == 1:
                    r = http.post(url, json={"queries": [MANY_TERMS, f"film {j}"]})
                else:
                    r = http.post(url, json={"queries": [QUESTION, f"river {j}"]})
                    if r.status_code == 200:
                        assert _ids(r.json())[0] == _ids(clean)[0]
                statuses.append(r.status_code)

    with ThreadPoolExecutor(24) as pool:
        list(pool.map(client, range(24)))
    assert len(statuses) == 120 and set(statuses) == {200}


def test_in_process_engines_isolate_a_failing_query(lucene_engine, bm25s_engine):
    # More distinct terms than even the raised clause limit: this query fails in Lucene.
    huge = "".join(chr(0x4E00 + i) for i in range(9000))
    queries = [QUESTION, huge, "capital of \ud800 France", "Beethoven symphony"]
    results, failures = lucene_engine.search_reporting(queries, 3)
    assert list(failures) == [1] and "TooManyClauses" in failures[1]
    assert results[1] == []
    alone = [lucene_engine.search([q], 3)[0] for q in (QUESTION, "capital of  France",
                                                        "Beethoven symphony")]
    assert [results[0], results[2], results[3]] == alone
    assert lucene_engine.search(queries, 3) == results  # the plain interface too
    bm25s_rows = bm25s_engine.search(queries, 3)
    assert bm25s_rows[2] == bm25s_engine.search(["capital of  France"], 3)[0] != []


def test_a_broken_engine_still_raises(default_corpus):
    from retriever.engine import open_engine

    engine = open_engine("lucene", corpus="default")  # an engine of this test's own
    engine.searcher.close()
    # Every query fails and so does the probe: an error, not empty results for everybody.
    with pytest.raises(Exception, match="completedTaskCount"):
        engine.search([QUESTION, "Paris"], 3)
    with pytest.raises(Exception, match="(?i)closed"):
        engine.search([QUESTION], 3)


def test_work_of_disconnected_clients_is_skipped(small_server, default_corpus):
    url = small_server + "/retrieve"
    long_queries = [r["contents"][:1500] for r in load_records(default_corpus)[:800]]
    before = httpx.get(small_server + "/health").json()["dropped_requests"]
    # A long batch keeps the engine busy (about 3 s: 4,800 document-length queries). 800
    # took only 0.5 s on a warm engine, too close to the clients' patience: the test
    # failed once in CI when the engine reached them before they gave up.
    first = threading.Thread(target=lambda: httpx.post(url, json={"queries": long_queries * 6},
                                                       timeout=300))
    first.start()
    time.sleep(0.3)

    def impatient(i: int) -> str:
        try:
            httpx.post(url, json={"queries": long_queries[i::2]}, timeout=0.5)
        except httpx.TimeoutException:
            return "gave up"
        return "answered"

    with ThreadPoolExecutor(5) as pool:
        outcomes = list(pool.map(impatient, range(5)))
    first.join()
    assert httpx.post(url, json={"queries": [QUESTION]}).status_code == 200
    dropped = httpx.get(small_server + "/health").json()["dropped_requests"] - before
    assert dropped == outcomes.count("gave up") == 5
