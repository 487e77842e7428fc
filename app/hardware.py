"""Will a model fit here: the arithmetic behind an exposed studio's model list. No I/O: the
figures come in (`app.resources` measures them), reasons and decisions go out.

A model's memory is its parameters times the bytes of the dtype it loads in (float32 on a
CPU, bfloat16 on a GPU, as the transformers backend loads it), plus a share for activations,
the KV cache and the runtime; its download is its parameters in the dtype hub checkpoints
are stored in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

GB = 1024 ** 3
BYTES_PER_PARAMETER = {"float32": 4, "bfloat16": 2, "float16": 2}
STORED_DTYPE = "bfloat16"  # what Qwen2.5 checkpoints on the hub hold
OVERHEAD = 1.2  # memory on top of the weights: activations, a 4,096-token KV cache, buffers


def gb(size: int) -> str:
    return f"{size / GB:.1f} GB"


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


def need_of(parameters: int, dtype: str, downloaded: bool) -> Need:
    """A model of `parameters` loaded in `dtype`; `downloaded`: already on this machine."""
    memory = int(parameters * BYTES_PER_PARAMETER[dtype] * OVERHEAD)
    download = 0 if downloaded else parameters * BYTES_PER_PARAMETER[STORED_DTYPE]
    return Need(parameters, dtype, memory, download)


def misfit(need: Need, room: Room) -> str | None:
    """Why the model can't be loaded with this room (a short reason), or None when it can."""
    if need.memory > room.memory:
        return (f"needs {gb(need.memory)} of {room.where} ({need.parameters / 1e9:.2f}B "
                f"parameters in {need.dtype}), {gb(room.memory)} available")
    if need.download > room.disk:
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
