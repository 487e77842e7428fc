"""Any path a user has: one log file (`curves.parse`), a W&B transaction log, or a folder.

Folders read here:
- a TensorBoard logdir: each folder holding event files is one run, named by its path
  relative to the logdir (the logdir's own name for files directly in it); a resumed run's
  several event files are merged oldest first, a later file's values winning at steps
  logged twice, cell by cell;
- a W&B run folder (`wandb/run-*/`, `wandb/offline-run-*/`) or the `wandb/` folder above
  several: history from `files/wandb-history.jsonl`, else the `run-*.wandb` log, else the
  captured console (`files/output.log`); config from `files/config.yaml` or the log; the
  run is named by its display name, else the config's experiment name, else the folder;
- an MLflow store (`mlruns/`, one experiment folder, or one run folder): `curves.mlruns`.

Only regular files are opened as logs (a FIFO named like one would block the read
forever); side files (config, summary, metadata) are read up to MAX_SIDE_BYTES and never
through a symlink, a refusal becoming a note. Runs merged from several files or folders
stay within the table budget (`curves.cells.merge_later_first`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from curves import mlruns
from curves.cells import OverBudgetError, is_regular_file, merge_later_first, read_side_file
from curves.parse import (
    MAX_BYTES,
    LogFormatError,
    ParsedFile,
    read_console,
    read_event_scalars,
    read_jsonl_log,
    read_log,
    rename_columns,
)
from curves.runs import TrainingRun, make_run, recognised_keys
from curves.wandb_log import is_wandb_log, read_wandb_log

MAX_FOLDER_FILES = 2000  # event files or run folders read from one folder
FOLDER_KINDS = ("Hugging Face / TRL output or checkpoint folder (trainer_state.json)",
                "TensorBoard logdir (events.out.tfevents.* files)",
                "W&B run folder (wandb/run-*/) or the wandb/ folder above it",
                "MLflow store (mlruns/, an experiment folder or a run folder)")
_EVENTS_PREFIX = "events.out.tfevents."
_WANDB_RUN_RE = re.compile(r"^(?:offline-)?run-\d{8}_\d{6}-([A-Za-z0-9]+)$")
# Config keys that name a run, most specific first (verl logs its whole config).
_NAME_KEYS = ("trainer.experiment_name", "experiment_name", "run_name", "name")


def read_source(path: str | os.PathLike, aliases: dict[str, str] | None = None) -> ParsedFile:
    """Read a log file, a `.wandb` transaction log, or a folder of logs (`aliases`: columns
    to read under a recognised name, curves.runs.column_aliases)."""
    p = Path(path)
    if p.is_dir():
        return read_folder(p, aliases)
    if p.is_file() and p.stat().st_size and is_wandb_log(p):
        return _with_known_metric(rename_columns(_read_wandb_run(p.parent, wandb_file=p),
                                                 aliases))
    parsed = read_log(p, aliases=aliases)
    folder = _wandb_run_of_file(p)
    if folder is not None:
        name = _wandb_run_name(folder, display_name="")
        for i, run in enumerate(parsed.runs):
            run.name = name if i == 0 else f"{name} #{i + 1}"
    return parsed


def trainer_state_of(folder: Path) -> Path | None:
    """The trainer_state.json a Trainer folder holds: its own, else its latest
    `checkpoint-N/`'s (each checkpoint's log_history holds every earlier record)."""
    own = folder / "trainer_state.json"
    if own.is_file():
        return own
    steps = [(int(p.name.split("-", 1)[1]), p) for p in _subfolders(folder)
             if re.fullmatch(r"checkpoint-\d+", p.name) and (p / "trainer_state.json").is_file()]
    return max(steps)[1] / "trainer_state.json" if steps else None


def read_folder(folder: Path, aliases: dict[str, str] | None = None) -> ParsedFile:
    state = trainer_state_of(folder)
    if state is not None:
        return read_log(state, aliases=aliases)
    if mlruns.is_run_folder(folder) or mlruns.is_experiment_folder(folder) or \
            mlruns.is_store_root(folder):
        return _with_known_metric(rename_columns(read_mlruns(folder), aliases))
    if _is_wandb_run(folder):
        return _with_known_metric(rename_columns(_read_wandb_run(folder), aliases))
    wandb_runs = [child for child in _subfolders(folder) if _is_wandb_run(child)]
    if wandb_runs:
        return _with_known_metric(rename_columns(_read_wandb_runs(folder, wandb_runs),
                                                 aliases))
    if next(_event_files(folder), None) is not None:
        return _with_known_metric(rename_columns(read_tensorboard_logdir(folder), aliases))
    raise LogFormatError("this folder holds no training log we read; folders we read: "
                         + "; ".join(FOLDER_KINDS) + ". For another log, pass the file itself")


def _with_known_metric(parsed: ParsedFile) -> ParsedFile:
    keys = sorted({key for run in parsed.runs for key in run.table.columns})
    if not keys:
        raise LogFormatError("no metric values found in this folder"
                             + (f" ({'; '.join(parsed.notes)})" if parsed.notes else ""))
    if not recognised_keys(keys):
        shown = ", ".join(keys[:25]) + (f", ... ({len(keys) - 25} more)" if len(keys) > 25
                                         else "")
        raise LogFormatError("no recognised training metric (e.g. critic/score/mean or "
                             "reward, kl, entropy, actor/pos_avg_old_log_prob); keys found: "
                             f"{shown}. Name yours under \"Your own column names\" (e.g. "
                             "reward=my_score)")
    return parsed


def _subfolders(folder: Path) -> list[Path]:
    try:
        # Symlinks are skipped: wandb/latest-run points at a run already listed.
        return sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError as exc:
        raise LogFormatError(f"cannot list the folder ({exc.strerror or exc})") from None


def _check_budget(paths: list[Path], what: str, size: int | None = None) -> None:
    """At most MAX_FOLDER_FILES paths, and MAX_BYTES in all (the files' sizes, or `size`
    for folders)."""
    if len(paths) > MAX_FOLDER_FILES:
        raise LogFormatError(f"the folder holds {len(paths):,} {what}, over the limit of "
                             f"{MAX_FOLDER_FILES:,}; pass the run folders you want one by one")
    if size is None:
        size = sum(p.stat().st_size for p in paths)
    if size > MAX_BYTES:
        raise LogFormatError(f"the folder's {what} add up to {size / 2**20:.0f} MB, over the "
                             f"{MAX_BYTES / 2**20:.0f} MB limit; pass fewer runs at a time")


# --------------------------------------------------------------------------- TensorBoard

def _event_files(folder: Path, skipped: list[Path] | None = None) -> Iterator[Path]:
    """Event files under `folder`, regular files only: TensorBoard's reader would block
    forever on a FIFO of that name. Others go to `skipped`."""
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            if name.startswith(_EVENTS_PREFIX):
                path = Path(root) / name
                if is_regular_file(path):
                    yield path
                elif skipped is not None:
                    skipped.append(path)


def _event_file_order(path: Path) -> tuple[int, int, str]:
    """events.out.tfevents.<unix seconds>.<host>.<pid>.<n>: the writer's start time, then
    the writer's number within its process."""
    parts = path.name[len(_EVENTS_PREFIX):].split(".")
    stamp, count = parts[0], parts[-1] if len(parts) > 1 else ""
    return (int(stamp) if stamp.isdigit() else 0, int(count) if count.isdigit() else 0,
            path.name)


