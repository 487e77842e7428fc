"""The OpenAI-compatible backend against a completions server on loopback."""

from __future__ import annotations

import pytest

from agent.backends.base import Sampling
from agent.backends.hf import TransformersBackend
from agent.backends.openai_compat import UNREPORTED, OpenAIBackend, restore_stop
from agent.loop import AgentSettings, run_agent, run_agent_batch
from agent.testing import free_port
from tests.openai_server import serve_in_thread

# Serves or runs models: outside the fast loop (`pytest -m "not slow"`).
pytestmark = pytest.mark.slow


def test_restore_stop_puts_the_closing_tag_back():
    assert restore_stop("<search> q ", "stop", "</search>") == ("<search> q </search>", "stop")
    # vLLM says stop_reason None at EOS: never invent a closing tag then.
    assert restore_stop("<answer> Paris", "stop", None) == ("<answer> Paris", "eos")
    # A server that never names the stop: an unclosed `<search>` means `</search>` fired;
    # `</answer>` is no stop string (generation runs on to EOS), so nothing is invented.
    assert restore_stop("<search> q ", "stop", UNREPORTED) == ("<search> q </search>", "stop")
    assert restore_stop("<answer> a ", "stop", UNREPORTED) == ("<answer> a ", "eos")
    assert restore_stop("<think>done</think>", "stop", UNREPORTED) == (
        "<think>done</think>", "eos")
    assert restore_stop("<search> q", "length", None) == ("<search> q", "length")


@pytest.fixture(scope="module")
def completions_server(tiny_models):
    local = TransformersBackend(str(tiny_models["scripted"]))
    port = free_port()
    server = serve_in_thread(local, port)
    yield f"http://127.0.0.1:{port}/v1", local
    server.should_exit = True


def test_openai_backend_matches_the_local_model(completions_server, tiny_models,
                                                local_retriever):
    url, local = completions_server
    remote = OpenAIBackend("tiny", base_url=url, tokenizer=str(tiny_models["scripted"]))
    settings = AgentSettings(max_obs_tokens=4000)
    via_server = list(run_agent("which film", remote, local_retriever, settings))[-1]
    in_process = list(run_agent("which film", local, local_retriever, settings))[-1]
    assert via_server.stop_reason == "answer" and via_server.searches == 1
    # The closing tags were restored: the same trajectory as generating in-process.
    assert via_server.trajectory == in_process.trajectory
    assert via_server.new_tokens == in_process.new_tokens


def test_openai_backend_concurrent_batch(completions_server, tiny_models, local_retriever):
    url, _ = completions_server
    remote = OpenAIBackend("tiny", base_url=url, tokenizer=str(tiny_models["scripted"]),
                           concurrency=4)
    results = dict(run_agent_batch(["a", "b", "c", "d"], remote, local_retriever,
                                   AgentSettings(max_obs_tokens=4000)))
    assert [results[i].stop_reason for i in range(4)] == ["answer"] * 4


def test_openai_backend_names_the_url_when_down(tiny_models):
    url = f"http://127.0.0.1:{free_port()}/v1"
    backend = OpenAIBackend("tiny", base_url=url, tokenizer=str(tiny_models["scripted"]))
    with pytest.raises(ConnectionError, match="127.0.0.1"):
        list(backend.stream(["prompt"], 5, Sampling()))
