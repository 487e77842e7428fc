"""Where a run's numbers come from, recorded in its settings.json so they can be cited:
the model (hub id and commit, or a content hash of a local directory's weights), the
studio (version, git commit), the package versions, the device, the retriever (engine,
corpus and index with their content hashes, or a server's URL and what its /health says)
and the date.

The adapter that looks at files, git, installed packages and servers; `collect` is what the
CLI calls once the model has loaded. Content hashes are SHA-256 of the bytes, read in
chunks, computed once per file and kept in `<cache dir>/file-hashes.json` keyed by path,
size and modification time, so a 60 GB index is read once, not per run.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HASH_CACHE = "file-hashes.json"
# Weight files of a model directory: what its content hash covers.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")
# Sizes above which hashing says what it is doing (it happens once per file).
LOUD_BYTES = 2**30
_CHUNK = 4 * 2**20


# ---------------------------------------------------------------------------- hashing


def _hash_cache_path() -> Path:
    from retriever.corpus import cache_dir

    return cache_dir() / HASH_CACHE


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, streamed; cached by resolved path, size and mtime."""
    path = Path(path).resolve()
    stat = path.stat()
    key = str(path)
    cache_path = _hash_cache_path()
    cache = _read_cache(cache_path)
    known = cache.get(key)
    if isinstance(known, dict) and known.get("size") == stat.st_size \
            and known.get("mtime_ns") == stat.st_mtime_ns and isinstance(known.get("sha256"), str):
        return known["sha256"]
    if stat.st_size > LOUD_BYTES:
        print(f"note: hashing {path} ({stat.st_size / 1e9:.1f} GB) for the run's provenance; "
              "once: the hash is cached", file=sys.stderr)
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    value = digest.hexdigest()
    cache = _read_cache(cache_path)  # another process may have added entries meanwhile
    cache[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": value}
    try:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        temporary = cache_path.with_name(f".{cache_path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(cache, indent=1) + "\n", encoding="utf-8")
        os.replace(temporary, cache_path)
    except OSError:
        pass  # a read-only cache costs only a second hash next time
    return value


def files_sha256(root: Path, files: Iterable[Path]) -> str:
    """One SHA-256 over several files: of the lines `<path under root> <file sha256>`,
    sorted by path (so it names the set of files and each one's bytes)."""
    lines = sorted(f"{f.relative_to(root).as_posix()} {file_sha256(f)}\n" for f in files)
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()


def path_sha256(path: str | Path) -> str | None:
    """A file's SHA-256, or a directory's over every file in it (`files_sha256`); None for
    a path that does not exist."""
    path = Path(path)
    if path.is_file():
        return file_sha256(path)
    if path.is_dir():
        return files_sha256(path, (f for f in path.rglob("*") if f.is_file()))
    return None


# ---------------------------------------------------------------------------- the model


def hub_revision(model_id: str, cache_dir: str | Path | None = None) -> str | None:
    """The commit of `model_id`'s snapshot in the local Hugging Face cache (what a load
    without network reads), or None when it is not cached."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(model_id, "config.json", cache_dir=cache_dir)
    except ValueError:  # not a repo id
        return None
    if not isinstance(found, str):
        return None
    match = re.search(r"[/\\]snapshots[/\\]([0-9a-f]{40})[/\\]", found)
    return match.group(1) if match else None


def model_identity(model: str, loaded_from: str, kind: str, *,
                   loaded_revision: str | None = None, base_url: str | None = None,
                   hub_cache: str | Path | None = None) -> dict[str, Any]:
    """The model as a citation needs it. `loaded_from` is what the backend opened (a
    shipped model's directory, a path or a hub id); `loaded_revision` the commit the
    loaded config reports, when it does."""
    if kind == "openai":
        return {"id": model, "source": "server", "base_url": base_url, "revision": None,
                "note": "weights served by the server; the revision is the server's"}
    directory = Path(loaded_from).expanduser()
    if directory.is_file() and directory.suffix in WEIGHT_SUFFIXES:  # a GGUF (llamacpp)
        return {"id": model, "source": "local", "path": str(directory.resolve()),
                "revision": None,
                "content_sha256": files_sha256(directory.parent, [directory]),
                "weight_files": 1}
    if directory.is_dir():
        weights = [f for f in sorted(directory.rglob("*"))
                   if f.is_file() and f.suffix in WEIGHT_SUFFIXES]
        return {"id": model, "source": "local", "path": str(directory.resolve()),
                "revision": None,
                "content_sha256": files_sha256(directory, weights) if weights else None,
                "weight_files": len(weights)}
    revision = loaded_revision or hub_revision(loaded_from, hub_cache)
    return {"id": model, "source": "hub", "revision": revision,
            **({} if revision else {"note": "revision unknown: not found in the local cache"})}


# ---------------------------------------------------------------------------- the studio


def _git_dir(root: Path) -> Path | None:
    dot = root / ".git"
    if dot.is_dir():
        return dot
    if dot.is_file():  # a worktree or submodule: "gitdir: PATH"
        text = dot.read_text(encoding="utf-8", errors="replace").strip()
        if text.startswith("gitdir:"):
            target = Path(text[len("gitdir:"):].strip())
            return target if target.is_absolute() else (root / target).resolve()
    return None


def git_commit(root: str | Path = ROOT) -> str | None:
    """The commit checked out at `root`, read from its .git files (no git program needed);
    None when `root` is not a git checkout."""
    git_dir = _git_dir(Path(root))
    if git_dir is None or not (git_dir / "HEAD").is_file():
        return None
    head = (git_dir / "HEAD").read_text(encoding="utf-8").strip()
    if not head.startswith("ref:"):
        return head or None
    ref = head[len("ref:"):].strip()
    common = git_dir
    if (git_dir / "commondir").is_file():  # a worktree keeps its branches in the main repo
        common = (git_dir / (git_dir / "commondir").read_text().strip()).resolve()
    for base in (git_dir, common):
        if (base / ref).is_file():
            return (base / ref).read_text(encoding="utf-8").strip()
    for base in (git_dir, common):
        packed = base / "packed-refs"
        if packed.is_file():
            for line in packed.read_text(encoding="utf-8").splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[1] == ref:
                    return parts[0]
    return None


def git_dirty(root: str | Path = ROOT) -> bool | None:
    """Whether tracked files differ from the commit (`git status`); None without git."""
    try:
        done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                              cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(done.stdout.strip()) if done.returncode == 0 else None


def studio_version(root: str | Path = ROOT) -> str | None:
    """The version in the checkout's pyproject.toml, else the installed package's."""
    pyproject = Path(root) / "pyproject.toml"
    try:
        return tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"]
    except (OSError, KeyError, ValueError):
        pass
    try:
        return importlib.metadata.version("llds-studio")
    except importlib.metadata.PackageNotFoundError:
        return None


def studio_identity(root: str | Path = ROOT) -> dict[str, Any]:
    commit = git_commit(root)
    out: dict[str, Any] = {"version": studio_version(root), "git_commit": commit}
    if commit is None:
        out["git_note"] = "not run from a git checkout: no commit to record"
    else:
        out["git_dirty"] = git_dirty(root)
    return out


def package_versions(names: Iterable[str]) -> dict[str, str | None]:
    """Installed versions (from package metadata; nothing is imported), Python's first."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def engine_packages(engine: str | None) -> tuple[str, ...]:
    """The packages an in-process engine's results depend on."""
    return {"lucene": ("pyserini",), "bm25s": ("bm25s",),
            "dense": ("faiss-cpu", "faiss-gpu")}.get(engine or "", ())


def device_name(backend: Any) -> str:
    """`cpu`, `mps`, `cuda: <GPU name>`, or the server that ran the model."""
    if getattr(backend, "name", "") == "openai":
        return f"served by {getattr(backend, 'base_url', '?')}"
    device = str(getattr(backend, "device", "cpu"))
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            return f"cuda: {torch.cuda.get_device_name(0)}"
    return device


# ---------------------------------------------------------------------------- the retriever


def health_url(url: str) -> str:
    """The /health address beside a /retrieve address."""
    base = url.rstrip("/")
    if base.endswith("/retrieve"):
        base = base[: -len("/retrieve")]
    return base + "/health"


def server_identity(url: str, timeout: float = 5.0) -> dict[str, Any]:
    """A retrieval server: its URL and whatever its /health answers (Search-R1's own server
    has none: that is recorded too)."""
    import httpx

    out: dict[str, Any] = {"url": url}
    try:
        response = httpx.get(health_url(url), timeout=timeout)
        data = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError) as error:
        out["health"] = None
        out["health_note"] = f"no /health answer ({type(error).__name__})"
        return out
    if isinstance(data, dict):
        out["health"] = data
    else:
        out["health"] = None
        out["health_note"] = f"/health answered {response.status_code}"
    return out


def local_identity(engine_name: str, corpus: str | None, index: str | None,
                   engine: Any) -> dict[str, Any]:
    """An in-process engine: its name, the corpus file (path, size, SHA-256), the number of
    documents, the index (path and hash, or a prebuilt index's name) and, for the dense
    engine, the encoder."""
    from retriever.corpus import resolve_corpus

    out: dict[str, Any] = {"engine": engine_name, "documents": getattr(engine, "num_docs", None)}
    if engine_name == "lucene" and index:
        out["corpus"] = None  # the index carries its documents
    else:
        path = resolve_corpus(corpus)
        out["corpus"] = {"name": corpus or "default", "path": str(path.resolve()),
                         "bytes": path.stat().st_size, "sha256": file_sha256(path)}
    index_path = getattr(engine, "index_path", None)
    if index_path is not None:
        out["index"] = {"path": str(Path(index_path).resolve()),
                        "sha256": path_sha256(index_path)}
    elif index:
        out["index"] = {"name": index, "note": "a prebuilt index, named, not hashed"}
    else:
        out["index"] = None
    encoder = getattr(getattr(getattr(engine, "encoder", None), "model", None),
                      "name_or_path", None)
    if encoder:
        out["encoder"] = str(encoder)
        out["pooling"] = getattr(getattr(engine, "encoder", None), "pooling", None)
        out["query_prefix"] = getattr(engine, "query_prefix", None)
    details = getattr(engine, "details", None)
    if isinstance(details, dict) and details:
        out["details"] = details
    return out


# ---------------------------------------------------------------------------- the data


def data_identity(name: str, data_dir: str | Path | None,
                  merged_parquet: str | Path | None) -> dict[str, Any]:
    """Where a benchmark's questions were read from: the file (path, split, SHA-256), or the
    Hub dataset and split (with its revision when the local cache knows it)."""
    from evaluator.benchmarks import (
        BENCHMARKS,
        HUB_DATASET,
        LOCAL_BENCHMARKS,
        local_candidates,
    )

    if merged_parquet is not None:
        path = Path(merged_parquet)
        return {"source": "merged parquet", "path": str(path.resolve()), "split": None,
                "sha256": file_sha256(path) if path.is_file() else None}
    if data_dir is None and name in LOCAL_BENCHMARKS:
        data_dir = LOCAL_BENCHMARKS[name]
    if data_dir is not None:
        for path in local_candidates(Path(data_dir), name):
            if path.is_file():
                split = path.stem if path.parent.name == name else None
                return {"source": "file", "path": str(path.resolve()), "split": split,
                        "sha256": file_sha256(path)}
        return {"source": "file", "path": None, "split": None}
    split = BENCHMARKS[name].split if name in BENCHMARKS else None
    return {"source": "hub", "dataset": HUB_DATASET, "config": name, "split": split}


# ---------------------------------------------------------------------------- one entry


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def collect(args: Any, backend: Any, retriever: Any, datasets: Iterable[str] = ()
            ) -> dict[str, Any]:
    """The provenance of a CLI run session: `session_entry` from the CLI's flags."""
    return session_entry(args.model, args.backend, backend, retriever, datasets,
                         base_url=args.base_url, data_dir=args.data_dir,
                         merged_parquet=args.merged_parquet,
                         paper_retriever=getattr(args, "paper_retriever", False))


def session_entry(model_name: str, kind: str, backend: Any, retriever: Any,
                  datasets: Iterable[str] = (), *, base_url: str | None = None,
                  data_dir: str | None = None, merged_parquet: str | None = None,
                  paper_retriever: bool = False) -> dict[str, Any]:
    """The provenance of one run session (the CLI's or the Evaluate tab's): the model as
    named and as loaded, the retriever (an HTTP server's /health, or the in-process engine,
    opened here as its first search would), the packages, the device and the data read."""
    from agent.models import resolve
    from retriever.engine import canonical_engine

    config = getattr(getattr(backend, "model", None), "config", None)
    model = model_identity(model_name, resolve(model_name), kind,
                           loaded_revision=getattr(config, "_commit_hash", None),
                           base_url=base_url)
    packages = ["torch", "transformers"]
    if kind == "openai":
        packages.append("openai")
    if kind == "llamacpp":
        packages += ["llama-cpp-python", "gguf"]
    if getattr(retriever, "url", None):
        found = server_identity(retriever.url)
        if paper_retriever:
            found["stated"] = "e5-base-v2 over wiki-18 (stated with --paper-retriever)"
    elif isinstance(getattr(retriever, "spec", None), dict):
        spec = retriever.spec
        engine = canonical_engine(spec["engine"])
        packages += [p for p in engine_packages(engine)]
        found = local_identity(engine, spec["corpus"], spec["index"], retriever.engine)
    else:  # a retriever of the caller's own making: say so rather than guess what it is
        found = {"kind": type(retriever).__name__,
                 "note": "not one the studio opens (no server URL, no engine spec)"}
    versions = package_versions(packages)
    return {"date": now(), "model": model, "studio": studio_identity(),
            "packages": {k: v for k, v in versions.items() if v is not None
                         or k in ("torch", "transformers")},
            "device": device_name(backend), "retriever": found,
            "data": {name: data_identity(name, data_dir, merged_parquet)
                     for name in datasets}}
