"""The model registry (data in assets/models.json), the default-model rule, and fast, clear
load checks.

A registry model can also be named as a GGUF of one llama.cpp type, `ID:q4_k_m` (as
llama.cpp names a quantization after a hub id): that checkpoint converted by
`app.quantize` (on first use, into a cache) and run by the llama.cpp backend on the CPU.
The entries with `"gguf"` types in models.json are listed that way too.

The default-model rule lives here and only here (`default_model`, `default_pair`): the
flagship LLDS checkpoint where it can run (a GPU, and the checkpoint cached or the Hub
reachable), else the nano agent shipped under assets/ (not an LLDS checkpoint: the studio's
embedded default, trained by this project on the embedded corpus). Registry entries with a
`path` are files of this repository, selectable by their short id (`--model nano`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from agent.backends.base import ModelLoadError

ROOT = Path(__file__).resolve().parent.parent
REGISTRY_FILE = ROOT / "assets" / "models.json"
DEFAULT_MODEL = "SEGAgentRL/LLDS-A-GRPO-Qwen2.5-3B-Base-MA"
DEFAULT_BASELINE = "PeterJinGo/SearchR1-nq_hotpotqa_train-qwen2.5-7b-em-ppo"
AUTO = "auto"  # what --model means when not given: `default_model()` decides
NANO = "nano"  # the nano search agent (assets/nano-agent)
NANO_GRPO = "nano-grpo"  # the nano agent after GRPO (assets/nano-runs/…)
NANO_LLDS = "nano-llds"  # the nano agent after GRPO + LLDS
NANO_MODELS = (NANO, NANO_GRPO, NANO_LLDS, "nano-grpo-lr3e-5", "nano-llds-lr3e-5")
# `ID:TYPE`: app.quantize's --type values
GGUF_TYPES = ("q4_k_m", "q8_0", "q4_0", "iq4_nl", "f16", "f32")
CPU_GGUF = "q4_k_m"  # what a machine without a GPU is offered the 3B checkpoints as
DEFAULT_GGUF_BASELINE = "PeterJinGo/SearchR1-nq_hotpotqa_train-qwen2.5-3b-em-grpo"


@dataclass(frozen=True)
class ModelInfo:
    id: str
    label: str
    method: str  # LLDS, GRPO, PPO or base
    description: str = ""
    base: str = ""
    size: str = ""
    parameters: int = 0  # a hub model's parameter count (its model card's); 0: unknown
    path: str = ""  # a directory of this repository (relative to its root); "" for hub ids
    gguf: tuple[str, ...] = ()  # llama.cpp types listed as `ID:TYPE` entries of their own
    quantized: str = ""  # this entry's GGUF type ("" for the checkpoint as stored)

    @property
    def local(self) -> Path | None:
        """The model's directory when it ships with the repository, else None."""
        return ROOT / self.path if self.path else None

    @property
    def available(self) -> bool:
        """A shipped model is available when its files are here; a hub id always is."""
        return self.local is None or (self.local / "config.json").is_file()


@cache
def registry() -> tuple[ModelInfo, ...]:
    """The registry's models, each followed by its listed GGUF entries (`ID:TYPE`)."""
    data = json.loads(REGISTRY_FILE.read_text(encoding="utf-8"))
    models = []
    for entry in data["models"]:
        info = ModelInfo(**{**entry, "gguf": tuple(entry.get("gguf", ()))})
        models += [info, *(as_gguf(info, kind) for kind in info.gguf)]
    return tuple(models)


def _parse_name(name: str) -> tuple[str, str | None]:
    """(the checkpoint, the GGUF type) of `ID:TYPE`; (name, None) for any other name."""
    base, sep, kind = name.rpartition(":")
    return (base, kind) if sep and base and kind in GGUF_TYPES else (name, None)


class ModelRef(str):
    """A model's name (`ID`, `ID:q4_k_m`, a path, a short name), parsed once where it enters
    the studio (a flag, a picker, an API call); later steps read its fields, not the string.

    Still the name itself as a string (stripped), so messages, logs and the pool's keys read
    it as before and a plain name compares equal to it.
    """

    checkpoint: ModelRef  # the name without its GGUF type (the ref itself when it has none)
    gguf_type: str | None  # `ID:TYPE`'s llama.cpp type; None for any other name

    def __new__(cls, name: str) -> ModelRef:
        if isinstance(name, ModelRef):
            return name
        base, kind = _parse_name(name.strip())
        return cls._made(name.strip(), base, kind)

    @classmethod
    def _made(cls, name: str, base: str, kind: str | None) -> ModelRef:
        ref = str.__new__(cls, name)
        ref.gguf_type = kind
        ref.checkpoint = ref if kind is None else cls._made(base, base, None)
        return ref

    @property
    def runs_on_llamacpp(self) -> bool:
        """`ID:TYPE`, or a .gguf file: llama.cpp runs it."""
        return self.gguf_type is not None or self.lower().endswith(".gguf")


def model_ref(model: str) -> ModelRef:
    """`model` as a ModelRef: parsed now when it is a plain string, else as it is."""
    return ModelRef(model)


def gguf_id(model: str, kind: str = CPU_GGUF) -> str:
    return f"{model}:{kind}"


