"""MLflow's file store, read as plain files (mlflow itself is not needed).

    mlruns/<experiment id>/meta.yaml              the experiment (name, lifecycle_stage)
    mlruns/<experiment id>/<run id>/meta.yaml     the run (run_name, lifecycle_stage)
    .../<run id>/metrics/<key>                    one "timestamp value step" line per value
    .../<run id>/params/<key>, tags/<key>         one value per file (tags/mlflow.runName)

A key with slashes (`critic/score/mean`) is stored as nested folders. Within a metric file
a step logged twice keeps its later line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from curves.parse import MAX_BYTES, STEP_RANGE, LogFormatError

MAX_METRIC_FILES = 20_000


@dataclass
class MlflowRun:
    run_id: str
    name: str
    folder: Path
    table: pd.DataFrame
    params: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def is_run_folder(folder: Path) -> bool:
    return (folder / "meta.yaml").is_file() and (folder / "metrics").is_dir()


def is_experiment_folder(folder: Path) -> bool:
    # Its own meta.yaml is not required: the runs are what is read.
    return any(is_run_folder(child) for child in _subfolders(folder))


def is_store_root(folder: Path) -> bool:
    return any(is_experiment_folder(child) for child in _subfolders(folder))


def _subfolders(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def read_meta(path: Path) -> dict[str, str]:
    """Top-level `key: value` pairs of an MLflow meta.yaml, as strings."""
    import yaml

    try:
        meta = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise LogFormatError(f"{path} cannot be read as MLflow metadata ({exc})") from None
    if not isinstance(meta, dict):
        raise LogFormatError(f"{path} is not MLflow metadata (no key: value pairs)")
    return {str(k): "" if v is None else str(v) for k, v in meta.items()}


def _files_by_key(folder: Path) -> dict[str, Path]:
    """Key -> file under a metrics/params/tags folder; nested folders join with '/'."""
    if not folder.is_dir():
        return {}
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}


def read_metric_file(path: Path) -> tuple[dict[int, float], int]:
    """step -> value of one metric file, and the number of lines that were not
    "timestamp value step"."""
    values: dict[int, float] = {}
    bad = 0
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            parts = line.split()
            if not parts:
                continue
            try:
                value = float(parts[1])
                step = int(parts[2]) if len(parts) > 2 else 0  # MLflow < 1.0 wrote no step
            except (IndexError, ValueError):
                bad += 1
                continue
            if STEP_RANGE[0] <= step < STEP_RANGE[1]:
                values[step] = value
            else:
                bad += 1
    return values, bad


def metric_bytes(folder: Path) -> int:
    """Bytes in a run folder's metric files."""
    return sum(path.stat().st_size for path in _files_by_key(folder / "metrics").values())


def read_run(folder: Path) -> MlflowRun:
    meta = read_meta(folder / "meta.yaml")
    run_id = meta.get("run_id") or meta.get("run_uuid") or folder.name
    metric_files = _files_by_key(folder / "metrics")
    if len(metric_files) > MAX_METRIC_FILES:
        raise LogFormatError(f"{folder} holds {len(metric_files):,} metric files, over the "
                             f"limit of {MAX_METRIC_FILES:,}")
    size = metric_bytes(folder)
    if size > MAX_BYTES:
        raise LogFormatError(f"{folder}'s metric files add up to {size / 2**20:.0f} MB, over "
                             f"the {MAX_BYTES / 2**20:.0f} MB limit")
    columns: dict[str, dict[int, float]] = {}
    bad = 0
    for key, path in metric_files.items():
        values, skipped = read_metric_file(path)
        bad += skipped
        if values:
            columns[key] = values
    tags = {key: _read_value(path) for key, path in _files_by_key(folder / "tags").items()}
    params = {key: _read_value(path) for key, path in _files_by_key(folder / "params").items()}
    name = tags.get("mlflow.runName") or meta.get("run_name") or run_id
    table = pd.DataFrame(columns)
    run = MlflowRun(run_id, name, folder, table, params)
    if bad:
        run.notes.append(f"{bad} metric line(s) were not 'timestamp value step' and were "
                         "skipped")
    if meta.get("lifecycle_stage") == "deleted":
        run.notes.append("this run is marked deleted in MLflow")
    return run


def _read_value(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def run_folders(folder: Path) -> list[Path]:
    """The run folders under an MLflow store root, experiment folder or run folder, skipping
    deleted experiments (MLflow moves them to .trash)."""
    if is_run_folder(folder):
        return [folder]
    if is_experiment_folder(folder):
        return [child for child in _subfolders(folder) if is_run_folder(child)]
    found = []
    for experiment in _subfolders(folder):
        if is_experiment_folder(experiment):
            found.extend(run_folders(experiment))
    return found
