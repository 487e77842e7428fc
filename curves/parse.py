"""Read training logs: verl console logs, W&B exports, JSON lines, CSV, TensorBoard events.

`read_log(path)` detects the format from the file's content (the name is only a tie-breaker),
streams it, and returns a `ParsedFile` holding one or more `TrainingRun`s. Every problem
with the input becomes a `LogFormatError` whose message says what was wrong and what to
do; lines that fail to parse are counted and reported instead of aborting the file.

Format detection and the readers live together because they share the step-segment
builder, the console-line patterns, the size guards and the error wording.

What a file decodes to is bounded, not only its size: the readers keep logged values as
cells and build each table within the budgets of `curves.cells` (values held, distinct
keys, table cells), lines longer than MAX_LINE_CHARS are skipped unread, and a CSV's rows
x columns are checked before pandas reads it.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import re
import stat
import struct
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO

import numpy as np
import pandas as pd

from curves.cells import (
    MAX_KEYS,
    MAX_TABLE_CELLS,
    Cells,
    LogFormatError,
    OverBudgetError,
)
from curves.runs import TrainingRun, make_run, recognised_keys

MAX_BYTES = 200 * 1024 * 1024
HEAD_BYTES = 64 * 1024
# A parquet file's size says nothing of what it holds: repeated values compress to almost
# nothing, and a dictionary stores a value once for any number of rows. Only fixed-width
# numeric columns are read, so their decoded size is rows x byte widths, known from the
# metadata before anything is read; that is what is capped.
MAX_PARQUET_BYTES = 80 * 2**20  # ~10k steps x 1,000 float64 metrics
MAX_PARQUET_COLUMNS = 20_000
# Steps are stored as int64: a step outside that range cannot index a row.
STEP_RANGE = (-(2**63), 2**63)
# A longer line is skipped unread: no log line is that long (MAX_KEYS keys fit in a tenth
# of it), and Python would otherwise hold a 200 MB one-line file, then its split pieces.
MAX_LINE_CHARS = 4 * 2**20
# Times the step count may go back in one file (each time a new run or a resume): more is
# not a training log, and each run costs its own table, analysis and traces.
MAX_SEGMENTS = 2000

FORMAT_NAMES = {
    "verl-console": "verl console log (step:N - key:value - ...)",
    "wandb-parquet": "Weights & Biases history export (.parquet)",
    "wandb-csv": "Weights & Biases CSV export",
    "csv": "CSV with a step column",
    "jsonl": "JSON lines with a step or _step field",
    "trainer-state": "Hugging Face / TRL trainer_state.json (its log_history)",
    "tensorboard": "TensorBoard event file (events.out.tfevents.*)",
}
KNOWN_FORMATS_TEXT = "; ".join(FORMAT_NAMES.values())

STEP_COLUMNS = ("_step", "Step", "step", "global_step", "trainer/global_step")


@dataclass
class ParsedFile:
    path: str
    format: str
    runs: list[TrainingRun]
    bad_lines: int = 0
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- detection

def rename_columns(parsed: ParsedFile, aliases: dict[str, str] | None) -> ParsedFile:
    """Each run's columns named by `aliases` (raw -> recognised key, `column_aliases`)
    renamed, so a visitor's own `my_score` is read as the reward."""
    for run in parsed.runs if aliases else []:
        run.table = run.table.rename(columns={raw: key for raw, key in aliases.items()
                                              if raw in run.table.columns})
    return parsed


def read_log(path: str | os.PathLike, max_bytes: int = MAX_BYTES,
             aliases: dict[str, str] | None = None) -> ParsedFile:
    """Detect the format of `path` and read every run in it (`aliases`: columns to read
    under a recognised name, see `rename_columns`)."""
    path = str(path)
    fmt = detect_format(path, max_bytes=max_bytes)
    reader = {
        "verl-console": read_console,
        "wandb-parquet": read_parquet,
        "csv": read_csv,
        "wandb-csv": read_csv,
        "jsonl": read_jsonl_log,
        "trainer-state": read_trainer_state,
        "tensorboard": read_tensorboard,
    }[fmt]
    parsed = rename_columns(reader(path), aliases)
    _require_known_metric(parsed)
    return parsed