def read_tensorboard_logdir(logdir: Path) -> ParsedFile:
    skipped: list[Path] = []
    files = list(_event_files(logdir, skipped))
    _check_budget(files, "event files")
    by_folder: dict[Path, list[Path]] = {}
    for path in files:
        by_folder.setdefault(path.parent, []).append(path)
    runs: list[TrainingRun] = []
    notes: list[str] = [f"{path.relative_to(logdir).as_posix()} is not a regular file (a pipe "
                        "or device?) and was skipped" for path in skipped]
    bad = 0
    for folder, paths in by_folder.items():
        relative = folder.relative_to(logdir).as_posix()
        name = logdir.resolve().name if relative == "." else relative
        table: pd.DataFrame | None = None
        run_notes: list[str] = []
        for path in sorted(paths, key=_event_file_order):
            try:
                part, part_notes, part_bad = read_event_scalars(str(path))
            except OverBudgetError as exc:
                raise OverBudgetError(f"{name}/{path.name}: {exc}") from None
            except LogFormatError:
                continue  # a writer that logged no scalars (TensorBoard opens one per start)
            bad += part_bad
            notes.extend(f"{name}/{path.name}: {note}" for note in part_notes)
            if table is None:
                table = part
                continue
            overlap = table.index.intersection(part.index)
            text = f"resumed at step {part.index.min()} ({path.name})"
            if len(overlap):
                text += (f"; steps {overlap.min()}-{overlap.max()} were logged twice, the later "
                         "file's values are kept")
            run_notes.append(text)
            table, merge_notes = merge_later_first(part, table)
            notes.extend(f"{name}: {note}" for note in merge_notes)
        if table is not None:
            runs.append(make_run(name, table, str(folder), "tensorboard", run_notes))
    if not runs:
        raise LogFormatError("the TensorBoard logdir's event files hold no scalar values")
    return ParsedFile(str(logdir), "tensorboard", runs, bad, notes)


