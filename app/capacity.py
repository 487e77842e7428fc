"""Will this model fit here, and what must go to make room: one question, one answer.

`Capacity.ask(model, loaded)` answers it for the model pool (right before each load) and
for the pickers (with every loaded model counted as droppable): a `Fit` that says whether
the model fits, why not, the memory it will take, and which idle models to drop first.

The arithmetic is pure (`need_of`, `misfit`, `evictions`): a model's memory is its
parameters times the bytes of the dtype it loads in (float32 on a CPU, bfloat16 on a GPU,
as the transformers backend loads it), plus a share for activations, the KV cache and the
runtime; its download is its parameters in the dtype hub checkpoints are stored in. The
figures it works on are measured here: free RAM (within a container's memory limit) or
free GPU memory, and free disk where downloads go.

A GGUF (`ID:q4_k_m`, run by llama.cpp on the CPU) takes RAM: its file (the cached file's
size, else its parameters at the bytes a parameter took in the files measured here) plus
the KV cache of one sequence of the backend's slot length (f16, from the checkpoint's
config), plus the runtime; its disk is the download, the f16 file it is made from and
itself. An operator can cap the memory models
may take (`--memory-budget-gb`, env LLDS_MEMORY_BUDGET_GB): the budget then replaces the
measured figure, less what the studio's loaded models take by estimate.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.models import GGUF_TYPES, lookup, model_ref, parameter_count, shipped

GB = 1024 ** 3
BYTES_PER_PARAMETER = {"float32": 4, "bfloat16": 2, "float16": 2}
STORED_DTYPE = "bfloat16"  # what Qwen2.5 checkpoints on the hub hold
OVERHEAD = 1.2  # memory on top of the weights: activations, a 4,096-token KV cache, buffers
# Bytes a parameter takes in a GGUF, measured on Qwen2.5-3B's shape (q4_k_m 1,929,900,800,
# q8_0 3,285,474,048, q4_0 1,822,847,744 and iq4_nl 1,836,479,232 bytes for 3.09B
# parameters); f16 and f32 as stored.
GGUF_BYTES_PER_PARAMETER = {"q4_k_m": 0.625, "q8_0": 1.064, "q4_0": 0.590, "iq4_nl": 0.595,
                            "f16": 2.0, "f32": 4.0}
GGUF_RUNTIME = 256 * 1024 ** 2  # llama.cpp's compute buffers and the Python process's share
KV_SHARE = 0.12  # KV cache / file when the config is not at hand (3B q4_k_m: 226 MB / 1.93 GB)
CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                 "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def gb(size: int) -> str:
    return f"{size / GB:.1f} GB"


# ------------------------------------------------------------------ the arithmetic (pure)

@dataclass(frozen=True)
class Need:
    """What loading one model takes: memory (RAM on a CPU, GPU memory on a GPU) and the
    bytes still to download (0 for a model shipped in the repository or cached)."""

    parameters: int
    dtype: str
    memory: int
    download: int


@dataclass(frozen=True)
class Room:
    """What this machine offers models: memory (`where`: RAM or GPU memory) and disk."""

    memory: int
    disk: int
    where: str = "RAM"


@dataclass(frozen=True)
class Loaded:
    """A model the studio holds: its memory by estimate, and whether a run is using it."""

    model: str
    memory: int
    idle: bool = True


@dataclass(frozen=True)
class Fit:
    """The answer: does `model` fit, why not, what it takes, and which idle models to drop
    first (least recently used first)."""

    model: str
    fits: bool
    reason: str | None = None
    memory: int = 0  # bytes it will take by estimate (0: size unknown, let through)
    evict: tuple[str, ...] = ()
    busy: int = 0  # loaded models in use now, which can't be dropped


def need_of(parameters: int, dtype: str, downloaded: bool) -> Need:
    """A model of `parameters` loaded in `dtype`; `downloaded`: already on this machine."""
    memory = int(parameters * BYTES_PER_PARAMETER[dtype] * OVERHEAD)
    download = 0 if downloaded else parameters * BYTES_PER_PARAMETER[STORED_DTYPE]
    return Need(parameters, dtype, memory, download)


def gguf_need(parameters: int, kind: str, file: int | None, kv: int | None,
              downloaded: bool) -> Need:
    """A GGUF of `parameters` of type `kind`: `file` its size when it is made already (then
    no disk is needed), `kv` its KV cache's bytes when the config is known, `downloaded`
    the checkpoint it is made from is here."""
    size = file if file is not None else int(parameters * GGUF_BYTES_PER_PARAMETER[kind])
    memory = size + (kv if kv is not None else int(size * KV_SHARE)) + GGUF_RUNTIME
    disk = 0 if file is not None else (
        (0 if downloaded else parameters * BYTES_PER_PARAMETER[STORED_DTYPE])
        + parameters * BYTES_PER_PARAMETER["float16"] + size)
    return Need(parameters, kind, memory, disk)


def misfit(need: Need, room: Room) -> str | None:
    """Why the model can't be loaded with this room (a short reason), or None when it can."""
    if need.memory > room.memory:
        return (f"needs {gb(need.memory)} of {room.where} ({need.parameters / 1e9:.2f}B "
                f"parameters in {need.dtype}), {gb(room.memory)} available")
    if need.download > room.disk:
        if need.dtype in GGUF_TYPES:
            return (f"needs {gb(need.download)} of disk to download and convert, "
                    f"{gb(room.disk)} free")
        return f"a {gb(need.download)} download, {gb(room.disk)} free on disk"
    return None


