"""Only what the hardware holds: the arithmetic (parameters × dtype against free memory,
download against free disk, least-recently-used eviction), the measured figures, the pool
that checks each load again, and the pickers' labels. Models are registry ids; the backends
are stand-ins (no multi-GB load), the capacity checks are the real ones."""

from __future__ import annotations

import pytest

from agent.backends.base import ModelLoadError
from agent.models import lookup
from app.capacity import (
    GB,
    Capacity,
    Loaded,
    Need,
    Room,
    cgroup_room,
    evictions,
    free_disk,
    free_ram,
    meminfo_available,
    misfit,
    need_of,
)
from app.ui.model_pool import ModelPool

LLDS_3B = "SEGAgentRL/LLDS-A-GRPO-Qwen2.5-3B-Base-MA"
LLDS_R_3B = "SEGAgentRL/LLDS-R-GRPO-Qwen2.5-3B-Base"
GRPO_3B = "PeterJinGo/SearchR1-nq_hotpotqa_train-qwen2.5-3b-em-grpo"
PPO_7B = "PeterJinGo/SearchR1-nq_hotpotqa_train-qwen2.5-7b-em-ppo"


def test_memory_is_parameters_times_dtype_bytes_with_headroom():
    on_cpu = need_of(3_000_000_000, "float32", downloaded=False)
    assert on_cpu.memory == 3_000_000_000 * 4 * 1.2
    assert on_cpu.download == 3_000_000_000 * 2  # stored in bfloat16
    on_gpu = need_of(3_000_000_000, "bfloat16", downloaded=True)
    assert on_gpu.memory == on_cpu.memory // 2 and on_gpu.download == 0


def test_a_7b_in_float32_does_not_fit_a_cpu_space():
    need = need_of(7_610_000_000, "float32", downloaded=False)
    reason = misfit(need, Room(memory=16 * GB, disk=50 * GB))
    assert reason == "needs 34.0 GB of RAM (7.61B parameters in float32), 16.0 GB available"
    assert misfit(need_of(7_610_000_000, "bfloat16", False), Room(24 * GB, 50 * GB,
                                                                  "GPU memory")) is None


def test_a_download_larger_than_the_free_disk_is_refused():
    need = Need(parameters=7 * 10 ** 9, dtype="bfloat16", memory=GB, download=14 * GB)
    assert misfit(need, Room(memory=80 * GB, disk=10 * GB)) == (
        "a 14.0 GB download, 10.0 GB free on disk")
    assert misfit(need, Room(memory=80 * GB, disk=14 * GB)) is None


def test_evictions_drop_least_recently_used_first_and_no_more_than_needed():
    idle = [("old", 6), ("middle", 6), ("recent", 6)]
    assert evictions(need=5, free=5, idle=idle) == []
    assert evictions(need=10, free=5, idle=idle) == ["old"]
    assert evictions(need=16, free=5, idle=idle) == ["old", "middle"]
    assert evictions(need=24, free=5, idle=idle) is None


def test_meminfo_and_cgroup_figures_are_read_in_bytes():
    assert meminfo_available("MemTotal: 100 kB\nMemAvailable:  2048 kB\n") == 2048 * 1024
    assert meminfo_available("MemTotal: 100 kB\n") is None
    assert cgroup_room("17179869184\n", "4294967296\n") == 12 * GB
    assert cgroup_room("max\n", "4294967296\n") is None
    assert cgroup_room("9223372036854771712", "1") is None  # cgroup v1's "no limit"


def test_this_machines_free_memory_and_disk_are_measured():
    import os

    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < free_ram() <= total
    assert free_disk(__import__("pathlib").Path("/no/such/dir/here")) > 0
    measured = Capacity("cpu")
    assert 0 < measured.free_memory(held=0) <= total