def detect_format(path: str, max_bytes: int = MAX_BYTES) -> str:
    """Return a key of FORMAT_NAMES, or raise LogFormatError naming what we read."""
    try:
        mode = os.stat(path).st_mode
        size = os.path.getsize(path)
    except OSError as exc:
        raise LogFormatError(f"cannot open the file ({exc.strerror or exc})") from None
    if stat.S_ISDIR(mode):
        raise LogFormatError("this is a folder; upload the log file inside it")
    if not stat.S_ISREG(mode):
        # A FIFO would block the first read forever; a device may never end.
        raise LogFormatError("this is not a regular file (a pipe, socket or device); pass "
                             "the log file itself")
    if size == 0:
        raise LogFormatError("the file is empty; check that the upload or export finished")
    if size > max_bytes:
        raise LogFormatError(
            f"the file is {size / 2**20:.0f} MB, over the {max_bytes / 2**20:.0f} MB limit; "
            "for a console log keep only the step lines (grep 'step:' train.log > steps.log), "
            "or export fewer metrics from W&B"
        )
    with open(path, "rb") as handle:
        head = handle.read(HEAD_BYTES)
    if head.startswith(b"PAR1"):
        return "wandb-parquet"
    if _looks_like_tfrecord(head):
        return "tensorboard"
    if head.startswith(b"\x1f\x8b"):
        raise LogFormatError("the file is gzip-compressed; decompress it (gunzip) and upload "
                             "the log inside")
    if head.startswith(b"PK\x03\x04"):
        raise LogFormatError("the file is a zip archive; extract it and upload the log inside")
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise LogFormatError("the file is UTF-16 text; save it as UTF-8 and upload again")
    if b"\x00" in head:
        raise LogFormatError(f"the file is binary and not a format we read ({KNOWN_FORMATS_TEXT})")
    text = _decode_head(head, complete=size <= HEAD_BYTES)
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines and size <= HEAD_BYTES:
        raise LogFormatError("the file holds only blank lines")
    if size > HEAD_BYTES and (len(lines) <= 1 and not text.endswith(("\n", "\r"))):
        # The first line runs past the head (a JSON record or a CSV header with thousands
        # of keys): read it whole; the file size limit bounds it.
        lines = [_first_line(path)]
    first = lines[0].lstrip("\ufeff").strip()
    if first.startswith("{") and '"log_history"' in text:
        return "trainer-state"
    if first.startswith(("{", "[")) and _is_json_lines_record(first):
        return "jsonl"
    header = _csv_header(first)
    if header and any(col in STEP_COLUMNS for col in header):
        return "wandb-csv" if _is_wandb_header(header) else "csv"
    if any(_STEP_RE.search(_strip_ansi(line)) for line in lines):
        return "verl-console"
    if header and len(header) >= 2 and len(lines) >= 2 and all(
        line.count(",") == first.count(",") for line in lines[1:6]
    ):
        raise LogFormatError(
            f"this CSV has no step column (looked for {', '.join(STEP_COLUMNS)}); "
            f"columns found: {_preview(header)}"
        )
    # Real verl logs can print megabytes of start-up output before the first step line.
    if size > HEAD_BYTES and _console_has_step_line(path):
        return "verl-console"
    raise LogFormatError(
        f"unknown format: no step lines, step column or step field found. We read: "
        f"{KNOWN_FORMATS_TEXT}"
    )


def _is_json_lines_record(line: str) -> bool:
    """Whether `line` is a JSON object, or JSON nested too deeply to parse (no console log
    or CSV line is): the JSON-lines reader skips that one line, and it must not hide the
    rows after it."""
    try:
        return isinstance(json.loads(line), dict)
    except RecursionError:
        return True
    except ValueError:
        return False


def _first_line(path: str) -> str:
    """The first non-blank line of the file, up to MAX_LINE_CHARS bytes."""
    with open(path, "rb") as handle:
        for raw in iter(partial(handle.readline, MAX_LINE_CHARS + 1), b""):
            if len(raw) > MAX_LINE_CHARS:
                raise LogFormatError(
                    f"the first line is over {MAX_LINE_CHARS:,} bytes, longer than any "
                    "log line (a CSV header or JSON record with millions of keys?); "
                    f"keep only the metrics to plot (at most {MAX_KEYS:,} keys)")
            if raw.strip():
                return _decode_head(raw, complete=True)
    raise LogFormatError("the file holds only blank lines")


class _Lines:
    """The lines of a text file, skipping (and counting) any over MAX_LINE_CHARS without
    holding it: `for line in handle` would read a 200 MB one-line file whole."""

    def __init__(self, handle: IO[str]) -> None:
        self.handle = handle
        self.too_long = 0

    def __iter__(self) -> Iterator[str]:
        read = partial(self.handle.readline, MAX_LINE_CHARS)
        for line in iter(read, ""):
            if len(line) == MAX_LINE_CHARS and not line.endswith("\n"):
                self.too_long += 1
                for rest in iter(read, ""):
                    if rest.endswith("\n"):
                        break
                continue
            yield line

    def note(self) -> list[str]:
        if not self.too_long:
            return []
        return [f"{self.too_long} line(s) over {MAX_LINE_CHARS:,} characters were skipped "
                "unread (no log line is that long)"]


