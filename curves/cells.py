"""Logged values held as (step, key, value) cells, turned into step x key tables within a
budget; the budgets every reader shares; side files read without surprises.

Why cells: a log where each line brings a new key is a few bytes per value on disk but a
steps x keys table in memory, so a sub-megabyte upload could ask for gigabytes. The
readers therefore keep what was logged (12 bytes a value, 16 a row) and build the table
last, checking its size first; when every step x every key would not fit, the table keeps
the keys the analysis reads and those logged at the most steps, and says what it left out.

The budgets count what a file decodes to, never its size on disk (which says nothing:
see MAX_PARQUET_BYTES in curves.parse), and each refusal says what to do instead.
"""

from __future__ import annotations

import errno
import os
import stat
from array import array
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from curves.runs import recognised_keys

# The decoded size a log may have: ~10k steps x 1,000 float64 metrics, the same budget as
# the parquet reader's (a run table of that size is 80 MB).
MAX_TABLE_BYTES = 80 * 2**20
MAX_TABLE_CELLS = MAX_TABLE_BYTES // 8
# Numbers held while reading one file: a value per (step, key) cell, and a step for a row
# without values. A dense log's table has as many cells as it logged, so the same budget.
MAX_CELLS = MAX_TABLE_CELLS
# Distinct keys in one file (as for parquet columns); real logs have a few hundred.
MAX_KEYS = 20_000
# Config, metadata, MLflow params and tags: small by nature, never worth more than this.
MAX_SIDE_BYTES = 2**20
# Cells filled per numpy pass, so the temporaries stay a few MB whatever the log size.
_CHUNK = 1 << 20


class LogFormatError(ValueError):
    """The file cannot be read as a training log; the message says why and what to do."""


class OverBudgetError(LogFormatError):
    """The log decodes to more than a budget allows (a folder reader must not mistake it
    for a file with nothing in it)."""


def too_many_cells_message() -> str:
    return (f"the log holds more than {MAX_CELLS:,} logged values (steps x metrics, e.g. "
            "10k steps of 1,000 metrics), over the limit; keep fewer metrics or fewer steps "
            "(every 10th, say) and upload again")


def too_many_keys_message() -> str:
    return (f"the log names more than {MAX_KEYS:,} distinct metric keys (a new key on "
            "almost every line?); a training log has a few hundred: log per-item values "
            "under one key (or as a histogram), or keep only the metrics to plot")