def test_capacity_uses_float32_on_cpu_and_bfloat16_on_gpu_with_a_budget():
    assert lookup(PPO_7B).parameters == 7_610_000_000
    on_cpu, on_gpu = Capacity("cpu", 20 * GB), Capacity("cuda", 20 * GB)
    assert on_cpu.need(PPO_7B).dtype == "float32" and on_gpu.need(PPO_7B).dtype == "bfloat16"
    assert "needs 34.0 GB of RAM" in on_cpu.ask(PPO_7B).reason
    assert on_gpu.ask(PPO_7B).fits  # 17.0 GB of the GPU's 20
    assert on_cpu.ask(LLDS_3B).fits  # 13.8 GB
    assert on_cpu.ask("nano").fits and on_cpu.need("nano").download == 0
    assert on_cpu.need("someone/unknown-model") is None  # named by the operator: let through
    assert on_cpu.ask("someone/unknown-model") == on_cpu.ask("someone/unknown-model")
    assert "needs 13.8 GB of RAM" in Capacity("cpu", GB).ask(LLDS_3B).reason


def test_one_answer_says_whether_it_fits_and_which_idle_models_go_first():
    budget = Capacity("cpu", 30 * GB)
    need = budget.need(LLDS_3B).memory  # 13.8 GB
    loaded = [Loaded("old", 10 * GB), Loaded("busy", 6 * GB, idle=False),
              Loaded("recent", 10 * GB)]
    fit = budget.ask(LLDS_3B, loaded)  # 4 GB free: the oldest idle model is enough
    assert fit.fits and fit.evict == ("old",) and fit.memory == need and fit.busy == 1
    fit = budget.ask(LLDS_3B, [Loaded("busy", 20 * GB, idle=False), Loaded("old", 5 * GB)])
    assert not fit.fits and fit.evict == () and fit.busy == 1  # 10 GB at most: refused
    assert fit.reason.startswith("needs 13.8 GB of RAM") and "10.0 GB available" in fit.reason
    assert budget.ask(LLDS_3B, [Loaded(LLDS_3B, need)]).evict == ()  # itself: not counted


def stand_in_factory(loaded: list[str]):
    def factory(model: str):
        loaded.append(model)
        return object()
    return factory


def test_the_pool_drops_the_least_recently_used_idle_model_to_make_room():
    calls: list[str] = []
    pool = ModelPool(stand_in_factory(calls), max_loaded=5, capacity=Capacity("cpu", 20 * GB))
    pool.get(LLDS_3B)
    assert pool.held() == Capacity("cpu").need(LLDS_3B).memory
    pool.get(LLDS_R_3B)  # 13.8 + 13.8 GB > 20 GB: the first goes
    assert not pool.is_loaded(LLDS_3B) and pool.is_loaded(LLDS_R_3B)
    assert pool.status(LLDS_3B) == ("unloaded", "")
    # Its status says why, and that it will load again (not "loads on first question").
    from app.ui.model_pool import status_markdown

    assert "unloaded to make room for another model; loads again on its next question" in \
        status_markdown(pool, LLDS_3B)
    pool.get("nano")  # small: both stay
    assert pool.is_loaded(LLDS_R_3B) and pool.is_loaded("nano")
    assert calls == [LLDS_3B, LLDS_R_3B, "nano"]


def test_a_model_in_use_is_not_dropped_and_the_new_one_is_refused_with_the_reason():
    calls: list[str] = []
    pool = ModelPool(stand_in_factory(calls), capacity=Capacity("cpu", 20 * GB))
    pool.get(LLDS_3B)
    assert pool.hold(LLDS_3B, timeout=1)
    with pytest.raises(ModelLoadError) as refused:
        pool.get(LLDS_R_3B)
    assert "does not fit on this machine: needs 13.8 GB of RAM" in str(refused.value)
    assert "1 other model in use now" in str(refused.value)
    assert pool.is_loaded(LLDS_3B) and calls == [LLDS_3B]
    pool.release(LLDS_3B)
    pool.get(LLDS_R_3B)  # idle now: dropped for the new one
    assert calls == [LLDS_3B, LLDS_R_3B] and not pool.is_loaded(LLDS_3B)