def _decode_head(head: bytes, complete: bool) -> str:
    # An incremental decoder tolerates a multi-byte character cut at the 64 KB boundary.
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        return decoder.decode(head, final=complete)
    except UnicodeDecodeError as exc:
        raise LogFormatError(
            f"the file is not UTF-8 text (invalid byte at offset {exc.start}); re-save it as "
            "UTF-8, or upload the original log"
        ) from None


def _looks_like_tfrecord(head: bytes) -> bool:
    # TFRecord framing: uint64 length, then the masked CRC32C of those 8 bytes.
    if len(head) < 12:
        return False
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    (crc,) = struct.unpack("<I", head[8:12])
    return masked_crc32c(head[:8]) == crc


def _csv_header(line: str) -> list[str] | None:
    if "," not in line:
        return None
    import csv

    try:
        return [cell.strip() for cell in next(csv.reader([line]))]
    except (csv.Error, StopIteration):
        return None


def _is_wandb_header(header: list[str]) -> bool:
    return any(col.endswith(("__MIN", "__MAX")) or " - " in col for col in header) or (
        "_step" in header or "Step" in header
    )


def _preview(items: Iterable[str], limit: int = 25) -> str:
    items = list(items)
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")


def _require_known_metric(parsed: ParsedFile) -> None:
    keys = sorted({key for run in parsed.runs for key in run.table.columns})
    if not parsed.runs or not keys:
        raise LogFormatError(f"no metric values found in this {FORMAT_NAMES[parsed.format]}")
    if not recognised_keys(keys):
        raise LogFormatError(
            "no recognised training metric (e.g. critic/score/mean or reward, kl, entropy, "
            f"actor/pos_avg_old_log_prob); keys found: {_preview(keys)}. Name yours under "
            "\"Your own column names\" (e.g. reward=my_score)"
        )


# --------------------------------------------------------------------------- segments

class _Segments:
    """Collects (step, keys, values) in file order and splits where the step goes backwards.

    A backwards step starts a new segment; a repeated step (verl prints the last step's
    validation metrics on a line of their own) is merged into the same row, later values
    winning. Afterwards `runs()` merges a segment into the run before it when it looks like
    a resume (same or unknown name, first step > 1; for overlapping steps the later value
    wins, cell by cell) and otherwise keeps it as a separate run (a fresh start at step
    0/1, or a different experiment name).

    Rows are kept as cells (curves.cells): a run's table is built once, at the end, within
    the table budget, however many keys come and go.
    """

    def __init__(self) -> None:
        self.cells = Cells()
        self.segments: list[tuple[str | None, int]] = []  # (name, first row)
        self._name: str | None = None
        self._pending_name: str | None = None
        self._last_step = 0
        self.out_of_range = 0  # rows skipped: their step does not fit in int64

    def set_name(self, name: str) -> None:
        self._pending_name = name

    def add(self, step: int, keys: tuple, values: list[float]) -> None:
        if not STEP_RANGE[0] <= step < STEP_RANGE[1]:
            self.out_of_range += 1
            return
        new_name = self._pending_name is not None and self._pending_name != self._name
        if not self.segments or step < self._last_step or new_name:
            if len(self.segments) >= MAX_SEGMENTS:
                raise OverBudgetError(
                    f"the step count goes back more than {MAX_SEGMENTS:,} times (each a new "
                    "run or a resume); this is not one training log: split it by run, or "
                    "check that the step field is the training step")
            if self._pending_name is not None:
                self._name = self._pending_name
            self.segments.append((self._name, len(self.cells)))
        self._pending_name = None
        self._last_step = step
        self.cells.add(step, keys, values)

    def runs(self, stem: str, source: str, fmt: str) -> tuple[list[TrainingRun], list[str]]:
        notes: list[str] = []
        bounds = [start for _, start in self.segments] + [len(self.cells)]
        # Each run: [name, first segment, last segment].
        groups: list[list] = []
        for k, (name, start) in enumerate(self.segments):
            prev = groups[-1] if groups else None
            if prev is not None and self.cells.row_steps[start] > 1 and name in (None, prev[0]):
                prev[2] = k
            else:
                groups.append([name, k, k])
        if len(groups) > 1:
            notes.append(f"the file holds {len(groups)} runs (the step count restarts); "
                         "they are shown as separate runs")
        if self.out_of_range:
            notes.append(_out_of_range_note(self.out_of_range))
        runs: list[TrainingRun] = []
        used: dict[str, int] = {}
        for name, first, last in groups:
            lo, hi = bounds[first], bounds[last + 1]
            table, table_notes = self.cells.table(lo, hi)
            if last > first:
                table = table[self._resumed_column_order(bounds[first:last + 2], table)]
            run_notes = _resume_notes(np.frombuffer(self.cells.row_steps, dtype=np.int64)[lo:hi],
                                      [b - lo for b in bounds[first:last + 2]])
            base = name or stem
            used[base] = used.get(base, 0) + 1
            label = base if used[base] == 1 else f"{base} #{used[base]}"
            notes.extend(f"{label}: {note}" if len(groups) > 1 else note for note in table_notes)
            runs.append(make_run(label, table, source, fmt, run_notes))
        return runs, notes


    def _resumed_column_order(self, bounds: list[int], table: pd.DataFrame) -> list[str]:
        """The column order merging segment by segment gave (each resume's keys first, then
        the earlier keys it lacks: `combine_first`), kept so a resumed log reads as
        before."""
        order: list[str] = []
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=False):
            seen = self.cells.keys_seen(lo, hi)
            fresh = set(seen)
            order = seen + [key for key in order if key not in fresh]
        return [key for key in order if key in table.columns]


