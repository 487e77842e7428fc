"""`python app.py` as a user starts it: the page answers, and an uncached model is a message."""

from __future__ import annotations

import httpx
import pytest

from agent.testing import free_port, start_process, stop_process


@pytest.mark.slow
def test_app_starts_and_reports_an_unloadable_model_in_the_page():
    from gradio_client import Client

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    # HF_HUB_OFFLINE=1 (conftest) and an uncached default model: the load must fail fast.
    # RETRIEVER_ENGINE (the env form of --engine): bm25s warms up without a JVM.
    process = start_process(["app.py", "--port", str(port)], url, timeout=120,
                            env={"RETRIEVER_ENGINE": "bm25s"})
    try:
        page = httpx.get(url, timeout=10)
        assert page.status_code == 200 and "LLDS Search-Agent Studio" in page.text
        client = Client(url, verbose=False)
        chat, *_ = client.predict("Who directed 2001: A Space Odyssey?",
                                  "SEGAgentRL/LLDS-A-GRPO-Qwen2.5-3B-Base-MA",
                                  True, 0.7, 1.0, 4, 3, 500, True, api_name="/ask")
        text = " ".join(part["text"] for message in chat for part in message["content"]
                        if isinstance(part, dict) and "text" in part)
        assert "could not be loaded" in text and "not in the local Hugging Face cache" in text
        assert process.poll() is None  # still up
        assert httpx.get(url, timeout=10).status_code == 200
    finally:
        stop_process(process)


def test_app_takes_the_shared_model_and_retriever_flags(monkeypatch):

    import app.__main__ as studio_main
    from agent.config import DEFAULT_BASE_URL, BackendOptions, backend_options, retriever_label
    monkeypatch.setenv("LLDS_TOKENIZER", "/models/tokenizer")
    args = studio_main.parse_args(["--backend", "openai", "--trust-remote-code",
                                   "--engine", "bm25s"])
    assert backend_options(args) == BackendOptions("openai", "auto", DEFAULT_BASE_URL,
                                                   "/models/tokenizer", True)
    assert retriever_label(args) == "bm25s:default"


@pytest.mark.slow
def test_python_m_app_is_the_same_command():
    import subprocess
    import sys

    from agent.testing import ROOT

    shown = subprocess.run([sys.executable, "-m", "app", "--help"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "--allow-local-paths" in shown.stdout
    assert shown.stdout.startswith("usage: python -m app")
    from app.__main__ import main

    assert callable(main)  # the console command's target