def as_gguf(info: ModelInfo, kind: str) -> ModelInfo:
    """The registry entry of `info`'s checkpoint as a GGUF of type `kind`."""
    what = {"q4_k_m": "4-bit", "q4_0": "4-bit", "iq4_nl": "4-bit", "q8_0": "8-bit",
            "f16": "16-bit", "f32": "32-bit"}[kind]
    return ModelInfo(
        # Short: the pickers cut a long label ("…q4_k_m GG"); the description says the rest.
        id=gguf_id(info.id, kind), label=f"{info.label} · CPU {kind}",
        method=info.method, base=info.base, size=info.size, parameters=info.parameters,
        path=info.path, quantized=kind,
        description=(f"{info.description} Here quantized to {what} ({kind}) and run by "
                     "llama.cpp on the CPU: the checkpoint is converted on its first use "
                     "(the status line shows the progress), then kept in the GGUF cache."))


def lookup(model: str) -> ModelInfo | None:
    """The registry entry of `model`; `ID:TYPE` of any registry ID is one too."""
    ref = model_ref(model)
    found = next((m for m in registry() if m.id == ref), None)
    if found is None and ref.gguf_type is not None:
        info = next((m for m in registry() if m.id == ref.checkpoint), None)
        found = as_gguf(info, ref.gguf_type) if info is not None else None
    return found


def is_gguf(model: str | None) -> bool:
    """`model` names a GGUF: `ID:TYPE`, or a .gguf file."""
    return bool(model) and model_ref(model).runs_on_llamacpp


def resolve(model: str) -> str:
    """What a backend loads for `model`: a shipped model's directory, else `model` itself.

    A shipped model whose files are missing is a ModelLoadError that says so.
    """
    info = lookup(model)
    if info is None or info.local is None or info.quantized:
        return model
    if not info.available:
        raise ModelLoadError(f"{model} ({info.label}) should be in {info.path}/, which this "
                             "checkout does not have. Update the checkout, or pick another "
                             "model.")
    return str(info.local)


def parameter_count(model: str) -> int | None:
    """The parameters in a shipped model's weights (read from the safetensors header, each
    stored tensor once, so tied embeddings count once); None for a model not stored here."""
    info = lookup(model)
    if info is None or info.local is None:
        return None
    total = 0
    try:
        for path in sorted(info.local.glob("*.safetensors")):
            with path.open("rb") as handle:
                size = int.from_bytes(handle.read(8), "little")
                if size > 100_000_000:
                    return None
                header = json.loads(handle.read(size))
            total += sum(math.prod(t["shape"]) for name, t in header.items()
                         if name != "__metadata__")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return total or None


def shipped(model: str) -> bool:
    info = lookup(model)
    return info is not None and info.local is not None and info.available


def has_gpu() -> bool:
    """CUDA or Apple MPS is present (torch is imported only here, on demand)."""
    import torch

    mps = getattr(torch.backends, "mps", None)
    return torch.cuda.is_available() or bool(mps and mps.is_available())


def hub_checkpoint_available(model: str, cache_dir: str | Path | None = None) -> bool:
    """`model` can be loaded from the hub here: cached, or not offline and the Hub reachable."""
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(model, "config.json", cache_dir=cache_dir), str):
        return True
    return not _offline() and hub_reachable()


def default_model(gpu: bool | None = None, cache_dir: str | Path | None = None) -> str:
    """The model a front end uses when none is named (`--model` not given).

    The flagship when a GPU is present and the checkpoint is cached or downloadable; the
    nano agent (`nano`) otherwise, when this checkout ships it; the flagship as a last resort
    (its load then fails with the message that says what to do).
    """
    if not shipped(NANO):
        return DEFAULT_MODEL
    if not (has_gpu() if gpu is None else gpu):
        return NANO
    return DEFAULT_MODEL if hub_checkpoint_available(DEFAULT_MODEL, cache_dir) else NANO


def model_flag(value: str) -> str:
    """argparse `type` of --model: `auto` (the default) or "" becomes `default_model()`; argparse
    converts a string default only when the flag is absent, so an explicit --model wins and
    the GPU and cache checks run only when they decide something."""
    value = value.strip()
    return default_model() if value in (AUTO, "") else value  # an empty LLDS_MODEL: unset


def default_pair(model: str) -> tuple[str, str]:
    """The Compare tab's two models (A, B) when no baseline is named.

    Beside the nano agent: its GRPO and LLDS versions when both ship, else the nano agent
    and whichever of them ships, else the nano agent twice. Beside any other model: the
    Search-R1 PPO baseline; beside a GGUF (`ID:TYPE`), the Search-R1 GRPO 3B baseline as a
    GGUF of the same type (what fits beside it on the CPU it runs on), or for a nano
    agent's GGUF the nano pair as GGUFs.
    """
    ref = model_ref(model)
    base, kind = ref.checkpoint, ref.gguf_type
    if kind is not None and is_nano(base):  # the nano pair, as GGUFs of that type
        first, second = default_pair(base)
        return gguf_id(first, kind), gguf_id(second, kind)
    if kind is not None and base != DEFAULT_GGUF_BASELINE:
        return gguf_id(DEFAULT_GGUF_BASELINE, kind), model
    if not is_nano(model):
        return DEFAULT_BASELINE, model
    if shipped(NANO_GRPO) and shipped(NANO_LLDS):
        return NANO_GRPO, NANO_LLDS
    other = next((m for m in (NANO_LLDS, NANO_GRPO) if shipped(m)), NANO)
    return NANO, other


def is_nano(model: str | None) -> bool:
    """`model` is one of the nano agents this repository ships (named by its short id)."""
    return model in NANO_MODELS


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
                f"(`hf download {model}`) and copy the cache, or give the folder of a "
                "local copy instead of the hub id.")
