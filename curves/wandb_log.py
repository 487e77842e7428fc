"""A W&B run's transaction log (`run-<id>.wandb`), the file an offline run writes.

The file is a LevelDB-style log: a 7-byte header (`:W&B`, magic 0xBEE1, version 0), then
32 KiB blocks of records, each with a 7-byte header (CRC-32 of type + payload, payload
length, type: full / first / middle / last piece). Each record is a protobuf `Record`
whose schema ships with the wandb SDK (`wandb.proto.wandb_internal_pb2`); without the SDK
the file cannot be decoded, and the error says so.

The file is read a block at a time and a record's pieces are appended to one bytearray
(amortised constant time, a byte per byte): linear in the file size, and the memory of
one record, not of the file (`bytes +=` copied the record so far at every piece, so a
file of tiny pieces was quadratic: 20 MB took over a minute).
History values are kept as cells (curves.cells), so a new key per step stays cheap.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import pandas as pd

from curves.cells import Cells
from curves.parse import STEP_RANGE, LogFormatError

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
_BLOCK = 32 * 1024
_PIECE_HEADER = struct.Struct("<IHB")
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_KIND_CRC = {kind: zlib.crc32(bytes([kind])) for kind in range(256)}
# A history row, config or summary is kilobytes; a larger record (media, a big table) is
# skipped rather than held, with a note.
MAX_RECORD_BYTES = 16 * 2**20
NEEDS_SDK = ("reading a .wandb file needs the wandb package (pip install wandb), whose "
             "record schema it is written in; or sync the run and export its history as CSV "
             "or parquet")


@dataclass
class WandbLog:
    """What a transaction log holds that curves uses."""

    run_id: str = ""
    display_name: str = ""
    config: dict[str, object] = field(default_factory=dict)
    # step x key, built within the table budget once the log is read (empty: no history).
    history: pd.DataFrame = field(default_factory=pd.DataFrame)
    notes: list[str] = field(default_factory=list)

    def table(self) -> pd.DataFrame:
        return self.history


def is_wandb_log(path: str | Path) -> bool:
    with open(path, "rb") as handle:
        return handle.read(4) == HEADER[:4]


def _records(handle: BinaryIO, notes: list[str]) -> Iterator[bytes]:
    """Payloads of the log's records, pieces joined, read from just after the header a
    block at a time; stops at a damaged or cut-off piece. A piece never crosses a block
    (the format pads the block's end instead), so each block is checked on its own."""
    pending: bytearray | None = None
    pending_size = 0
    oversized = 0
    # Locals: this loop runs once per piece, and a file may hold millions of tiny ones.
    unpack_from, crc32, kind_crc, size = _PIECE_HEADER.unpack_from, zlib.crc32, _KIND_CRC, \
        _PIECE_HEADER.size
    pos = len(HEADER)
    block = HEADER + handle.read(_BLOCK - len(HEADER))
    while len(block) > pos:
        end = len(block)
        while pos < end:
            if _BLOCK - pos < size:  # block trailer: zero padding
                break
            if end - pos < size:
                notes.append("the log ends in a damaged or cut-off record (was the run still "
                             "writing?); the records before it were read")
                return
            crc, length, kind = unpack_from(block, pos)
            if kind == 0 and length == 0:  # padding at the end of a block
                break
            start = pos + size
            payload = block[start:start + length]
            if len(payload) < length or crc32(payload, kind_crc[kind]) != crc:
                notes.append("the log ends in a damaged or cut-off record (was the run still "
                             "writing?); the records before it were read")
                return
            pos = start + length
            if kind == _FULL:
                yield payload
            elif kind == _FIRST:
                pending, pending_size = bytearray(payload), length
            elif kind in (_MIDDLE, _LAST) and pending is not None:
                pending_size += length
                if pending_size > MAX_RECORD_BYTES:
                    pending.clear()  # keep counting the record's size, not its bytes
                else:
                    pending += payload
                if kind == _LAST:
                    if pending_size > MAX_RECORD_BYTES:
                        oversized += 1
                    else:
                        yield bytes(pending)
                    pending = None
        block, pos = handle.read(_BLOCK), 0
    if oversized:
        notes.append(f"{oversized} record(s) over {MAX_RECORD_BYTES // 2**20} MB (media or a "
                     "large table?) were skipped")


def _number(value_json: str) -> float | None:
    try:
        value = json.loads(value_json)
    except (ValueError, RecursionError):  # one value nested past the limit: not a number
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _item_key(item) -> str:
    return item.key or "/".join(item.nested_key)


def read_wandb_log(path: str | Path) -> WandbLog:
    """Run id, display name, config and the numeric history of one `.wandb` file."""
    try:
        from wandb.proto import wandb_internal_pb2
    except ImportError:
        raise LogFormatError(NEEDS_SDK) from None
    with open(path, "rb") as handle:
        log = _read_records(handle, wandb_internal_pb2)
    return log


def _read_records(handle: BinaryIO, wandb_internal_pb2) -> WandbLog:
    head = handle.read(len(HEADER))
    if not head.startswith(HEADER[:4]):
        raise LogFormatError("not a W&B transaction log (no :W&B header)")
    if head != HEADER:
        raise LogFormatError("this .wandb file has a log version we do not know; export the "
                             "run's history as CSV or parquet instead")
    log = WandbLog()
    cells = Cells()
    undecodable = out_of_range = 0
    for payload in _records(handle, log.notes):
        if not payload:
            continue  # an empty Record holds nothing we read
        try:
            record = wandb_internal_pb2.Record.FromString(payload)
        except Exception:  # protobuf's DecodeError: a record from a newer SDK, say
            undecodable += 1
            continue
        kind = record.WhichOneof("record_type")
        if kind == "run":
            log.run_id = record.run.run_id or log.run_id
            log.display_name = record.run.display_name or log.display_name
            _update_config(log.config, record.run.config.update)
        elif kind == "config":
            _update_config(log.config, record.config.update)
        elif kind == "history":
            values = {_item_key(item): _number(item.value_json) for item in record.history.item}
            step = values.pop("_step", None)
            if step is None or not math.isfinite(step):
                step = float(record.history.step.num)
            if not STEP_RANGE[0] <= step < STEP_RANGE[1]:
                out_of_range += 1
                continue
            kept = [(key, value) for key, value in values.items()
                    if value is not None and not key.startswith("_")]
            cells.add(int(step), tuple(key for key, _ in kept), [value for _, value in kept])
    if undecodable:
        log.notes.append(f"{undecodable} record(s) could not be decoded with this wandb "
                         "version and were skipped")
    if out_of_range:
        log.notes.append(f"{out_of_range} history row(s) had a step outside the 64-bit range "
                         "and were skipped")
    if len(cells):
        # A later record replaces an earlier one at the same step, NaN or not (dict update).
        log.history, table_notes = cells.table(nan_wins=True)
        log.notes.extend(table_notes)
    return log


def _update_config(config: dict[str, object], items) -> None:
    for item in items:
        key = _item_key(item)
        if key.startswith("_"):
            continue
        try:
            config[key] = json.loads(item.value_json)
        except (ValueError, RecursionError):
            continue
