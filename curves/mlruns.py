"""MLflow's file store, read as plain files (mlflow itself is not needed).

    mlruns/<experiment id>/meta.yaml              the experiment (name, lifecycle_stage)
    mlruns/<experiment id>/<run id>/meta.yaml     the run (run_name, lifecycle_stage)
    .../<run id>/metrics/<key>                    one "timestamp value step" line per value
    .../<run id>/params/<key>, tags/<key>         one value per file (tags/mlflow.runName)

A key with slashes (`critic/score/mean`) is stored as nested folders. Within a metric file
a step logged twice keeps its later line.

Only regular files are read and no symlink is followed (a FIFO would block, a link could
point anywhere); params, tags and meta.yaml are read up to MAX_SIDE_BYTES; the metric
values are kept as cells, so 15,000 one-line metric files cost 15,000 values, not a
15,000 x 15,000 table.
"""

from __future__ import annotations

import os
import stat
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from curves.cells import (
    MAX_CELLS,
    Cells,
    OverBudgetError,
    read_side_file,
    too_many_cells_message,
)
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
    # What was not read (side files refused, keys left out of the table): for the user to see.
    warnings: list[str] = field(default_factory=list)


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

    data = read_side_file(path, label=str(path))
    if data is None:
        raise LogFormatError(f"{path} is missing: not an MLflow run folder")
    try:
        meta = yaml.safe_load(data.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise LogFormatError(f"{path} cannot be read as MLflow metadata ({exc})") from None
    if not isinstance(meta, dict):
        raise LogFormatError(f"{path} is not MLflow metadata (no key: value pairs)")
    return {str(k): "" if v is None else str(v) for k, v in meta.items()}


def _files_by_key(folder: Path, skipped: list[str] | None = None) -> dict[str, Path]:
    """Key -> regular file under a metrics/params/tags folder; nested folders join with
    '/'. Symlinks (to files or folders) and FIFOs are not listed; their keys go to
    `skipped`."""
    found: dict[str, Path] = {}

    def walk(directory: Path, prefix: str) -> None:
        try:
            entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
        except OSError:
            return
        for entry in entries:
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                walk(Path(entry.path), f"{prefix}{entry.name}/")
            elif stat.S_ISREG(mode):
                found[f"{prefix}{entry.name}"] = Path(entry.path)
            elif skipped is not None:
                kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
                skipped.append(f"{folder.name}/{prefix}{entry.name} is {kind} and was not read")

    if folder.is_dir() and not folder.is_symlink():
        walk(folder, "")
    return dict(sorted(found.items(), key=lambda item: item[1]))


def read_metric_file(path: Path, limit: int | None = None) -> tuple[array, array, int]:
    """Steps and values of one metric file in line order (a later line wins), and the
    number of lines that were not "timestamp value step". Regular files only, symlinks
    not followed. More than `limit` values raise OverBudgetError as soon as they are
    read (default: MAX_CELLS), not once the whole file is held."""
    limit = MAX_CELLS if limit is None else limit
    steps, values = array("q"), array("d")
    bad = 0
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with open(fd, encoding="utf-8", errors="replace") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return steps, values, 0
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
                steps.append(step)
                values.append(value)
                if len(steps) > limit:
                    raise OverBudgetError(too_many_cells_message())
            else:
                bad += 1
    return steps, values, bad


def metric_bytes(folder: Path) -> int:
    """Bytes in a run folder's metric files."""
    return sum(path.stat().st_size for path in _files_by_key(folder / "metrics").values())


def read_run(folder: Path) -> MlflowRun:
    meta = read_meta(folder / "meta.yaml")
    run_id = meta.get("run_id") or meta.get("run_uuid") or folder.name
    skipped: list[str] = []
    metric_files = _files_by_key(folder / "metrics", skipped)
    if len(metric_files) > MAX_METRIC_FILES:
        raise LogFormatError(f"{folder} holds {len(metric_files):,} metric files, over the "
                             f"limit of {MAX_METRIC_FILES:,}")
    size = metric_bytes(folder)
    if size > MAX_BYTES:
        raise LogFormatError(f"{folder}'s metric files add up to {size / 2**20:.0f} MB, over "
                             f"the {MAX_BYTES / 2**20:.0f} MB limit")
    cells = Cells()
    bad = 0
    for key, path in metric_files.items():
        try:
            steps, values, bad_lines = read_metric_file(path, cells.room())
        except OSError:
            continue  # replaced by a symlink or removed since it was listed
        bad += bad_lines
        if steps:
            cells.add_series(key, steps, values)
    notes: list[str] = skipped
    tags = _read_values(folder, "tags", notes)
    params = _read_values(folder, "params", notes)
    name = tags.get("mlflow.runName") or meta.get("run_name") or run_id
    # A later line replaces an earlier one at the same step, NaN or not.
    table, table_notes = cells.table(nan_wins=True) if len(cells) else (pd.DataFrame(), [])
    run = MlflowRun(run_id, name, folder, table, params, warnings=[*notes, *table_notes])
    if bad:
        run.notes.append(f"{bad} metric line(s) were not 'timestamp value step' and were "
                         "skipped")
    if meta.get("lifecycle_stage") == "deleted":
        run.notes.append("this run is marked deleted in MLflow")
    return run


def _read_values(folder: Path, kind: str, notes: list[str]) -> dict[str, str]:
    """Key -> value of a run's params or tags, each file read up to MAX_SIDE_BYTES; a file
    that is over it (or replaced by a symlink since it was listed) becomes a note."""
    values = {}
    skipped: list[str] = []
    files = _files_by_key(folder / kind, skipped)
    notes.extend(skipped)
    for key, path in files.items():
        try:
            data = read_side_file(path, label=f"{kind}/{key}")
        except LogFormatError as exc:
            notes.append(str(exc))
            continue
        if data is not None:
            values[key] = data.decode("utf-8", errors="replace").strip()
    return values


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