def _resume_notes(steps: np.ndarray, bounds: list[int]) -> list[str]:
    """'resumed at step N[; steps A-B were logged twice ...]' for each segment after the
    first of a run (rows bounds[k]:bounds[k+1]); a step is logged twice when an earlier
    segment of the run has it. One sort for the whole run, however many resumes."""
    if len(bounds) <= 2:
        return []
    segment = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    order = np.lexsort((segment, steps))
    by_step, seg_sorted = steps[order], segment[order]
    starts = np.ones(len(by_step), dtype=bool)
    starts[1:] = by_step[1:] != by_step[:-1]
    first_seg = seg_sorted[starts][np.cumsum(starts) - 1]
    twice = seg_sorted > first_seg
    twice_seg, twice_step = seg_sorted[twice], by_step[twice]
    overlap: dict[int, tuple[int, int]] = {}
    if len(twice_seg):
        order = np.lexsort((twice_step, twice_seg))
        twice_seg, twice_step = twice_seg[order], twice_step[order]
        segs, at = np.unique(twice_seg, return_index=True)
        last = np.append(at[1:], len(twice_seg)) - 1
        overlap = {int(k): (int(twice_step[a]), int(twice_step[b]))
                   for k, a, b in zip(segs, at, last, strict=True)}
    notes = []
    for k in range(1, len(bounds) - 1):
        text = f"resumed at step {int(steps[bounds[k]])}"
        if k in overlap:
            low, high = overlap[k]
            text += f"; steps {low}-{high} were logged twice, the later values are kept"
        notes.append(text)
    return notes


def _out_of_range_note(count: int) -> str:
    return (f"{count} row(s) had a step outside the 64-bit range "
            f"({STEP_RANGE[0]:,} to {STEP_RANGE[1] - 1:,}) and were skipped")


# --------------------------------------------------------------------------- console

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
# `step:12 - ` not preceded by a word char or '/', so `training/global_step:12` is a key.
_STEP_RE = re.compile(r"(?<![\w/])step:\s*(\d+)(?:\s+-\s+|\s*$)")
_WRAPPED_RE = re.compile(r"^(?:np\.)?\w*\(([^,)]*)[,)]")
_EXPERIMENT_RE = re.compile(r"experiment_name['\"]?\s*[:=]\s*['\"]?([^'\",\s}\]]+)")


def _strip_ansi(line: str) -> str:
    return _ANSI_RE.sub("", line) if "\x1b" in line else line


def _console_has_step_line(path: str) -> bool:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return any("step:" in line and _STEP_RE.search(_strip_ansi(line))
                   for line in _Lines(handle))


def parse_value(text: str) -> float | None:
    """'0.5', 'nan', '-inf', 'np.float64(0.5)', 'tensor(0.5, device=...)' -> float; else None."""
    try:
        return float(text)
    except ValueError:
        pass
    match = _WRAPPED_RE.match(text.strip())
    if match:
        try:
            return float(match.group(1))
        except ValueError:
            return None
    return None