def test_a_model_too_big_is_never_handed_to_the_loader():
    calls: list[str] = []
    pool = ModelPool(stand_in_factory(calls), capacity=Capacity("cpu", 20 * GB))
    assert "needs 34.0 GB" in pool.hardware_problem(PPO_7B)
    with pytest.raises(ModelLoadError, match="needs 34.0 GB of RAM"):
        pool.get(PPO_7B)
    assert calls == [] and pool.status(PPO_7B)[0] == "failed"


def test_the_check_runs_again_right_before_each_load():
    calls: list[str] = []
    pool = ModelPool(stand_in_factory(calls), capacity=Capacity("cpu", 20 * GB))
    assert pool.hardware_problem(LLDS_3B) is None  # what the picker saw
    pool.capacity = Capacity("cpu", 4 * GB)  # less room by the time the visitor asks
    with pytest.raises(ModelLoadError, match="needs 13.8 GB"):
        pool.get(LLDS_3B)
    assert calls == []


def test_without_a_capacity_the_pool_loads_what_it_is_asked():
    calls: list[str] = []
    pool = ModelPool(stand_in_factory(calls))
    pool.get(PPO_7B)
    assert calls == [PPO_7B] and pool.hardware_problem(PPO_7B) is None


def test_the_pickers_label_models_that_do_not_fit_with_the_reason():
    from app.ui.context import Studio

    pool = ModelPool(stand_in_factory([]), capacity=Capacity("cpu", GB))
    studio = Studio(pool=pool, retriever=None, default_model="nano")
    labels = dict((value, name) for name, value in studio.model_choices())
    assert labels["nano"] == lookup("nano").label
    assert labels[LLDS_3B] == (f"{lookup(LLDS_3B).label} — unavailable: needs 13.8 GB of "
                               "RAM (3.09B parameters in float32), 1.0 GB available")
    assert studio.model_info(LLDS_3B).startswith("**Unavailable on this machine:** needs 13.8")
    assert "Unavailable" not in studio.model_info("nano")


def test_the_launch_decides_when_the_hardware_is_checked(monkeypatch, capsys):
    import app.__main__ as studio_main

    monkeypatch.delenv("LLDS_MEMORY_BUDGET_GB", raising=False)

    def capacity_of(*argv: str):
        args = studio_main.parse_args(["--model", "nano", "--device", "cpu", *argv])
        return studio_main.studio_capacity(args, studio_main.studio_plan(args)[1])

    assert capacity_of() is None  # loopback: the operator loads what they like
    assert capacity_of("--host", "0.0.0.0") == Capacity("cpu", None)  # exposed: measured
    assert capacity_of("--host", "0.0.0.0", "--backend", "openai") is None  # runs elsewhere
    monkeypatch.setenv("LLDS_MEMORY_BUDGET_GB", "1.5")
    assert capacity_of() == Capacity("cpu", int(1.5 * GB))
    monkeypatch.setenv("LLDS_MEMORY_BUDGET_GB", "lots")
    with pytest.raises(SystemExit) as stop:
        capacity_of()
    assert stop.value.code == 2
    assert "'lots' is not a memory size in GB" in capsys.readouterr().err


# ------------------------------------------------------------- GGUFs (llama.cpp, on the CPU)