class Cells:
    """Values in arrival order, long format: per row its step and where its values end,
    per value its key id. `table()` turns a range of rows into a step x key table."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.names: list[str] = []
        self.row_steps = array("q")
        self.row_ends = array("q")
        self.key_ids = array("i")
        self.values = array("d")
        self.repeats = False  # some row names a key twice: filling must pick the later
        self._held = 0  # numbers held, against MAX_CELLS
        self._last_keys: tuple = ()
        self._last_ids = array("i")

    def __len__(self) -> int:
        return len(self.row_steps)

    def key_id(self, key: str) -> int:
        found = self.index.get(key)
        if found is not None:
            return found
        if len(self.names) >= MAX_KEYS:
            raise OverBudgetError(too_many_keys_message())
        self.index[key] = len(self.names)
        self.names.append(key)
        return len(self.names) - 1

    def add(self, step: int, keys: tuple, values: Sequence[float]) -> None:
        """One row; consecutive rows usually share their keys, which are then looked up
        once (compared by identity first, as the console reader shares one tuple)."""
        if keys is not self._last_keys and keys != self._last_keys:
            ids = array("i", map(self.key_id, keys))
            if len(set(ids)) != len(ids):
                self.repeats = True
            self._last_keys, self._last_ids = keys, ids
        self._hold(len(keys) or 1)
        self.key_ids.extend(self._last_ids)
        self.values.extend(values)
        self.row_steps.append(step)
        self.row_ends.append(len(self.values))

    def add_series(self, key: str, steps: array, values: array) -> None:
        """One key's values (an MLflow metric file): a row of one value per step."""
        self._hold(len(steps))
        base = len(self.values)
        self.key_ids.extend(array("i", [self.key_id(key)]) * len(steps))
        self.values.extend(values)
        self.row_steps.extend(steps)
        self.row_ends.extend(range(base + 1, base + len(steps) + 1))
        self._last_keys, self._last_ids = (), array("i")

    def _cell_range(self, lo: int, hi: int) -> tuple[int, int]:
        """The values of rows [lo, hi)."""
        c0 = self.row_ends[lo - 1] if lo else 0
        return c0, self.row_ends[hi - 1] if hi > lo else c0

    def _first_seen(self, c0: int, c1: int) -> tuple[np.ndarray, np.ndarray]:
        """Key ids among values [c0, c1) in order of first appearance, and each key's
        number of values (indexed by key id); in chunks, so no temporary grows with the
        log."""
        kid = np.frombuffer(self.key_ids, dtype=np.int32) if c1 > c0 else np.zeros(0, np.int32)
        n_keys = len(self.names)
        first = np.full(n_keys, np.iinfo(np.int64).max, dtype=np.int64)
        counts = np.zeros(n_keys, dtype=np.int64)
        for start in range(c0, c1, _CHUNK):
            chunk = kid[start:min(start + _CHUNK, c1)]
            present, where = np.unique(chunk, return_index=True)
            first[present] = np.minimum(first[present], where + start)
            counts += np.bincount(chunk, minlength=n_keys)
        present = np.flatnonzero(counts)
        return present[np.argsort(first[present], kind="stable")], counts

    def keys_seen(self, lo: int, hi: int) -> list[str]:
        """Keys of rows [lo, hi) in order of first appearance."""
        order, _ = self._first_seen(*self._cell_range(lo, hi))
        return [self.names[k] for k in order]

    def room(self) -> int:
        """Numbers that may still be added within MAX_CELLS."""
        return max(0, MAX_CELLS - self._held)

    def _hold(self, count: int) -> None:
        self._held += count
        if self._held > MAX_CELLS:
            raise OverBudgetError(too_many_cells_message())

    def table(self, lo: int = 0, hi: int | None = None,
              nan_wins: bool = False) -> tuple[pd.DataFrame, list[str]]:
        """The step x key table of rows [lo, hi), sorted by step, keys in order of first
        appearance, and notes. A (step, key) logged twice keeps the later value; with
        `nan_wins` False a later NaN does not hide an earlier number (the console and JSON
        lines readers' rule), with True it does (a later record replaces the earlier one:
        TensorBoard, W&B, MLflow). Over MAX_TABLE_CELLS, keys are left out (see
        `keep_keys`)."""
        hi = len(self.row_steps) if hi is None else hi
        all_ends = np.frombuffer(self.row_ends, dtype=np.int64) if len(self) else \
            np.zeros(0, np.int64)
        steps = np.frombuffer(self.row_steps, dtype=np.int64)[lo:hi] if len(self) else \
            np.zeros(0, np.int64)
        ends = all_ends[lo:hi]
        c0 = int(all_ends[lo - 1]) if lo else 0
        c1 = int(ends[-1]) if len(ends) else c0
        kid = np.frombuffer(self.key_ids, dtype=np.int32) if c1 > c0 else np.zeros(0, np.int32)
        vals = np.frombuffer(self.values, dtype=np.float64) if c1 > c0 else np.zeros(0)
        uniq, row_pos = np.unique(steps, return_inverse=True)
        n_keys = len(self.names)
        order, counts = self._first_seen(c0, c1)
        names = [self.names[k] for k in order]
        notes: list[str] = []
        if len(uniq) * len(order) > MAX_TABLE_CELLS:
            kept, note = keep_keys(names, counts[order], len(uniq))
            order, names = order[kept], [names[j] for j in kept]
            notes.append(note)
        colpos = np.full(n_keys, -1, dtype=np.int64)
        colpos[order] = np.arange(len(order))
        out = np.full((len(uniq), len(order)), np.nan)
        flat = out.reshape(-1)
        row_starts = np.concatenate(([c0], ends[:-1])) if len(ends) else ends
        for start in range(c0, c1, _CHUNK):
            stop = min(start + _CHUNK, c1)
            # Rows whose values fall in [start, stop), and how many of them each has there.
            r_a = int(np.searchsorted(ends, start, side="right"))
            r_b = int(np.searchsorted(ends, stop - 1, side="right")) + 1
            spans = (np.minimum(ends[r_a:r_b], stop)
                     - np.maximum(row_starts[r_a:r_b], start)).clip(0)
            rows = row_pos[r_a:r_b]
            cell_rows = np.repeat(rows, spans)
            cols = colpos[kid[start:stop]]
            chunk_vals = vals[start:stop]
            keep = cols >= 0
            if not nan_wins:
                keep &= ~np.isnan(chunk_vals)
            where = cell_rows[keep] * len(order) + cols[keep]
            chunk_vals = chunk_vals[keep]
            if self.repeats or (len(rows) > 1 and bool(np.any(rows[1:] <= rows[:-1]))):
                # The same cell twice in this chunk: numpy does not promise which of two
                # writes to one place lands last, so keep only each cell's last value.
                _, last = np.unique(where[::-1], return_index=True)
                pick = len(where) - 1 - last
                where, chunk_vals = where[pick], chunk_vals[pick]
            flat[where] = chunk_vals
        table = pd.DataFrame(out, index=pd.Index(uniq, dtype="int64"), columns=names,
                             copy=False)
        return table, notes


