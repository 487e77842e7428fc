"""A model named `ID:TYPE` in the studio: converted to a GGUF on first use (progress on the
status line), kept in the cache, made again when a local checkpoint changes, and run by
llama.cpp with the answers torch gives. On the nano agent (shipped) and a copy of it.

Skipped where llama-cpp-python or gguf is not installed; the registry and memory rules of
GGUFs, which need neither, are in tests/test_hardware.py.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: pip install -r "
                    "requirements-llamacpp.txt")
pytest.importorskip("gguf", reason="gguf is not installed: pip install -r "
                    "requirements-llamacpp.txt")

from agent.backends.base import ModelLoadError  # noqa: E402
from agent.config import BackendOptions  # noqa: E402
from agent.events import Finished  # noqa: E402
from agent.loop import AgentSettings  # noqa: E402
from app.gguf_cache import cached, gguf_path, studio_loader  # noqa: E402
from app.ui.model_pool import ModelPool, ModelStatus, run_model, status_markdown  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
QUESTION = "who directed 2001 a space odyssey"


@pytest.fixture
def gguf_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LLDS_GGUF_CACHE", str(tmp_path / "gguf-cache"))
    return tmp_path / "gguf-cache"


def ask(pool: ModelPool, model: str, retriever) -> tuple[list[ModelStatus], Finished]:
    statuses, finished = [], None
    for event in run_model(pool, model, QUESTION, retriever, AgentSettings(),
                           threading.Event()):
        if isinstance(event, ModelStatus):
            statuses.append(event)
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None, [s.detail for s in statuses]
    return statuses, finished


def test_first_use_converts_with_progress_then_the_cache_serves(gguf_cache, local_retriever):
    pool = ModelPool(studio_loader(BackendOptions().load), max_loaded=3)
    statuses, on_llama = ask(pool, "nano:f16", local_retriever)
    assert statuses[0].state == "loading" and "converts this checkpoint" in statuses[0].detail
    assert statuses[-1].state == "ready"
    assert gguf_path("nano:f16") == gguf_cache / "nano" / "f16" / "model.gguf"
    assert cached("nano:f16") == gguf_path("nano:f16")
    assert sorted(p.name for p in gguf_path("nano:f16").parent.iterdir()) == [
        "model.gguf", "source.json"]  # the conversion's work folder is gone
    assert pool.get("nano:f16").name == "llamacpp"
    assert status_markdown(pool, "nano:f16").endswith("loaded.")
    _, on_torch = ask(pool, "nano", local_retriever)
    assert pool.get("nano").name == "transformers"
    assert on_llama.answer == on_torch.answer == "Stanley Kubrick"
    assert on_llama.trajectory == on_torch.trajectory

    again = ModelPool(studio_loader(BackendOptions().load))  # a restart: the file is kept
    stamp = gguf_path("nano:f16").stat().st_mtime_ns
    statuses, finished = ask(again, "nano:f16", local_retriever)
    assert "converts" not in statuses[0].detail and finished.answer == "Stanley Kubrick"
    assert gguf_path("nano:f16").stat().st_mtime_ns == stamp


def test_a_gguf_name_is_parsed_once_on_its_way_through_a_load(gguf_cache, monkeypatch):
    # The pool, the capacity check, the cache and the loader read one ModelRef: the string
    # is parsed where it enters (pool.get), not again at each step.
    from agent import models
    from app.capacity import Capacity

    parsed: list[str] = []
    real = models._parse_name
    monkeypatch.setattr(models, "_parse_name", lambda name: parsed.append(name) or real(name))
    pool = ModelPool(studio_loader(BackendOptions().load),
                     capacity=Capacity("cpu", 16 * 1024**3))
    assert pool.get("nano:f16").name == "llamacpp"  # converted, checked, loaded
    assert parsed == ["nano:f16"]


def test_progress_names_each_step_while_it_converts(gguf_cache, local_retriever):
    seen: list[str] = []
    pool = ModelPool(studio_loader(BackendOptions().load))
    original = pool.factory

    def slow_factory(model):  # record what the status line says at each report
        from app import gguf_cache as module

        real = module.report

        def report(line):
            real(line)
            seen.append(status_markdown(pool, model))

        module.report = report
        try:
            return original(model)
        finally:
            module.report = real

    pool.factory = slow_factory
    ask(pool, "nano:q8_0", local_retriever)
    assert any("writing the f16 GGUF: tensor 1 of" in line for line in seen), seen
    assert any("quantizing to q8_0 with llama.cpp" in line for line in seen), seen
    assert any(line.startswith("**Nano search agent") and "loading…" in line for line in seen)


def test_a_changed_local_checkpoint_is_converted_again(gguf_cache, tmp_path, local_retriever):
    copy = tmp_path / "my-agent"
    shutil.copytree(ROOT / "assets" / "nano-agent", copy)
    model = f"{copy}:f16"
    loader = studio_loader(BackendOptions().load)
    loader(model)
    made = cached(model)
    assert made is not None and made.parent.parent.name.startswith("my-agent-")
    (copy / "generation_config.json").write_text('{"do_sample": false}', encoding="utf-8")
    assert cached(model) is None  # the checkpoint's files changed: not this file any more
    loader(model)
    assert cached(model) == made


def test_a_gguf_file_runs_on_llama_cpp_whatever_the_launch_backend(gguf_cache, tmp_path,
                                                                    local_retriever):
    from app.quantize import convert

    written = convert(str(ROOT / "assets" / "nano-agent"), tmp_path / "q8", "q8_0")
    pool = ModelPool(studio_loader(BackendOptions().load))  # the transformers backend's
    backend = pool.get(str(written.path))
    assert backend.name == "llamacpp" and backend.path == written.path
    _, done = ask(pool, str(written.path), local_retriever)
    assert done.answer and done.turns


def test_a_failed_conversion_leaves_no_model_file_and_says_why(gguf_cache, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(ROOT / "assets" / "nano-agent", broken)
    for weights in broken.glob("*.safetensors"):
        weights.unlink()
    pool = ModelPool(studio_loader(BackendOptions().load))
    with pytest.raises(ModelLoadError, match="could not be converted to a GGUF: .* no "
                                              r"\*\.safetensors or \*\.bin weights"):
        pool.get(f"{broken}:q4_k_m")
    folder = gguf_path(f"{broken}:q4_k_m").parent
    assert list(folder.iterdir()) == []  # no model.gguf, no work folder
    assert pool.status(f"{broken}:q4_k_m")[0] == "failed"


def test_the_readme_commands_convert_a_shipped_model_by_its_short_name(tmp_path):
    """`python -m app.quantize MODEL --out DIR` then `python -m app.infer ... --backend
    llamacpp --model DIR/model.gguf`, as the README gives them, on the nano agent (`nano`
    is a shipped model's short name, even where a folder named nano is in the way)."""
    import json
    import subprocess
    import sys

    out = tmp_path / "nano-gguf"
    run = subprocess.run([sys.executable, "-m", "app.quantize", "nano", "--out", str(out),
                          "--type", "f16"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"wrote {out / 'model.gguf'} (f16, " in run.stdout
    run = subprocess.run([sys.executable, "-m", "app.infer", QUESTION, "--backend",
                          "llamacpp", "--model", str(out / "model.gguf"), "--engine",
                          "bm25s", "--json"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    last = json.loads(run.stdout.strip().splitlines()[-1])
    assert last["event"] == "Finished" and last["answer"] == "Stanley Kubrick", last


def test_visitors_at_once_share_one_llamacpp_batch_with_their_own_answers(gguf_cache,
                                                                          local_retriever):
    # Batched serving (app/ui/serving.py) through the llama.cpp backend's `generate`: each
    # visitor's trajectory is the one their question gets alone.
    from agent.loop import run_agent

    questions = ["who created linux", "capital of kenya", "when was facebook founded"]
    pool = ModelPool(studio_loader(BackendOptions().load))
    backend = pool.get("nano:f16")
    alone = {q: list(run_agent(q, backend, local_retriever, AgentSettings()))[-1]
             for q in questions}
    calls = []
    real_generate = backend.generate

    def generate(contexts, *args, **kwargs):
        calls.append(len(contexts))
        return real_generate(contexts, *args, **kwargs)

    backend.generate = generate
    together: dict[str, list] = {}

    def visit(q):
        together[q] = list(run_model(pool, "nano:f16", q, local_retriever, AgentSettings(),
                                     threading.Event()))

    threads = [threading.Thread(target=visit, args=(q,)) for q in questions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for q in questions:
        assert together[q][-1].trajectory == alone[q].trajectory
    assert calls and max(calls) >= 2  # they shared generate calls
