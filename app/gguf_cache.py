"""GGUFs made on first use: a model named `ID:TYPE` (`agent.models.ModelRef`) is the
checkpoint ID converted by `app.quantize` to TYPE, kept in a cache, and run by the llama.cpp
backend on the CPU.

The cache is LLDS_GGUF_CACHE, else `<HF_HOME>/llds-gguf` (beside the checkpoints the files
are made from, so a Space's persistent storage keeps both). Each file is
`<cache>/<name>/<TYPE>/model.gguf`, written in a temporary folder beside it and renamed into
place when whole: a conversion stopped midway leaves no model.gguf, and the next use starts
it again. A file made from a directory (a shipped model, a local checkpoint) is made again
when that directory's files change (`source.json` records them); one made from a hub id is
kept as long as it is there (delete its folder to convert a newer revision).

What a conversion is doing (fetching, each tensor, quantizing) goes to the callback set for
the thread with `reporting` (the studio's model pool shows it on the status line).
"""

from __future__ import annotations

import contextvars
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from agent.backends.base import Backend, ModelLoadError
from agent.models import lookup, model_ref, resolve

INSTALL = "pip install -r requirements-llamacpp.txt"
_REPORT: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "gguf_progress", default=None)


@contextmanager
def reporting(callback: Callable[[str], None]) -> Iterator[None]:
    """Send what conversions in this thread do to `callback` while the block runs."""
    token = _REPORT.set(callback)
    try:
        yield
    finally:
        _REPORT.reset(token)


def report(line: str) -> None:
    callback = _REPORT.get()
    if callback is not None:
        callback(line)


def cache_dir() -> Path:
    if os.environ.get("LLDS_GGUF_CACHE"):
        return Path(os.environ["LLDS_GGUF_CACHE"]).expanduser()
    from huggingface_hub import constants

    return Path(constants.HF_HOME).expanduser() / "llds-gguf"


def folder_name(model: str) -> str:
    """The cache folder of a checkpoint: `owner--name` for a hub id or a registry id, the
    directory's name and a hash of its full path for any other directory."""
    if lookup(model) is not None or (model.count("/") == 1 and not Path(model).exists()):
        name = model.replace("/", "--")
    else:
        where = str(Path(model).expanduser().resolve())
        name = f"{Path(where).name}-{hashlib.sha1(where.encode()).hexdigest()[:10]}"
    if name in (".", "..") or "/" in name or "\\" in name or not name:
        raise ModelLoadError(f"{model!r} cannot name a GGUF cache folder.")
    return name


def gguf_path(model: str) -> Path:
    """Where the GGUF of `ID:TYPE` is (or will be) kept."""
    ref = model_ref(model)
    if ref.gguf_type is None:
        raise ModelLoadError(f"{model!r} names no GGUF type: write ID:q4_k_m (or :q8_0, :q4_0, "
                             ":iq4_nl, :f16).")
    return cache_dir() / folder_name(ref.checkpoint) / ref.gguf_type / "model.gguf"


def fingerprint(model: str) -> dict | None:
    """The files of a checkpoint directory (name, size, modification time); None for a hub
    id (its cached GGUF is trusted as is: checking would ask the Hub)."""
    directory = Path(resolve(model)).expanduser()
    if not directory.is_dir():
        return None
    return {"directory": str(directory.resolve()),
            "files": sorted([p.name, p.stat().st_size, p.stat().st_mtime_ns]
                            for p in directory.iterdir() if p.is_file())}


def cached(model: str) -> Path | None:
    """The GGUF of `ID:TYPE` when it is in the cache and still made from the checkpoint's
    present files; else None."""
    ref = model_ref(model)
    path = gguf_path(ref)
    if not path.is_file():
        return None
    source = fingerprint(ref.checkpoint)
    if source is None:
        return path
    try:
        recorded = json.loads((path.parent / "source.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return path if recorded == source else None


def runtime_problem() -> str | None:
    """Why GGUFs can't be made or run here (llama-cpp-python or gguf missing), or None."""
    missing = [name for name, module in (("llama-cpp-python", "llama_cpp"), ("gguf", "gguf"))
               if importlib.util.find_spec(module) is None]
    if missing:
        return f"needs {' and '.join(missing)} ({INSTALL})"
    return None


def ensure_gguf(model: str) -> Path:
    """The GGUF of `ID:TYPE`: from the cache, else converted now (progress to `report`)."""
    ref = model_ref(model)
    found = cached(ref)
    if found is not None:
        return found
    problem = runtime_problem()
    if problem:
        raise ModelLoadError(f"{model} is run by llama.cpp, which {problem}.")
    from app.quantize import ConversionError, convert

    base, kind = ref.checkpoint, ref.gguf_type
    target = gguf_path(ref)
    target.parent.mkdir(parents=True, exist_ok=True)
    source = fingerprint(base)
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        written = convert(base, work, kind, progress=report)
        if source is not None:
            (target.parent / "source.json").write_text(json.dumps(source), encoding="utf-8")
        os.replace(written.path, target)
    except ConversionError as err:
        raise ModelLoadError(f"{model} could not be converted to a GGUF: {err}") from err
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the folder this call made, and only it
    report(f"converted to {kind} in {time.perf_counter() - started:.0f} s "
           f"({target.stat().st_size / 1e9:.2f} GB); loading it")
    return target


def load_gguf(model: str) -> Backend:
    """The llama.cpp backend of `ID:TYPE` (converting it first when not in the cache), or
    of a .gguf file."""
    from agent.backends.llamacpp import LlamaCppBackend

    ref = model_ref(model)
    backend = LlamaCppBackend(str(ensure_gguf(ref) if ref.gguf_type is not None else ref))
    backend.model_id = str(model)
    return backend


def studio_loader(load: Callable[[str], Backend]) -> Callable[[str], Backend]:
    """`load` (the launch's backend), except that `ID:TYPE` names and .gguf files go to
    llama.cpp."""
    def loader(model: str) -> Backend:
        ref = model_ref(model)
        return load_gguf(ref) if ref.runs_on_llamacpp else load(ref)

    return loader
