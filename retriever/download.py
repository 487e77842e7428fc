"""`python -m retriever download wiki-18`: Search-R1's full-scale retrieval assets.

The plan (what to fetch, from where, into which files, how much disk it takes) is a pure
function of the sources file and what the directory already holds; fetching goes through
huggingface_hub (resumable, with progress) or, for BM25, pyserini's prebuilt-index
downloader. Offline, it stops before fetching anything and says what it would fetch.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

SOURCES = Path(__file__).resolve().parent.parent / "assets" / "wiki18_sources.json"
GB = 1e9


class DownloadError(ValueError):
    """A download that cannot go ahead; the message says why and what to do."""


@dataclass(frozen=True)
class Fetch:
    origin: str  # "hub" or "pyserini"
    repo: str  # hub repo id, or pyserini prebuilt index name
    name: str  # file name
    size: int
    present: bool
    url: str = ""  # pyserini: where its tarball is
    md5: str = ""


@dataclass(frozen=True)
class Step:
    part: str  # corpus, dense or bm25 (the prebuilt Lucene index)
    fetches: tuple[Fetch, ...]
    unpack: str  # gunzip, concatenate, pyserini
    output: Path
    extra_bytes: int  # disk the unpacking needs on top of the downloads
    done: bool

    @property
    def missing_bytes(self) -> int:
        return 0 if self.done else sum(f.size for f in self.fetches if not f.present)


def load_sources(path: Path = SOURCES) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def plan(name: str, engine: str, directory: Path, sources: dict | None = None) -> list[Step]:
    """What `download` would do, given what `directory` already holds."""
    sources = sources if sources is not None else load_sources()
    if name not in sources or name.startswith("_"):
        known = ", ".join(k for k in sources if not k.startswith("_"))
        raise DownloadError(f"Unknown data set {name!r}: choose one of {known}.")
    entry = sources[name]
    if engine not in ("dense", "lucene", "bm25"):
        raise DownloadError(f"--engine {engine!r}: choose dense or lucene.")
    # The prebuilt Lucene BM25 index (the sources' `bm25` entry) stores the documents: it
    # needs no separate corpus.
    parts = ["corpus", "dense"] if engine == "dense" else ["bm25"]
    steps = []
    for part in parts:
        spec = entry[part]
        if "pyserini_prebuilt" in spec:
            (file, size), = spec["files"].items()
            output = directory / file.removesuffix(".tar.gz")
            done = output.is_dir() and any(output.glob("segments_*"))
            fetch = Fetch("pyserini", spec["pyserini_prebuilt"], file, size, done,
                          spec["url"], spec["md5"])
            steps.append(Step(part, (fetch,), "pyserini", output, spec["output_bytes_estimate"],
                              done))
            continue
        output = directory / spec["output"]
        files = spec["files"]
        if spec["unpack"] == "concatenate":
            done = output.is_file() and output.stat().st_size == sum(files.values())
            extra = sum(list(files.values())[1:])  # the first part grows in place
        else:
            done = output.is_file()
            extra = spec["output_bytes_estimate"]
        fetches = tuple(Fetch("hub", spec["hub_repo"], f, size,
                              done or _complete(directory / f, size))
                        for f, size in files.items())
        steps.append(Step(part, fetches, spec["unpack"], output, 0 if done else extra, done))
    return steps


def _complete(path: Path, size: int) -> bool:
    return path.is_file() and path.stat().st_size == size and not _joining(path).exists()


def _joining(first_part: Path) -> Path:
    return first_part.with_name(first_part.name + ".joining")


def bytes_needed(steps: list[Step]) -> int:
    return sum(s.missing_bytes + s.extra_bytes for s in steps if not s.done)


def check_space(steps: list[Step], directory: Path, free: int | None = None) -> None:
    needed = bytes_needed(steps)
    if free is None:
        free = shutil.disk_usage(_existing_parent(directory)).free
    if needed > free:
        raise DownloadError(
            f"Not enough disk space in {directory}: this needs {needed / GB:.1f} GB "
            f"(downloads and unpacking) and {free / GB:.1f} GB is free. Free some space, or "
            "pass --dir on a bigger disk (a partial download there resumes).")


def _existing_parent(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def _origin_text(fetch: Fetch) -> str:
    if fetch.origin == "hub":
        from huggingface_hub import constants

        return f"{constants.ENDPOINT}/datasets/{fetch.repo} (Hugging Face Hub, dataset)"
    return f"pyserini prebuilt index {fetch.repo} ({fetch.url})"


def describe(steps: list[Step], directory: Path) -> str:
    lines = []
    for step in steps:
        if step.done:
            lines.append(f"  {step.part}: {step.output} is already there")
            continue
        for f in step.fetches:
            state = "already downloaded" if f.present else f"{f.size / GB:.1f} GB"
            lines.append(f"  {step.part}: {f.name} ({state}) from {_origin_text(f)}")
        lines.append(f"    then {step.unpack} into {step.output}")
    lines.append(f"  needs {bytes_needed(steps) / GB:.1f} GB free in {directory}")
    return "\n".join(lines)


def offline_reason(steps: list[Step], timeout: float = 5.0) -> str | None:
    """Why the sources cannot be reached now, or None. Never downloads anything."""
    origins = {f.origin for s in steps if not s.done for f in s.fetches if not f.present}
    if "hub" in origins:
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            return "HF_HUB_OFFLINE is set"
        reason = _unreachable(constants.ENDPOINT, timeout)
        if reason:
            return reason
    if "pyserini" in origins:
        for s in steps:
            if s.unpack == "pyserini" and not s.done:
                reason = _unreachable(s.fetches[0].url, timeout)
                if reason:
                    return reason
    return None


def _unreachable(url: str, timeout: float) -> str | None:
    import httpx

    if not url.startswith("http"):
        return f"no download address known ({url})"
    try:
        httpx.head(url, timeout=timeout, follow_redirects=False)
    except httpx.HTTPError as err:
        return f"{url} cannot be reached ({type(err).__name__}: {err})"
    return None


def gunzip(source: Path, target: Path) -> None:
    """Decompress to `target` (appears whole, or not at all), then drop the download."""
    partial = target.with_name(target.name + ".partial")
    with gzip.open(source, "rb") as zipped, partial.open("wb") as out:
        shutil.copyfileobj(zipped, out, 16 * 2**20)
    partial.replace(target)
    source.unlink()


def concatenate(parts: list[Path], target: Path) -> None:
    """Join the parts into `target` by appending the rest to the first, so the disk holds
    the parts plus no second copy. A marker file records the first part's own size: an
    interrupted join is cut back to it and redone."""
    first, marker = parts[0], _joining(parts[0])
    if marker.exists():
        with first.open("r+b") as f:
            f.truncate(json.loads(marker.read_text())["first_part_bytes"])
    else:
        marker.write_text(json.dumps({"first_part_bytes": first.stat().st_size}))
    with first.open("ab") as out:
        for part in parts[1:]:
            with part.open("rb") as src:
                shutil.copyfileobj(src, out, 16 * 2**20)
    first.replace(target)
    for part in parts[1:]:
        part.unlink()
    marker.unlink()


def fetch_all(steps: list[Step], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for step in steps:
        if step.done:
            continue
        if step.unpack == "pyserini":
            _fetch_pyserini(step, directory)
            continue
        from huggingface_hub import hf_hub_download

        for f in step.fetches:
            if not f.present:
                print(f"fetching {f.name} from {f.repo} ({f.size / GB:.1f} GB)", flush=True)
                hf_hub_download(f.repo, f.name, repo_type="dataset", local_dir=directory)
        paths = [directory / f.name for f in step.fetches]
        print(f"{step.unpack} into {step.output}", flush=True)
        if step.unpack == "gunzip":
            gunzip(paths[0], step.output)
        else:
            concatenate(paths, step.output)


def _fetch_pyserini(step: Step, directory: Path) -> None:
    from retriever.pyserini_compat import load_lucene

    load_lucene()  # pyserini's modules need its Java set up first
    from pyserini.util import download_and_unpack_index

    fetch = step.fetches[0]
    download_and_unpack_index(fetch.url, index_directory=str(directory),
                              local_filename=fetch.name, md5=fetch.md5,
                              expected_size=fetch.size)


def serve_command(steps: list[Step], engine: str) -> str:
    outputs = {s.part: s.output for s in steps}
    if engine != "dense":
        return f"python -m retriever serve --engine lucene --index {outputs['bm25']}"
    return (f"python -m retriever serve --engine dense --corpus {outputs['corpus']} "
            f"--index {outputs['dense']} --mmap\n"
            "  (to serve within 16 GB, build a compressed index once: python -m retriever "
            f"compress --flat {outputs['dense']} --corpus {outputs['corpus']} --kind ivf-pq)")


def download(name: str, engine: str, directory: Path, dry_run: bool = False) -> list[Step]:
    directory = directory.expanduser()
    if directory.exists() and not directory.is_dir():
        raise DownloadError(f"--dir {directory} is a file; give a directory.")
    steps = plan(name, engine, directory)
    print(f"{name} for {engine} into {directory}:\n{describe(steps, directory)}", flush=True)
    if dry_run or all(s.done for s in steps):
        return steps
    reason = offline_reason(steps)
    if reason:
        raise DownloadError(f"Cannot download now: {reason}. It would fetch:\n"
                            f"{describe(steps, directory)}\nRun it again where the sources "
                            "can be reached (a partial download resumes), or copy the files "
                            f"into {directory} by hand.")
    check_space(steps, directory)
    fetch_all(steps, directory)
    return steps


def default_dir() -> Path:
    from retriever.corpus import cache_dir

    return Path(os.environ.get("RETRIEVER_DATA_DIR") or cache_dir() / "wiki-18")
