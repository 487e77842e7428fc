"""The LLDS paper's published EM table (assets/paper_results.json), matched to a model."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

PAPER_RESULTS_PATH = Path(__file__).resolve().parent.parent / "assets" / "paper_results.json"


@cache
def _paper_file(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def load_paper_results(path: str | Path = PAPER_RESULTS_PATH) -> dict[str, Any]:
    """The published EM table (assets/paper_results.json)."""
    return _paper_file(str(path))


def paper_row(model: str | None, paper: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The paper's row for a model id or local path, when it is a known checkpoint.

    A local path matches by its last component, so `/models/LLDS-A-GRPO-Qwen2.5-7B-Base`
    finds `SEGAgentRL/LLDS-A-GRPO-Qwen2.5-7B-Base`.
    """
    if not model:
        return None
    paper = paper if paper is not None else load_paper_results()
    wanted = model.strip().rstrip("/").lower()
    tail = wanted.rsplit("/", 1)[-1]
    for row in paper["rows"]:
        for model_id in row.get("model_ids", []):
            known = model_id.lower()
            if wanted == known or tail == known.rsplit("/", 1)[-1]:
                return row
    return None


def paper_mean(row: Mapping[str, Any], names: Sequence[str]) -> float | None:
    values = [row["em"][n] for n in names if n in row["em"]]
    return sum(values) / len(values) if values else None


# ---------------------------------------------------------------------------- comparability

# The paper's setting: e5-base-v2 over wiki-18 (a flat FAISS index), top-3 documents,
# greedy decoding, up to 4 actions, each benchmark's full test split (dev where none).
PAPER_ENCODER = "intfloat/e5-base-v2"
WIKI18_PASSAGES = 21_015_324  # the DPR 100-word passages of the December 2018 Wikipedia
PAPER_AGENT = {"topk": 3, "max_turns": 4, "greedy": True}
PAPER_RETRIEVER = f"{PAPER_ENCODER} over wiki-18 ({WIKI18_PASSAGES:,} passages, flat index)"


def _passages(count: Any) -> str:
    return f"{count:,} passages" if isinstance(count, int) else "an unknown number of passages"


def retriever_differences(retriever: Mapping[str, Any] | None) -> list[str]:
    """How one provenance entry's retriever differs from the paper's (empty: it matches)."""
    if not isinstance(retriever, Mapping):
        return ["retriever: not recorded (the run has no provenance); the paper used "
                f"{PAPER_RETRIEVER}"]
    if "url" in retriever:
        health = retriever.get("health") if isinstance(retriever.get("health"), Mapping) else {}
        url = retriever["url"]
        out = []
        if health.get("engine") not in (None, "dense"):
            out.append(f"retriever: the server at {url} runs {health['engine']}, not "
                       f"{PAPER_ENCODER}")
        if isinstance(health.get("num_docs"), int) and health["num_docs"] != WIKI18_PASSAGES:
            out.append(f"retriever: the server at {url} serves {_passages(health['num_docs'])}"
                       f"; wiki-18 has {WIKI18_PASSAGES:,}")
        if not out and not retriever.get("stated"):
            out.append(f"retriever: the server at {url} does not say it serves "
                       f"{PAPER_RETRIEVER} (if it does, run with --paper-retriever)")
        return out
    engine, documents = retriever.get("engine"), retriever.get("documents")
    corpus = retriever.get("corpus") or {}
    where = f"{engine} over {corpus.get('name', 'its index')} ({_passages(documents)})"
    problems = []
    if engine != "dense":
        problems.append(f"engine {engine}")
    elif retriever.get("encoder") not in (None, PAPER_ENCODER):
        problems.append(f"encoder {retriever['encoder']}")
    if engine == "dense" and retriever.get("pooling") not in (None, "mean"):
        problems.append(f"{retriever['pooling']} pooling (e5: mean)")
    if engine == "dense" and retriever.get("query_prefix") not in (None, "query: "):
        problems.append(f"query prefix {retriever['query_prefix']!r} (e5: 'query: ')")
    if documents != WIKI18_PASSAGES:
        problems.append("not wiki-18")
    label = str((retriever.get("details") or {}).get("index", ""))
    if engine == "dense" and label and "(flat" not in label:
        problems.append(f"an approximate index ({label})")
    if not problems:
        return []
    return [f"retriever: {where}: {', '.join(problems)}; the paper used {PAPER_RETRIEVER}"]


def run_differences(settings: Mapping[str, Any]) -> list[str]:
    """How a run's settings differ from the paper's setting, one phrase per difference
    (empty: the run as a whole matches; each dataset is checked by `dataset_differences`)."""
    out = []
    entries = settings.get("provenance")
    entries = [e for e in entries if isinstance(e, Mapping)] if isinstance(entries, list) else []
    seen: list[str] = []
    for entry in entries or [{}]:
        for difference in retriever_differences(entry.get("retriever")):
            if difference not in seen:
                seen.append(difference)
    out += seen
    for key, value in PAPER_AGENT.items():
        if settings.get(key) != value:
            shown = "sampled" if key == "greedy" else settings.get(key)
            wanted = "greedy" if key == "greedy" else value
            out.append(f"{key} {shown} (the paper: {wanted})")
    if settings.get("limit") is not None:
        out.append(f"the first {settings['limit']} questions per dataset, not the full split")
    elif settings.get("sample") is not None:
        out.append(f"a sample of {settings['sample']} questions per dataset, not the full "
                   "split")
    return out


def dataset_differences(name: str, settings: Mapping[str, Any], stats: Mapping[str, Any],
                        split: str | None, size: int | None) -> list[str]:
    """How one dataset's results differ from the paper's full split: the split loaded,
    the number of questions, and whether every one was scored. `split`/`size`: the
    published split and its size."""
    out = []
    loaded = None
    for entry in settings.get("provenance") or []:
        data = entry.get("data") if isinstance(entry, Mapping) else None
        if isinstance(data, Mapping) and isinstance(data.get(name), Mapping):
            loaded = data[name].get("split") or loaded
    if split is not None and loaded is not None and loaded != split:
        out.append(f"{name}: the {loaded} split (the paper: {split})")
    expected = stats.get("expected")
    full = settings.get("limit") is None and settings.get("sample") is None
    if full and size is not None and expected is not None and expected != size:
        out.append(f"{name}: {expected:,} questions; the full {split} split has {size:,}")
    elif not stats.get("complete", False):
        scored = f"{stats.get('n', 0):,}" + (f" of {expected:,}" if expected else "")
        out.append(f"{name}: {scored} questions scored (the run is not finished)")
    return out
