"""The default-model rule (agent.models): no GPU, or the flagship neither cached nor
downloadable -> the nano agent; an explicit --model always wins; `nano` is a short name
every front end takes. The registry is pointed at tiny real Qwen2 models the tests build
(the shipped nano agent has its own tests once it is in the checkout)."""

from __future__ import annotations

import argparse
import json

import pytest

from agent import models
from agent.config import BackendOptions, add_model_flags
from agent.models import DEFAULT_BASELINE, DEFAULT_MODEL, NANO, NANO_GRPO, NANO_LLDS


@pytest.fixture
def registry_with(tmp_path, monkeypatch):
    """Point the registry at a file listing the given shipped models (id -> directory)."""
    def make(shipped: dict[str, str]) -> None:
        entries = [{"id": model_id, "path": str(path), "label": f"{model_id} (test)",
                    "method": "SFT", "description": "a tiny test model"}
                   for model_id, path in shipped.items()]
        entries.append({"id": DEFAULT_MODEL, "label": "flagship", "method": "LLDS"})
        path = tmp_path / "models.json"
        path.write_text(json.dumps({"models": entries}))
        monkeypatch.setattr(models, "REGISTRY_FILE", path)
        models.registry.cache_clear()

    yield make
    models.registry.cache_clear()


def flagship_cache(root):
    """A Hugging Face cache that holds the flagship's config (what try_to_load_from_cache
    looks for)."""
    repo = root / f"models--{DEFAULT_MODEL.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    return root


def test_no_gpu_or_no_flagship_means_the_nano_agent(registry_with, tiny_models, tmp_path):
    registry_with({NANO: tiny_models["scripted"]})
    assert models.default_model(gpu=False) == NANO
    # conftest sets HF_HUB_OFFLINE=1 and the test cache has no flagship: not available
    assert models.default_model(gpu=True, cache_dir=tmp_path / "empty") == NANO
    cache = flagship_cache(tmp_path / "hub")
    assert models.default_model(gpu=True, cache_dir=cache) == DEFAULT_MODEL
    assert models.default_model(gpu=False, cache_dir=cache) == NANO


def test_without_the_nano_agent_the_flagship_stays_the_default(registry_with, tmp_path):
    registry_with({NANO: tmp_path / "not-here"})
    assert not models.shipped(NANO)
    assert models.default_model(gpu=False) == DEFAULT_MODEL
    with pytest.raises(models.ModelLoadError, match="not-here"):
        models.resolve(NANO)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_model_flags(parser)
    return parser.parse_args(argv)


def test_an_explicit_model_always_wins(registry_with, tiny_models, monkeypatch):
    registry_with({NANO: tiny_models["scripted"]})
    monkeypatch.delenv("LLDS_MODEL", raising=False)
    monkeypatch.setattr(models, "has_gpu", lambda: False)
    assert parse([]).model == NANO
    assert parse(["--model", "auto"]).model == NANO

    def no_checks():
        raise AssertionError("the rule ran although --model was given")

    monkeypatch.setattr(models, "has_gpu", no_checks)
    assert parse(["--model", DEFAULT_MODEL]).model == DEFAULT_MODEL
    assert parse(["--model", "/some/dir"]).model == "/some/dir"
    monkeypatch.setenv("LLDS_MODEL", "org/from-env")
    assert parse([]).model == "org/from-env"
    assert parse(["--model", "org/flag"]).model == "org/flag"


def test_nano_is_a_short_name_every_backend_load_takes(registry_with, tiny_models):
    registry_with({NANO: tiny_models["scripted"]})
    assert models.resolve(NANO) == str(tiny_models["scripted"])
    assert models.resolve("org/name") == "org/name"
    backend = BackendOptions(device="cpu").load(NANO)  # the real transformers backend
    assert backend.count_tokens("hello") > 0


def test_infer_without_model_runs_the_nano_agent_offline(registry_with, tiny_models,
                                                         monkeypatch, capsys,
                                                         default_corpus):
    from app import infer

    registry_with({NANO: tiny_models["scripted"]})
    monkeypatch.delenv("LLDS_MODEL", raising=False)
    monkeypatch.setattr(models, "has_gpu", lambda: False)
    code = infer.main(["Who directed 2001: A Space Odyssey?", "--engine", "bm25s",
                       "--device", "cpu", "--json"])
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()
              if line.startswith("{")]
    assert code == 0
    assert any(e["event"] == "DocumentsReturned" for e in events)
    assert events[-1]["event"] == "Finished"


def test_compare_pairs_the_nano_grpo_and_llds_models_when_they_ship(registry_with,
                                                                    tiny_models, tmp_path):
    registry_with({NANO: tiny_models["scripted"], NANO_GRPO: tiny_models["random"],
                   NANO_LLDS: tiny_models["eos"]})
    assert models.default_pair(NANO) == (NANO_GRPO, NANO_LLDS)
    assert models.default_pair("org/x") == (DEFAULT_BASELINE, "org/x")
    registry_with({NANO: tiny_models["scripted"], NANO_GRPO: tmp_path / "not-yet",
                   NANO_LLDS: tiny_models["eos"]})
    assert models.default_pair(NANO) == (NANO, NANO_LLDS)
    registry_with({NANO: tiny_models["scripted"]})
    assert models.default_pair(NANO) == (NANO, NANO)


def test_the_shipped_registry_describes_the_nano_models_honestly():
    models.registry.cache_clear()
    nano, grpo, llds = (models.lookup(m) for m in (NANO, NANO_GRPO, NANO_LLDS))
    assert nano.path == "assets/nano-agent" and "Not an LLDS checkpoint" in nano.description
    assert "embedded" in nano.description
    assert (grpo.method, llds.method) == ("GRPO", "LLDS")
    assert all("Nano-scale, made by this project" in m.description for m in (grpo, llds))
    assert all(m.path.startswith("assets/nano-runs/") for m in (grpo, llds))


def test_every_front_end_takes_the_rule(registry_with, tiny_models, monkeypatch):
    """app.py, app.infer and the evaluator build their --model from the same flag group."""

    from evaluator.__main__ import _run_parser

    registry_with({NANO: tiny_models["scripted"]})
    monkeypatch.delenv("LLDS_MODEL", raising=False)
    monkeypatch.setattr(models, "has_gpu", lambda: False)
    import app.__main__ as studio_main
    assert studio_main.parse_args([]).model == NANO
    assert _run_parser().parse_args(["--datasets", "nq"]).model == NANO
    assert _run_parser().parse_args(["--model", "org/x"]).model == "org/x"


def test_one_rule_says_which_models_are_nano_agents():
    from app.ui.context import Studio
    from app.ui.evaluate_tab import default_dataset

    assert all(models.is_nano(m) for m in (NANO, NANO_GRPO, NANO_LLDS))
    assert not any(models.is_nano(m) for m in ("nano-someone/a-hub-model", DEFAULT_MODEL, None))
    for model, nano, dataset in ((NANO_LLDS, True, "vitalqa"),
                                 ("nano-someone/a-hub-model", False, "nq")):
        studio = Studio(pool=None, retriever=None, default_model=model)
        assert studio.nano is nano and default_dataset(studio) == dataset
        assert models.default_pair(model)[0] != DEFAULT_BASELINE or not nano