# --------------------------------------------------------------------------- W&B folders

def _is_wandb_run(folder: Path) -> bool:
    return bool(_WANDB_RUN_RE.match(folder.name)) or bool(_wandb_logs(folder)) or (
        folder / "files" / "wandb-history.jsonl").is_file()


def _wandb_logs(folder: Path) -> list[Path]:
    """The folder's run-*.wandb files that are regular files (a FIFO would block)."""
    return sorted(path for path in folder.glob("run-*.wandb") if is_regular_file(path))


def _wandb_run_of_file(path: Path) -> Path | None:
    """The W&B run folder a file sits in (run-*/files/output.log), if any."""
    parent = path.resolve().parent
    if parent.name == "files" and _is_wandb_run(parent.parent):
        return parent.parent
    return None


def _flatten(value: object, prefix: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _flatten(inner, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), str(value)


def _side_file(path: Path, notes: list[str] | None) -> bytes | None:
    """read_side_file, a refusal becoming a note (the run is still read without it)."""
    try:
        return read_side_file(path, label=f"{path.parent.name}/{path.name}")
    except LogFormatError as exc:
        if notes is not None:
            notes.append(str(exc))
        return None


def _wandb_config(folder: Path, notes: list[str] | None = None) -> dict[str, str]:
    """files/config.yaml, flattened: W&B stores each key as {desc, value}."""
    data = _side_file(folder / "files" / "config.yaml", notes)
    if data is None:
        return {}
    import yaml

    try:
        raw = yaml.safe_load(data.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError, RecursionError):  # nested past the limit
        return {}
    if not isinstance(raw, dict):
        return {}
    config = {key: entry["value"] if isinstance(entry, dict) and "value" in entry else entry
              for key, entry in raw.items()
              if not str(key).startswith("_") and key != "wandb_version"}
    return dict(_flatten(config))


def _wandb_run_name(folder: Path, display_name: str, config: dict[str, str] | None = None,
                    fallback: str | None = None) -> str:
    """The display name, else the config's experiment name, else the metadata's name, else
    `fallback` (default: the folder's name)."""
    if display_name:
        return display_name
    config = _wandb_config(folder) if config is None else config
    for key in _NAME_KEYS:
        if config.get(key):
            return config[key]
    metadata = _json_object(folder / "files" / "wandb-metadata.json")
    for key in ("display_name", "name"):
        if isinstance(metadata.get(key), str) and metadata[key]:
            return metadata[key]
    return folder.resolve().name if fallback is None else fallback


def _json_object(path: Path, notes: list[str] | None = None) -> dict:
    data = _side_file(path, notes)
    if data is None:
        return {}
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):  # a bad side file: the run stays
        return {}
    return value if isinstance(value, dict) else {}


def _wandb_log_bytes(folder: Path) -> int:
    """Bytes of the files a W&B run folder's history may be read from."""
    files = [folder / "files" / "wandb-history.jsonl", folder / "files" / "output.log",
             *_wandb_logs(folder)]
    return sum(path.stat().st_size for path in files if path.is_file())


def _read_wandb_runs(root: Path, folders: list[Path]) -> ParsedFile:
    """Every run folder under `root`; a resumed run (several folders, one run id, named
    run-<date>_<time>-<id>) becomes one run, its later folder winning at shared steps."""
    _check_budget(folders, "run folders", size=sum(map(_wandb_log_bytes, folders)))
    runs: list[TrainingRun] = []
    notes: list[str] = []
    by_id: dict[str, TrainingRun] = {}
    for folder in folders:  # sorted by name: by start time for each run id
        try:
            parsed = _read_wandb_run(folder)
        except LogFormatError as exc:
            notes.append(f"{folder.name}: {exc}")
            continue
        notes.extend(f"{folder.name}: {note}" for note in parsed.notes)
        match = _WANDB_RUN_RE.match(folder.name)
        earlier = by_id.get(match.group(1)) if match and len(parsed.runs) == 1 else None
        if earlier is None:
            runs.extend(parsed.runs)
            if match and len(parsed.runs) == 1:
                by_id[match.group(1)] = parsed.runs[0]
            continue
        later = parsed.runs[0]
        overlap = earlier.table.index.intersection(later.table.index)
        text = f"resumed at step {later.table.index.min()} ({folder.name})"
        if len(overlap):
            text += (f"; steps {overlap.min()}-{overlap.max()} were logged twice, the later "
                     "folder's values are kept")
        table, merge_notes = merge_later_first(later.table, earlier.table)
        notes.extend(f"{folder.name}: {note}" for note in merge_notes)
        merged = make_run(earlier.name, table,
                          earlier.source, earlier.source_format, [*earlier.notes, text],
                          params={**earlier.params, **later.params})
        runs[runs.index(earlier)] = merged
        by_id[match.group(1)] = merged
    if not runs:
        raise LogFormatError("no W&B run folder here could be read: " + "; ".join(notes))
    return ParsedFile(str(root), "wandb-folder", runs, 0, notes)


