"""The model registry (data in assets/models.json) and fast, clear load checks."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from agent.backends.base import ModelLoadError

REGISTRY_FILE = Path(__file__).resolve().parent.parent / "assets" / "models.json"
DEFAULT_MODEL = "SEGAgentRL/LLDS-A-GRPO-Qwen2.5-3B-Base-MA"
DEFAULT_BASELINE = "PeterJinGo/SearchR1-nq_hotpotqa_train-qwen2.5-7b-em-ppo"


@dataclass(frozen=True)
class ModelInfo:
    id: str
    label: str
    method: str  # LLDS, GRPO, PPO or base
    description: str = ""
    base: str = ""
    size: str = ""


@cache
def registry() -> tuple[ModelInfo, ...]:
    data = json.loads(REGISTRY_FILE.read_text(encoding="utf-8"))
    return tuple(ModelInfo(**m) for m in data["models"])


def lookup(model: str) -> ModelInfo | None:
    return next((m for m in registry() if m.id == model), None)


def label(model: str) -> str:
    info = lookup(model)
    return info.label if info else model


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


def hub_reachable(timeout: float = 3.0) -> bool:
    """One quick TCP connect, so an unreachable Hub fails in seconds, not after retries."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def check_loadable(model: str) -> None:
    """Fail fast, with what to do, when `model` can't be loaded here (before any download)."""
    path = Path(model).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} has no config.json: point --model at a directory "
                                 "saved with save_pretrained (config, weights, tokenizer).")
        return
    if model.count("/") != 1 or model.startswith(("/", ".")):
        raise ModelLoadError(f"{model!r} is neither a local directory nor a hub id "
                             "(owner/name).")
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(model, "config.json"), str):
        return
    if _offline() or not hub_reachable():
        why = "HF_HUB_OFFLINE=1" if _offline() else "the Hub cannot be reached"
        raise ModelLoadError(
                f"{model} is not in the local Hugging Face cache and {why}. "
                "Download it where there is internet "
                f"(`hf download {model}`) and copy the cache, or pass --model "
                "/path/to/a/local/copy.")