def _parse_pairs(rest: str) -> tuple[tuple, list[float], int]:
    """Slow path for one line: (keys, values, number of fragments that were not numbers)."""
    keys: list[str] = []
    values: list[float] = []
    bad = 0
    for pair in rest.split(" - "):
        key, sep, raw = pair.partition(":")
        value = parse_value(raw) if sep and key.strip() else None
        if value is None:
            bad += 1
            continue
        key = key.strip()
        if key in keys:  # a key twice on one line: the later one wins
            del values[keys.index(key)]
            keys.remove(key)
        keys.append(key)
        values.append(value)
    return tuple(keys), values, bad


def read_console(path: str) -> ParsedFile:
    """Stream a verl console log. Non-step lines (warnings, tracebacks, tqdm) are skipped.

    Fast path per step line: split on ' - ' and ':' and map float over the values, all
    C-level; a line with colons inside values or non-numbers falls back to `_parse_pairs`.
    Consecutive lines share one key tuple, so their keys are looked up once.
    """
    segments = _Segments()
    bad_lines = bad_values = undecodable = 0
    last_bad = ""
    last_keys: tuple = ()
    step_search = _STEP_RE.search
    with open(path, encoding="utf-8", errors="replace") as handle:
        lines = _Lines(handle)
        for line in lines:
            if "step:" not in line:
                if "experiment_name" in line:
                    match = _EXPERIMENT_RE.search(_strip_ansi(line))
                    if match:
                        segments.set_name(match.group(1))
                continue
            if "\x1b" in line:
                line = _ANSI_RE.sub("", line)
            match = step_search(line)
            if match is None:
                continue
            if "\ufffd" in line:
                undecodable += 1
            rest = line[match.end():].rstrip()
            fields = rest.replace(" - ", ":").split(":")
            n_pairs = rest.count(" - ") + 1
            try:
                if len(fields) != 2 * n_pairs:
                    raise ValueError
                values = list(map(float, fields[1::2]))
                keys = tuple(fields[0::2])
                if keys == last_keys:
                    keys = last_keys  # one shared tuple: Cells compares by identity first
                elif len(set(keys)) != n_pairs:
                    raise ValueError
            except ValueError:
                keys, values, bad = _parse_pairs(rest)
                if not values:
                    bad_lines += 1
                    last_bad = line.strip()[:120]
                    continue
                bad_values += bad
            last_keys = keys
            segments.add(int(match.group(1)), keys, values)
    if not segments.segments:
        raise LogFormatError(
            "no parseable step lines (step:N - key:value - ...) in this console log"
        )
    runs, notes = segments.runs(Path(path).stem, path, "verl-console")
    notes.extend(lines.note())
    if bad_lines:
        notes.append(f"{bad_lines} step line(s) could not be parsed and were skipped "
                     f"(e.g. {last_bad!r})")
    if bad_values:
        notes.append(f"{bad_values} key:value pair(s) were not numbers or were cut off, "
                     "and were skipped")
    if undecodable:
        notes.append(f"{undecodable} step line(s) held bytes that are not UTF-8")
    if not _ends_with_newline(path):
        notes.append("the file does not end with a newline: the last line may be cut off "
                     "(was the log still being written, or truncated?)")
    return ParsedFile(path, "verl-console", runs, bad_lines, notes)


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) in (b"\n", b"\r")


# --------------------------------------------------------------------------- JSON lines

def _flatten(record: dict, prefix: str = "") -> Iterator[tuple[str, object]]:
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, name + "/")
        else:
            yield name, value


MAX_STATE_BYTES = 32 * 1024 * 1024  # read whole: a long run's trainer_state.json is ~1-5 MB


