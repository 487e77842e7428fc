"""The CPU a figure came from: its model name and the instruction sets that decide CPU
inference speed, and llama.cpp's own report of what it was built with.

    python -m benchmarks.cpu            # the CPU and llama.cpp's build
    python -m benchmarks.cpu --limits   # and what its cores can do: bandwidth, fp32, int8

Every benchmark that prints speed figures prints `describe()` first: bfloat16 matrix
products run an order of magnitude faster with AMX or AVX512-BF16 than without, int8 dot
products several times faster with VNNI, so a table from one CPU says little about another.
"""

from __future__ import annotations

import os
import sys
import time
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


def _best(run, repeat: int = 5) -> float:
    """The shortest of `repeat` timings of `run()` (after one warm-up), in seconds."""
    run()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def limits(threads: int | None = None) -> dict[str, float]:
    """What these cores can do, the ceilings a CPU inference figure is judged against:
    the memory read bandwidth (GB/s, torch's sum over 1 GiB on all threads: decoding
    reads every weight once a token) and matrix-product throughput (GFLOPS; GOPS for int8)
    in float32, bfloat16 and int8 (torch's kernels, on a 3B MLP's shape; prompt processing
    is matrix products)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    data = torch.ones(1 << 28, dtype=torch.float32)  # 1 GiB, far past any cache
    read = _best(lambda: data.sum(), 3)
    figures = {"read_gb_s": data.numel() * 4 / read / 1e9}
    # A 3B MLP's product on 512 prompt tokens: (512 x 2048) @ (2048 x 11008).
    m, k, n = 512, 2048, 11008
    for name, dtype in (("fp32_gflops", torch.float32), ("bf16_gflops", torch.bfloat16)):
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        figures[name] = 2 * m * k * n / _best(lambda a=a, b=b: a @ b) / 1e9
    a8 = torch.randint(-128, 127, (m, k), dtype=torch.int8)
    b8 = torch.randint(-128, 127, (k, n), dtype=torch.int8)
    try:
        figures["int8_gops"] = 2 * m * k * n / _best(lambda: torch._int_mm(a8, b8)) / 1e9
    except RuntimeError:  # no int8 matrix product kernel on this build
        figures["int8_gops"] = float("nan")
    figures["threads"] = torch.get_num_threads()
    return figures


def describe_limits(figures: dict[str, float]) -> str:
    return (f"limits ({figures['threads']:.0f} threads): memory read "
            f"{figures['read_gb_s']:.1f} GB/s; float32 {figures['fp32_gflops']:.0f} GFLOPS, "
            f"bfloat16 {figures['bf16_gflops']:.0f} GFLOPS, int8 {figures['int8_gops']:.0f} "
            "GOPS (torch, 512 x 2048 x 11008 products)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    print(describe())
    print(llama_cpp_info())
    if "--limits" in argv:
        print(describe_limits(limits()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
