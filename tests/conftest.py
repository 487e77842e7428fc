"""Shared test set-up: offline, a private cache, session fixtures (corpus, engines, a
retriever server, tiny models). Loopback-server helpers live in `agent.testing`."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Offline and quiet before anything imports transformers, datasets or gradio.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# A cache of the test session's own, so tests never depend on what a user built before.
os.environ["LLDS_CACHE_DIR"] = os.environ.get("LLDS_TEST_CACHE_DIR") or tempfile.mkdtemp(
    prefix="llds-test-cache-")
# The studio's Evaluate results go to a folder of the session's own, not the user's data.
os.environ["LLDS_DATA_DIR"] = tempfile.mkdtemp(prefix="llds-test-data-")

ROOT = Path(__file__).resolve().parent.parent

from agent.testing import free_port, start_process, stop_process  # noqa: E402


@pytest.fixture(scope="session")
def default_corpus() -> Path:
    from retriever.corpus import resolve_corpus

    return resolve_corpus("default")


@pytest.fixture(scope="session")
def lucene_engine(default_corpus):
    from retriever.engine import open_engine

    return open_engine("lucene", corpus="default")


@pytest.fixture(scope="session")
def bm25s_engine(default_corpus):
    from retriever.engine import open_engine

    return open_engine("bm25s", corpus="default")


@pytest.fixture(scope="session")
def micro_data(tmp_path_factory, default_corpus) -> Path:
    """`python -m nano data --limit 300`: questions, trajectories and a tokenizer (shared by
    the training tests)."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("nano-data")
    subprocess.run([sys.executable, "-m", "nano", "data", "--out", str(out), "--limit", "300"],
                   cwd=ROOT, check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def retriever_server(default_corpus):
    """`python -m retriever serve` on a free loopback port, default corpus, pyserini BM25."""
    port = free_port()
    process = start_process(["-m", "retriever", "serve", "--port", str(port)],
                            f"http://127.0.0.1:{port}/health")
    yield f"http://127.0.0.1:{port}"
    stop_process(process)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory, default_corpus) -> dict[str, Path]:
    """Tiny Qwen2 models saved to disk: `random`, `scripted` (search, then answer) and
    `eos` (thinks, then ends with EOS), loaded through the same path as a hub id."""
    from agent.testing import build_random, build_scripted, build_tokenizer
    from retriever.corpus import load_records

    root = tmp_path_factory.mktemp("tiny-models")
    texts = [r["contents"] for r in load_records(default_corpus)[:2000]]
    tokenizer = build_tokenizer(root / "tokenizer", texts)
    eos_path = {"\n": ["<think>", " the", "</think>", "<|im_end|>"]}
    return {
        "random": build_random(root / "random", tokenizer),
        "scripted": build_scripted(root / "scripted", tokenizer),
        "eos": build_scripted(root / "eos", tokenizer, paths=eos_path),
    }


@pytest.fixture(scope="session")
def local_retriever(bm25s_engine):
    from retriever.client import LocalRetriever

    return LocalRetriever(engine="bm25s", opened=bm25s_engine)  # the spec says what it is


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium for one test module (call tests.browser.require_chromium first)."""
    from playwright.sync_api import sync_playwright

    from tests.browser import ARTIFACTS, CHROMIUM

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield chromium
        chromium.close()
