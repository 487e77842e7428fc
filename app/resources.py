"""What this machine has for models, measured now: free RAM (within a container's memory
limit) or free GPU memory, and free disk where downloads go; and `Capacity`, which the model
pool and the pickers ask whether a model fits (`app.hardware` does the arithmetic).

An operator can cap the memory models may take (`--memory-budget-gb`, env
LLDS_MEMORY_BUDGET_GB): the budget then replaces the measured figure, less what the
studio's loaded models take by estimate.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from agent.models import lookup, parameter_count, shipped
from app.hardware import GB, Need, Room, cgroup_room, meminfo_available, misfit, need_of

CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                 "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


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
        info = lookup(model)
        parameters = parameter_count(model) or (info.parameters if info else 0)
        if not parameters:
            return None
        return need_of(parameters, self.dtype, downloaded(model))

    def free_memory(self, held: int) -> int:
        """Memory a new model can take now; `held`: what the studio's loaded models take."""
        if self.memory_budget is not None:
            return max(0, self.memory_budget - held)
        return free_gpu_memory() if self.device == "cuda" else free_ram()

    def free_disk(self) -> int:
        from huggingface_hub import constants

        return free_disk(Path(constants.HF_HUB_CACHE))

    def room(self, held: int = 0) -> Room:
        """What a model could have if the studio dropped every model it holds (`held`)."""
        return Room(self.free_memory(held) + held, self.free_disk(), self.where)

    def problem(self, model: str, held: int = 0) -> str | None:
        """Why `model` can't be loaded on this machine at all (a short reason), or None."""
        need = self.need(model)
        return misfit(need, self.room(held)) if need else None