def keep_keys(names: Sequence[str], counts: Iterable[int],
              n_steps: int) -> tuple[list[int], str]:
    """Which keys fit a table of `n_steps` rows within MAX_TABLE_CELLS: those the
    analysis and plots read (recognised metrics) first, then those logged at the most
    steps, then the earliest; returns their positions (in the given order) and a note."""
    counts = list(counts)
    limit = max(1, MAX_TABLE_CELLS // max(n_steps, 1))
    recognised = set(recognised_keys(list(names)))
    rank = sorted(range(len(names)),
                  key=lambda j: (names[j] not in recognised, -counts[j], j))
    kept = sorted(rank[:limit])
    dropped = [names[j] for j in rank[limit:]]
    shown = ", ".join(dropped[:5]) + (", ..." if len(dropped) > 5 else "")
    note = (f"{len(dropped):,} of {len(names):,} keys were left out: every step x every key "
            f"would be {n_steps:,} x {len(names):,} cells, over the limit of "
            f"{MAX_TABLE_CELLS:,}, so the table keeps the recognised metrics, then the keys "
            f"logged at the most steps (left out: {shown}); to plot a key left out, log "
            "fewer distinct keys")
    return kept, note


def merge_later_first(later: pd.DataFrame,
                      earlier: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """`later.combine_first(earlier)` (a resumed run: the later value wins, cell by cell),
    with keys left out first when the merged table would be over MAX_TABLE_CELLS (two
    tables that fit can still merge into one that does not: different steps, different
    keys)."""
    steps = later.index.union(earlier.index)
    columns = list(dict.fromkeys([*earlier.columns, *later.columns]))
    if len(steps) * len(columns) <= MAX_TABLE_CELLS:
        return later.combine_first(earlier), []
    counts = earlier.count().add(later.count(), fill_value=0).reindex(columns)
    kept, note = keep_keys(columns, counts.astype("int64"), len(steps))
    keep = [columns[j] for j in kept]
    later = later[[c for c in later.columns if c in set(keep)]]
    earlier = earlier[[c for c in earlier.columns if c in set(keep)]]
    return later.combine_first(earlier), [note]


# --------------------------------------------------------------------------- files

def is_regular_file(path: str | os.PathLike) -> bool:
    """True for a regular file (after symlinks): a FIFO would block the first read
    forever, a device could be endless."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def read_side_file(path: str | os.PathLike, limit: int | None = None,
                   label: str | None = None) -> bytes | None:
    """A small file beside a log (a config, metadata, an MLflow param or tag): its bytes,
    or None when there is none. Raises LogFormatError, saying why, for a symlink (never
    followed: one pointing at /etc/hostname must not become a run's name), a FIFO or
    device (opened without blocking, then refused) or a file over `limit` bytes
    (MAX_SIDE_BYTES; only that much is ever read). Messages name the file `label`
    (default: its name)."""
    limit = MAX_SIDE_BYTES if limit is None else limit
    name = os.fspath(path)
    label = label or os.path.basename(name)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | \
        getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(name):
            raise LogFormatError(f"{label} is a symbolic link, which is not followed; "
                                 "copy the file it points to in its place") from None
        raise LogFormatError(f"{label} cannot be opened ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise LogFormatError(f"{label} is not a regular file (a folder, pipe or device) "
                                 "and was not read")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise LogFormatError(f"{label} is over {limit:,} bytes and was not read (a config, "
                             "param or tag file is small; is it the right file?)")
    return data