def test_the_3b_checkpoints_are_listed_as_q4_k_m_ggufs_too():
    from agent.models import ModelRef, default_pair, gguf_id, is_gguf, registry, resolve

    listed = [m.id for m in registry() if m.quantized]
    assert listed == [f"{LLDS_3B}:q4_k_m", f"{GRPO_3B}:q4_k_m"]
    ref = ModelRef(f" {LLDS_3B}:q4_k_m ")
    assert (ref, ref.checkpoint, ref.gguf_type) == (f"{LLDS_3B}:q4_k_m", LLDS_3B, "q4_k_m")
    assert ref.checkpoint.gguf_type is None and ref.checkpoint.checkpoint is ref.checkpoint
    plain = ModelRef("owner/name:latest")  # not a GGUF type: the whole name is the checkpoint
    assert (plain.checkpoint, plain.gguf_type) == ("owner/name:latest", None)
    assert ModelRef(ref) is ref and {ref: 1}[f"{LLDS_3B}:q4_k_m"] == 1  # a key as the name
    assert is_gguf("nano:f16") and is_gguf("/models/x/model.gguf") and not is_gguf(LLDS_3B)
    info = lookup("nano:q8_0")  # any registry id, listed or not
    assert info.quantized == "q8_0" and info.label.endswith(" · CPU q8_0")
    assert resolve("nano:q8_0") == "nano:q8_0"  # the loader converts it, not a directory
    # Beside a GGUF, Compare's other model is the 3B GRPO baseline as a GGUF of that type.
    assert default_pair(gguf_id(LLDS_3B)) == (f"{GRPO_3B}:q4_k_m", f"{LLDS_3B}:q4_k_m")


def test_a_gguf_takes_its_file_plus_the_kv_cache_in_ram():
    from app.capacity import GGUF_RUNTIME, gguf_need, kv_cache_bytes

    made = gguf_need(3_090_000_000, "q4_k_m", file=1_929_900_800, kv=226 * 2 ** 20,
                     downloaded=False)
    assert made.memory == 1_929_900_800 + 226 * 2 ** 20 + GGUF_RUNTIME and made.download == 0
    to_make = gguf_need(3_090_000_000, "q4_k_m", file=None, kv=None, downloaded=False)
    file = int(3_090_000_000 * 0.625)
    assert to_make.memory == file + int(file * 0.12) + GGUF_RUNTIME
    # The download (bf16), the f16 file it is made from, and itself.
    assert to_make.download == 3_090_000_000 * 2 + 3_090_000_000 * 2 + file
    assert misfit(to_make, Room(memory=16 * GB, disk=10 * GB)) == (
        "needs 13.3 GB of disk to download and convert, 10.0 GB free")
    assert misfit(to_make, Room(memory=2 * GB, disk=50 * GB)) == (
        "needs 2.3 GB of RAM (3.09B parameters in q4_k_m), 2.0 GB available")
    # The nano agent's config: 4 layers x (K and V) x 2 KV heads x 64 (256 / 4 heads) x 2 bytes.
    assert kv_cache_bytes("nano", 1) == 4 * 2 * 2 * 64 * 2


def test_on_a_cpu_the_pickers_offer_the_ggufs_and_a_gpu_machine_does_not(monkeypatch):
    import app.ui.context as context
    from app.ui.context import Studio

    pool = ModelPool(stand_in_factory([]), capacity=Capacity("cpu", 16 * GB))
    studio = Studio(pool=pool, retriever=None, default_model="nano")
    monkeypatch.setattr(context, "has_gpu", lambda: False)
    labels = dict((value, name) for name, value in studio.model_choices())
    assert labels[f"{LLDS_3B}:q4_k_m"] == f"{lookup(LLDS_3B).label} · CPU q4_k_m"
    assert "run by llama.cpp on the CPU" in lookup(f"{LLDS_3B}:q4_k_m").description
    monkeypatch.setattr(context, "has_gpu", lambda: True)
    assert f"{LLDS_3B}:q4_k_m" not in {value for _, value in studio.model_choices()}


def test_without_llama_cpp_a_gguf_is_listed_unavailable_saying_what_to_install(monkeypatch):
    import app.gguf_cache as gguf_cache

    real = gguf_cache.importlib.util.find_spec
    monkeypatch.setattr(gguf_cache.importlib.util, "find_spec",
                        lambda name: None if name == "llama_cpp" else real(name))
    pool = ModelPool(stand_in_factory([]))
    assert pool.hardware_problem(f"{LLDS_3B}:q4_k_m") == (
        "run by llama.cpp, which needs llama-cpp-python (pip install -r "
        "requirements-llamacpp.txt)")
    assert pool.hardware_problem(LLDS_3B) is None
