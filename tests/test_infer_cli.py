"""`python -m app.infer` as a user runs it, on the tiny real model and the real retriever."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agent.events import DocumentsReturned, Finished, SearchCalled, TextDelta, TurnStarted
from agent.testing import ROOT
from app.infer import Style, render_terminal
from retriever.doc import Doc


def _infer(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.infer", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_json_event_stream(tiny_models, default_corpus):
    out = _infer("which film is this", "--model", str(tiny_models["scripted"]), "--engine",
                 "bm25s", "--json", "--max-turns", "2")
    assert out.returncode == 0, out.stderr[-2000:]
    events = [json.loads(line) for line in out.stdout.splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "TurnStarted" and kinds[-1] == "Finished"
    assert "SearchCalled" in kinds and "DocumentsReturned" in kinds
    docs = next(e for e in events if e["event"] == "DocumentsReturned")
    assert docs["docs"][0]["title"] and docs["rendered"].startswith("\n\n<information>Doc 1(")
    assert events[-1]["searches"] >= 1 and events[-1]["trajectory"].startswith("<|im_start|>")


@pytest.mark.slow
def test_terminal_output_and_errors(tiny_models, default_corpus):
    out = _infer("which film is this", "--model", str(tiny_models["scripted"]), "--engine",
                 "bm25s")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "search:" in out.stdout and "stop=" in out.stdout
    assert "\033[" not in out.stdout  # no colour codes when not a terminal
    bad = _infer("q", "--model", "/no/such/model")
    assert bad.returncode == 2 and "neither a local directory nor a hub id" in bad.stderr
    empty = _infer("   ", "--model", str(tiny_models["scripted"]))
    assert empty.returncode == 2 and "1 to 2,000 characters" in empty.stderr


def test_render_terminal_sets_searches_off():
    plain, colour = Style(False), Style(True)
    assert render_terminal(TurnStarted(1, 5, False), plain) == "\n── turn 1/4 ──\n"
    assert render_terminal(TextDelta("<think>x"), plain) == "<think>x"
    assert render_terminal(SearchCalled("paris", 1), plain) == "\nsearch: paris\n"
    docs = DocumentsReturned("paris", [Doc("1", '"Paris"\nCapital of France.', 3.5)], "", 0.01)
    shown = render_terminal(docs, plain)
    assert "[1] Paris (3.50) Capital of France." in shown
    assert "\033[1;36m" in render_terminal(SearchCalled("q", 1), colour)
    done = Finished("error", 1, 0, 3, 0.5, "t", "t", error="RetrieverError: down")
    assert "error: RetrieverError: down" in render_terminal(done, plain)
