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