def _read_wandb_run(folder: Path, wandb_file: Path | None = None) -> ParsedFile:
    files = folder / "files"
    history = files / "wandb-history.jsonl"
    notes: list[str] = []
    summary = _json_object(files / "wandb-summary.json", notes)
    config = _wandb_config(folder, notes)
    logs = [wandb_file] if wandb_file else _wandb_logs(folder)
    display_name = run_id = ""
    tables: list[pd.DataFrame] = []
    source = str(folder)
    if wandb_file is None and history.is_file():
        _check_budget([history], "history files")
        parsed = read_jsonl_log(str(history))
        notes.extend(parsed.notes)
        tables = [run.table.drop(columns=[c for c in run.table.columns if c.startswith("_")])
                  for run in parsed.runs]
        source = str(history)
    elif logs:
        _check_budget(logs, ".wandb logs")
        log = read_wandb_log(logs[-1])
        notes.extend(log.notes)
        display_name, run_id = log.display_name, log.run_id
        if not config:
            config = dict(_flatten(log.config))
        if len(log.history):
            tables = [log.history]
        source = str(logs[-1])
    elif (files / "output.log").is_file():
        parsed = read_console(str(files / "output.log"))
        notes.extend(parsed.notes)
        tables = [run.table for run in parsed.runs]
        source = str(files / "output.log")
    # A .wandb file outside its run folder (an upload) falls back on its run id.
    fallback = None if wandb_file is None or _WANDB_RUN_RE.match(folder.name) else (
        run_id or wandb_file.stem)
    name = _wandb_run_name(folder, display_name, config, fallback)
    step = summary.get("_step")
    if not tables and isinstance(step, int) and not isinstance(step, bool):
        values = {key: float(v) for key, v in summary.items() if not key.startswith("_")
                  and isinstance(v, (int, float)) and not isinstance(v, bool)}
        if values:
            tables = [pd.DataFrame([values], index=[step])]
            notes.append("no history in this run folder: only the summary's final values "
                         f"(step {step}) are shown")
            source = str(files / "wandb-summary.json")
    if not tables:
        raise LogFormatError(f"the W&B run folder {folder.name} holds no history "
                             "(files/wandb-history.jsonl, run-*.wandb or files/output.log)")
    last = max(int(table.index.max()) for table in tables if len(table))
    if isinstance(step, int) and not isinstance(step, bool) and step > last:
        notes.append(f"the history stops at step {last} but the summary's last step is {step} "
                     "(was the history cut short?)")
    fmt = "verl-console" if source.endswith("output.log") else "wandb-folder"
    runs = [make_run(name if i == 0 else f"{name} #{i + 1}", table, source, fmt,
                     params=config) for i, table in enumerate(tables) if len(table)]
    return ParsedFile(source, fmt, runs, 0, notes)


# --------------------------------------------------------------------------- MLflow

def read_mlruns(folder: Path) -> ParsedFile:
    folders = mlruns.run_folders(folder)
    _check_budget(folders, "MLflow runs", size=sum(map(mlruns.metric_bytes, folders)))
    runs: list[TrainingRun] = []
    notes: list[str] = []
    refused: list[LogFormatError] = []
    for run_folder in folders:
        try:
            found = mlruns.read_run(run_folder)
        except LogFormatError as exc:
            refused.append(exc)
            notes.append(f"{run_folder.name}: {exc}" if isinstance(exc, OverBudgetError)
                         else str(exc))
            continue
        notes.extend(f"{found.name}: {note}" for note in found.warnings)
        if found.table.empty:
            notes.append(f"{found.name}: no metric values")
            continue
        runs.append(make_run(found.name, found.table, str(run_folder), "mlflow",
                             found.notes, params=found.params))
    if not runs:
        # Over a budget is a reason of its own, not "no values".
        what = "could be read" if any(isinstance(e, OverBudgetError) for e in refused) else \
            "has metric values"
        raise LogFormatError(f"no MLflow run here {what}"
                             + (f" ({'; '.join(notes)})" if notes else ""))
    return ParsedFile(str(folder), "mlflow", runs, 0, notes)