def evictions(need: int, free: int, idle: Sequence[tuple[str, int]]) -> list[str] | None:
    """Which loaded models to drop so that `need` bytes fit in `free` plus what they free.

    `idle`: (model, bytes) of the loaded models no run is using, least recently used
    first; they go in that order, only as many as needed. None when dropping all of them
    still leaves too little room.
    """
    dropped: list[str] = []
    for model, size in idle:
        if need <= free:
            break
        dropped.append(model)
        free += size
    return dropped if need <= free else None


def answer(model: str, need: Need | None, free: int, disk: int, where: str,
           loaded: Sequence[Loaded]) -> Fit:
    """The whole decision from measured figures: `free` memory with `loaded` (least
    recently used first) still held, `disk` free for downloads."""
    if need is None:
        return Fit(model, True)
    idle = [(m.model, m.memory) for m in loaded if m.idle and m.model != model]
    busy = sum(not m.idle for m in loaded if m.model != model)
    problem = misfit(need, Room(free + sum(size for _, size in idle), disk, where))
    if problem:
        return Fit(model, False, problem, need.memory, busy=busy)
    return Fit(model, True, None, need.memory,
               tuple(evictions(need.memory, free, idle) or ()), busy)


def meminfo_available(text: str) -> int | None:
    """MemAvailable from the text of /proc/meminfo, in bytes; None when it isn't there."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "MemAvailable":
            number, _, unit = value.strip().partition(" ")
            return int(number) * (1024 if unit.strip().lower() == "kb" else 1)
    return None


def cgroup_room(limit: str, usage: str) -> int | None:
    """What a container's memory limit leaves (cgroup `memory.max` and `memory.current`);
    None without a limit ("max", or the huge number cgroup v1 reports for none)."""
    limit = limit.strip()
    if not limit.isdigit() or int(limit) >= 2 ** 60:
        return None
    return max(0, int(limit) - int(usage.strip() or 0))


# ------------------------------------------------------------------ the measurements

def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return None


def free_ram() -> int:
    """RAM a new model can take now: MemAvailable, or less where a container limit says so."""
    text = _read("/proc/meminfo")
    found = [meminfo_available(text)] if text else []
    if not any(found):
        found = [os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")]
    for limit, usage in CGROUP_FILES:
        limit_text, usage_text = _read(limit), _read(usage)
        if limit_text is not None and usage_text is not None:
            found.append(cgroup_room(limit_text, usage_text))
    return min(size for size in found if size is not None)


def free_gpu_memory() -> int:
    """Free memory summed over the CUDA devices (the backend spreads a model over them)."""
    import torch

    return sum(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count()))


def free_disk(path: Path) -> int:
    """Free bytes on the disk that holds `path` (or its nearest existing parent)."""
    path = path.expanduser().resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def downloaded(model: str) -> bool:
    """The model's files are here: shipped with the repository, or its config and weights are
    in the Hugging Face cache."""
    if shipped(model):
        return True
    from huggingface_hub import try_to_load_from_cache

    def cached(name: str) -> bool:
        return isinstance(try_to_load_from_cache(model, name), str)

    return cached("config.json") and (cached("model.safetensors.index.json")
                                      or cached("model.safetensors"))


def kv_cache_bytes(model: str, tokens: int) -> int | None:
    """The f16 KV cache of `tokens` tokens for `model` (layers x 2 x KV heads x head size x
    2 bytes a token), from its config when shipped or cached; None when not at hand."""
    info = lookup(model)
    config_file = info.local / "config.json" if info is not None and info.local else None
    if config_file is None:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "config.json")
        config_file = Path(found) if isinstance(found, str) else None
    try:
        config = json.loads(config_file.read_text(encoding="utf-8")) if config_file else None
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        per_token = (int(config["num_hidden_layers"]) * 2
                     * int(config.get("num_key_value_heads", heads)) * head_dim * 2)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return per_token * tokens


@dataclass(frozen=True)
class Capacity:
    """Whether models fit on this machine, for the transformers backend on `device`.

    memory_budget: bytes the operator lets models take (None: measure what is free).
    """

    device: str = "cpu"
    memory_budget: int | None = None

    @classmethod
    def for_launch(cls, device: str = "auto", memory_budget_gb: float | None = None) -> Capacity:
        from agent.backends.hf import pick_device

        budget = None if memory_budget_gb is None else int(memory_budget_gb * GB)
        return cls(pick_device(device), budget)

    @property
    def dtype(self) -> str:
        from agent.backends.hf import auto_dtype

        return auto_dtype(self.device)

    @property
    def where(self) -> str:
        return "GPU memory" if self.device == "cuda" else "RAM"

    def need(self, model: str) -> Need | None:
        """What `model` takes here; None when its size is unknown (not in the registry and
        not shipped: a model the operator named, which is let through)."""
        ref = model_ref(model)
        info = lookup(ref)
        parameters = parameter_count(ref) or (info.parameters if info else 0)
        if not parameters:
            return None
        if ref.gguf_type is not None:
            from agent.backends.llamacpp import DEFAULT_SLOT_CONTEXT
            from app.gguf_cache import cached

            made = cached(ref)
            return gguf_need(parameters, ref.gguf_type, made.stat().st_size if made else None,
                             kv_cache_bytes(ref.checkpoint, DEFAULT_SLOT_CONTEXT),
                             downloaded(ref.checkpoint))
        return need_of(parameters, self.dtype, downloaded(ref))

    def where_for(self, model: str) -> str:
        """Where `model`'s weights go: a GGUF always in RAM (llama.cpp runs it on the CPU)."""
        return "RAM" if model_ref(model).gguf_type is not None else self.where

    def free_memory(self, held: int, where: str | None = None) -> int:
        """Memory a new model can take now (`where`: RAM or GPU memory, the device's when
        None); `held`: what the studio's loaded models take."""
        if self.memory_budget is not None:
            return max(0, self.memory_budget - held)
        return free_gpu_memory() if (where or self.where) == "GPU memory" else free_ram()

    def free_disk(self, model: str = "") -> int:
        from huggingface_hub import constants

        if model_ref(model).gguf_type is not None:
            from app.gguf_cache import cache_dir

            return min(free_disk(cache_dir()), free_disk(Path(constants.HF_HUB_CACHE)))
        return free_disk(Path(constants.HF_HUB_CACHE))

    def ask(self, model: str, loaded: Sequence[Loaded] = ()) -> Fit:
        """Does `model` fit now, beside the models the studio holds (`loaded`, least
        recently used first; only idle ones may be dropped)? Measured at the call."""
        need = self.need(model)
        if need is None:
            return Fit(model, True)
        held = sum(m.memory for m in loaded if m.model != model)
        where = self.where_for(model)
        return answer(model, need, self.free_memory(held, where), self.free_disk(model),
                      where, loaded)