def read_trainer_state(path: str) -> ParsedFile:
    """The HF Trainer's (and so TRL's) `trainer_state.json`: its `log_history`, one record
    per logging step (`step`, then `reward`, `kl`, `loss`, ... and `eval_*` on eval steps).
    The run is named by the folder it sits in (the output dir, or `checkpoint-N`'s)."""
    size = os.path.getsize(path)
    if size > MAX_STATE_BYTES:
        raise LogFormatError(f"the trainer_state.json is {size / 2**20:.0f} MB, over the "
                             f"{MAX_STATE_BYTES / 2**20:.0f} MB we read whole; export the "
                             "metrics as JSON lines instead")
    try:
        with open(path, encoding="utf-8", errors="strict") as handle:
            state = json.load(handle)
    except UnicodeDecodeError as exc:
        raise LogFormatError(f"the file is not UTF-8 text ({exc.reason})") from None
    except (ValueError, RecursionError) as exc:
        raise LogFormatError(f"the trainer_state.json is not valid JSON ({exc})") from None
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise LogFormatError("the file has no `log_history` list (is it a trainer_state.json "
                             "written by the Hugging Face Trainer?)")
    segments, no_step = _Segments(), 0
    for record in history:
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, bool) or not isinstance(step, (int, float)) or (
                isinstance(step, float) and not math.isfinite(step)):
            no_step += 1
            continue
        values = {key: float(value) for key, value in _flatten(record)
                  if key != "step" and isinstance(value, (int, float))
                  and not isinstance(value, bool)}
        segments.add(int(step), tuple(values), list(values.values()))
    if not segments.segments:
        raise LogFormatError("the log_history holds no record with a numeric `step` (was "
                             "anything logged? set logging_steps)")
    folder = Path(path).resolve().parent
    name = Path(path).stem
    # Named by its folder where that is a run's (an upload sits in a hashed temp folder).
    if Path(path).name == "trainer_state.json" and not re.fullmatch(r"[0-9a-f]{16,}",
                                                                    folder.name):
        name = (f"{folder.parent.name}/{folder.name}" if folder.name.startswith("checkpoint-")
                else folder.name)
    runs, notes = segments.runs(name, path, "trainer-state")
    if no_step:
        notes.append(f"{no_step} log_history record(s) had no numeric step and were skipped")
    return ParsedFile(path, "trainer-state", runs, no_step, notes)


def read_jsonl_log(path: str) -> ParsedFile:
    """One JSON object per line with `step` or `_step`; `experiment_name`/`run` split runs."""
    segments = _Segments()
    bad_lines = 0
    no_step = 0
    too_deep = 0
    last_line_bad = False
    with open(path, encoding="utf-8", errors="strict") as handle:
        lines = _Lines(handle)
        try:
            for line in lines:
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except RecursionError:  # '[' * 100000: that line alone, not the file
                    too_deep += 1
                    last_line_bad = False
                    continue
                except ValueError:
                    bad_lines += 1
                    last_line_bad = True
                    continue
                last_line_bad = False
                if not isinstance(record, dict):
                    bad_lines += 1
                    continue
                step = record.get("step", record.get("_step"))
                if isinstance(step, bool) or not isinstance(step, (int, float)) or (
                    isinstance(step, float) and not math.isfinite(step)
                ):
                    no_step += 1
                    continue
                name = record.get("experiment_name", record.get("run"))
                if isinstance(name, str) and name:
                    segments.set_name(name)
                values = {
                    key: float(value) for key, value in _flatten(record)
                    if key not in ("step", "_step") and isinstance(value, (int, float))
                    and not isinstance(value, bool)
                }
                segments.add(int(step), tuple(values), list(values.values()))
        except UnicodeDecodeError as exc:
            raise LogFormatError(f"the file is not UTF-8 text ({exc.reason}); re-save it as "
                                 "UTF-8") from None
    if not segments.segments:
        raise LogFormatError("no JSON line had a numeric `step` or `_step` field")
    runs, notes = segments.runs(Path(path).stem, path, "jsonl")
    notes.extend(lines.note())
    if bad_lines:
        notes.append(f"{bad_lines} line(s) were not valid JSON objects and were skipped"
                     + (" (the last line is incomplete: was the file truncated?)"
                        if last_line_bad else ""))
    if too_deep:
        notes.append(f"{too_deep} line(s) were nested too deeply to read (JSON arrays or "
                     f"objects over ~{sys.getrecursionlimit():,} levels deep, which no "
                     "log writes) and were skipped")
    if no_step:
        notes.append(f"{no_step} line(s) had no numeric step field and were skipped")
    return ParsedFile(path, "jsonl", runs, bad_lines + too_deep + no_step, notes)


# --------------------------------------------------------------------------- CSV / W&B

def _split_wandb_columns(columns: list[str]) -> dict[str, dict[str, str]] | None:
    """For a W&B chart export, map run name -> {metric key: column}; None if not that shape."""
    by_run: dict[str, dict[str, str]] = {}
    for col in columns:
        if col in STEP_COLUMNS or col.endswith(("__MIN", "__MAX")):
            continue
        run, sep, key = col.partition(" - ")
        if not sep:
            return None
        by_run.setdefault(run, {})[key] = col
    return by_run or None


def _steps_in_range(steps: pd.Series) -> pd.Series:
    """True where the step is a number that fits in int64."""
    as_float = steps.astype("float64")  # exact at the bounds, which are powers of two
    return as_float.notna() & (as_float >= STEP_RANGE[0]) & (as_float < STEP_RANGE[1])


