"""The CPU a figure came from: its model name and the instruction sets that decide CPU
inference speed, and llama.cpp's own report of what it was built with.

    python -m benchmarks.cpu

Every benchmark that prints speed figures prints `describe()` first: bfloat16 matrix
products run an order of magnitude faster with AMX or AVX512-BF16 than without, int8 dot
products several times faster with VNNI, so a table from one CPU says little about another.
"""

from __future__ import annotations

import os
from pathlib import Path

# The flags (as /proc/cpuinfo names them) that decide torch's and llama.cpp's CPU kernels.
SPEED_FLAGS = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_vnni": "AVX512-VNNI",
               "avx_vnni": "AVX-VNNI", "avx512_bf16": "AVX512-BF16", "amx_tile": "AMX",
               "amx_bf16": "AMX-BF16", "amx_int8": "AMX-INT8"}


def cpu_info(text: str | None = None) -> tuple[str, list[str]]:
    """(model name, the SPEED_FLAGS it has, in SPEED_FLAGS' order) from /proc/cpuinfo's
    text (read when None); ("unknown", []) where there is none (not Linux)."""
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
    name, flags = "unknown", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and name == "unknown":
            name = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return name, [label for flag, label in SPEED_FLAGS.items() if flag in flags]


def describe() -> str:
    """One line: the CPU's name, its speed flags (and those it lacks), the cores this
    process may use."""
    name, found = cpu_info()
    missing = [label for label in SPEED_FLAGS.values() if label not in found]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"CPU: {name}, {cores} cores; has {', '.join(found) or 'none of the speed flags'}"
            f"{'; lacks ' + ', '.join(missing) if missing else ''}")


def llama_cpp_info() -> str:
    """llama.cpp's system info (the instruction sets its build uses), or why there is none."""
    try:
        import llama_cpp
    except ImportError:
        return "llama.cpp: llama-cpp-python is not installed"
    info = llama_cpp.llama_print_system_info()
    text = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    return f"llama.cpp {getattr(llama_cpp, '__version__', '?')}: {text.strip()}"


def main() -> int:
    print(describe())
    print(llama_cpp_info())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