def _table_from_frame(frame: pd.DataFrame, steps: pd.Series,
                      columns: dict[str, str]) -> pd.DataFrame:
    """The step x key table of `columns`; `steps` are numeric and in range (checked)."""
    data = {key: pd.to_numeric(frame[col], errors="coerce") for key, col in columns.items()}
    table = pd.DataFrame(data)
    table.index = steps.astype("int64")
    table = table.dropna(how="all")
    # Repeated steps (a resumed run exported as one history): the later row wins.
    return table[~table.index.duplicated(keep="last")]


def _runs_from_frame(frame: pd.DataFrame, path: str,
                     fmt: str) -> tuple[list[TrainingRun], list[str]]:
    step_col = next((c for c in STEP_COLUMNS if c in frame.columns), None)
    if step_col is None:
        raise LogFormatError(f"no step column (looked for {', '.join(STEP_COLUMNS)}); "
                             f"columns found: {_preview(map(str, frame.columns))}")
    columns = [str(c) for c in frame.columns]
    frame.columns = columns
    notes: list[str] = []
    steps = pd.to_numeric(frame[step_col], errors="coerce")
    numeric_step = steps.notna()
    in_range = _steps_in_range(steps)
    if (numeric_step & ~in_range).any():
        notes.append(_out_of_range_note(int((numeric_step & ~in_range).sum())))
    frame, steps = frame[in_range], steps[in_range]
    stem = Path(path).stem.removesuffix("-history")
    dropped = [c for c in columns if c.endswith(("__MIN", "__MAX"))]
    if dropped:
        notes.append(f"{len(dropped)} __MIN/__MAX column(s) (W&B chart bands) were not used")
    by_run = _split_wandb_columns(columns)
    if by_run is not None:
        groups = by_run
    else:
        skip = set(STEP_COLUMNS) | {"_runtime", "_timestamp", "_wandb"} | set(dropped)
        numeric = {}
        for col in columns:
            if col in skip:
                continue
            values = pd.to_numeric(frame[col], errors="coerce")
            if values.notna().any():
                numeric[col] = col
        groups = {stem: numeric}
    runs: list[TrainingRun] = []
    for name, cols in groups.items():
        table = _table_from_frame(frame, steps, cols)
        if len(table):
            runs.append(make_run(name, table, path, fmt))
    if steps.duplicated().any():
        notes.append("some steps appear more than once; the later row is kept")
    return runs, notes


def read_csv(path: str) -> ParsedFile:
    """A W&B CSV export (either shape) or any CSV with a step column."""
    expected_rows = _check_csv_size(path)
    try:
        frame = pd.read_csv(path, encoding="utf-8", on_bad_lines="skip", low_memory=False)
    except UnicodeDecodeError:
        raise LogFormatError("the CSV is not UTF-8 text; re-export it as UTF-8") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        raise LogFormatError(f"the CSV cannot be parsed ({exc})") from None
    fmt = "wandb-csv" if _is_wandb_header([str(c) for c in frame.columns]) else "csv"
    runs, notes = _runs_from_frame(frame, path, fmt)
    skipped = max(0, expected_rows - len(frame))
    if skipped:
        notes.append(f"{skipped} CSV row(s) had the wrong number of fields and were skipped")
    return ParsedFile(path, fmt, runs, skipped, notes)


def _check_csv_size(path: str) -> int:
    """The number of data rows, once rows x header columns (what pandas would decode,
    empty cells included) is known to fit the table budget; else OverBudgetError."""
    header = _csv_header(_first_line(path).lstrip("\ufeff").strip()) or [""]
    rows = _count_data_lines(path)
    cells = rows * len(header)
    if len(header) > MAX_KEYS or cells > MAX_TABLE_CELLS:
        size = os.path.getsize(path) / 2**20
        raise OverBudgetError(
            f"the CSV ({size:.2f} MB) is {rows:,} rows x {len(header):,} columns "
            f"({cells:,} cells), over the limit of {MAX_TABLE_CELLS:,} cells and "
            f"{MAX_KEYS:,} columns; export fewer metrics or a sampled history")
    return rows


def _count_data_lines(path: str) -> int:
    # Cheap check for rows pandas dropped; quoted multi-line cells are not expected here.
    # Read in pieces: a line is never held whole, however long.
    count = 0
    blank = True
    with open(path, "rb") as handle:
        for piece in iter(partial(handle.readline, 2**20), b""):
            blank = blank and not piece.strip()
            if piece.endswith(b"\n"):
                count += not blank
                blank = True
    count += not blank
    return max(0, count - 1)


def _fixed_width_numeric(data_type) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(data_type) or pa.types.is_floating(data_type) or \
        pa.types.is_boolean(data_type)


def read_parquet(path: str) -> ParsedFile:
    """A W&B `<run-id>-history` parquet artifact: its numeric step column and its other
    fixed-width numeric columns only, and only when their decoded size (rows x byte widths,
    from the metadata) fits MAX_PARQUET_BYTES. Text, list and dictionary-encoded columns are
    never read: their decoded size is not known before decoding them."""
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(path)
        schema = handle.schema_arrow
        rows = handle.metadata.num_rows
    except Exception as exc:  # pyarrow raises several unrelated types for damaged files
        raise LogFormatError(f"the parquet file is damaged or truncated ({exc}); download the "
                             "W&B history artifact again") from None
    step_col = next((name for name in STEP_COLUMNS if name in schema.names), None)
    if step_col is None:
        raise LogFormatError(f"no step column (looked for {', '.join(STEP_COLUMNS)}); "
                             f"columns found: {_preview(schema.names)}")
    step_type = schema.field(step_col).type
    if not _fixed_width_numeric(step_type):
        kind = "string" if "string" in str(step_type) else str(step_type)
        raise LogFormatError(f"the step column {step_col!r} holds {kind} values, not numbers; "
                             "export the history with a numeric _step column")
    numeric = [f for f in schema if _fixed_width_numeric(f.type)]
    width = sum(max(f.type.bit_width, 8) // 8 for f in numeric)
    decoded = rows * width
    if len(schema) > MAX_PARQUET_COLUMNS or decoded > MAX_PARQUET_BYTES:
        size = os.path.getsize(path) / 2**20
        raise LogFormatError(
            f"the parquet file ({size:.2f} MB) expands to {rows:,} rows x {len(numeric):,} "
            f"numeric columns ({decoded:,} bytes in memory; {len(schema):,} columns in all), "
            f"over the limit of {MAX_PARQUET_BYTES:,} bytes and {MAX_PARQUET_COLUMNS:,} "
            "columns; export fewer metrics or a sampled history from W&B")
    try:
        frame = handle.read(columns=[f.name for f in numeric]).to_pandas()
    except Exception as exc:
        raise LogFormatError(f"the parquet file is damaged or truncated ({exc}); download the "
                             "W&B history artifact again") from None
    runs, notes = _runs_from_frame(frame, path, "wandb-parquet")
    return ParsedFile(path, "wandb-parquet", runs, 0, notes)


# --------------------------------------------------------------------------- TensorBoard

def read_tensorboard(path: str) -> ParsedFile:
    """Scalars from one event file; the run is named after its folder (runs/<name>/events...)."""
    table, notes, bad = read_event_scalars(path)
    p = Path(path)
    name = p.parent.name if p.name.startswith("events.out.tfevents") and p.parent.name else p.stem
    run = make_run(name, table, path, "tensorboard")
    return ParsedFile(path, "tensorboard", [run], bad, notes)


def read_event_scalars(path: str) -> tuple[pd.DataFrame, list[str], int]:
    """(step x tag table, notes, damaged records) of one event file's scalar values; within
    the file a step logged twice keeps its later value. The values are kept as cells and
    the table built within the table budget: a new tag at every step costs its values,
    not steps x tags."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New
    from tensorboard.util import tensor_util

    cells = Cells()
    notes: list[str] = []
    bad = 0
    reader = PyRecordReader_New(path)
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            break
        except errors.DataLossError as exc:
            notes.append(f"the event file ends in a damaged or truncated record ({exc.message}); "
                         "the events before it were read")
            bad += 1
            break
        try:
            event = event_pb2.Event.FromString(reader.record())
        except Exception:  # protobuf's DecodeError; keep reading the next record
            bad += 1
            continue
        if not event.HasField("summary"):
            continue
        tags: list[str] = []
        numbers: list[float] = []
        for value in event.summary.value:
            if value.HasField("simple_value"):
                number = float(value.simple_value)
            elif value.HasField("tensor"):
                try:
                    array = tensor_util.make_ndarray(value.tensor)
                except Exception:
                    continue
                if array.size != 1 or array.dtype.kind not in "fiub":
                    continue
                number = float(array.reshape(()))
            else:
                continue
            tags.append(value.tag)
            numbers.append(number)
        if tags:
            cells.add(int(event.step), tuple(tags), numbers)
    if not len(cells):
        raise LogFormatError("the TensorBoard event file holds no scalar values"
                             + (f" ({notes[0]})" if notes else ""))
    # A record read later replaces an earlier one, NaN or not, as a dict of rows did.
    table, table_notes = cells.table(nan_wins=True)
    return table, notes + table_notes, bad
