"""A W&B run's transaction log (`run-<id>.wandb`), the file an offline run writes.

The file is a LevelDB-style log: a 7-byte header (`:W&B`, magic 0xBEE1, version 0), then
32 KiB blocks of records, each with a 7-byte header (CRC-32 of type + payload, payload
length, type: full / first / middle / last piece). Each record is a protobuf `Record`
whose schema ships with the wandb SDK (`wandb.proto.wandb_internal_pb2`); without the SDK
the file cannot be decoded, and the error says so.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from curves.parse import STEP_RANGE, LogFormatError

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
_BLOCK = 32 * 1024
_PIECE_HEADER = struct.Struct("<IHB")
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
NEEDS_SDK = ("reading a .wandb file needs the wandb package (pip install wandb), whose "
             "record schema it is written in; or sync the run and export its history as CSV "
             "or parquet")


@dataclass
class WandbLog:
    """What a transaction log holds that curves uses."""

    run_id: str = ""
    display_name: str = ""
    config: dict[str, object] = field(default_factory=dict)
    history: dict[int, dict[str, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def table(self) -> pd.DataFrame:
        return pd.DataFrame.from_dict(self.history, orient="index")


def is_wandb_log(path: str | Path) -> bool:
    with open(path, "rb") as handle:
        return handle.read(4) == HEADER[:4]


def _records(data: bytes, notes: list[str]) -> list[bytes]:
    """Payloads of the log's records, pieces joined; stops at a damaged or cut-off piece."""
    records: list[bytes] = []
    pending: bytes | None = None
    pos = len(HEADER)
    while pos < len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _PIECE_HEADER.size:  # block trailer: zero padding
            pos += left
            continue
        crc, length, kind = _PIECE_HEADER.unpack_from(data, pos)
        payload = data[pos + _PIECE_HEADER.size: pos + _PIECE_HEADER.size + length]
        if kind == 0 and length == 0:  # padding at the end of a block
            pos += left
            continue
        if len(payload) < length or zlib.crc32(payload, zlib.crc32(bytes([kind]))) != crc:
            notes.append("the log ends in a damaged or cut-off record (was the run still "
                         "writing?); the records before it were read")
            break
        pos += _PIECE_HEADER.size + length
        if kind == _FULL:
            records.append(payload)
        elif kind == _FIRST:
            pending = payload
        elif kind == _MIDDLE and pending is not None:
            pending += payload
        elif kind == _LAST and pending is not None:
            records.append(pending + payload)
            pending = None
    return records


def _number(value_json: str) -> float | None:
    try:
        value = json.loads(value_json)
    except ValueError:
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
        data = handle.read()
    if not data.startswith(HEADER[:4]):
        raise LogFormatError("not a W&B transaction log (no :W&B header)")
    if data[:len(HEADER)] != HEADER:
        raise LogFormatError("this .wandb file has a log version we do not know; export the "
                             "run's history as CSV or parquet instead")
    log = WandbLog()
    undecodable = out_of_range = 0
    for payload in _records(data, log.notes):
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
            row = log.history.setdefault(int(step), {})
            row.update((key, value) for key, value in values.items()
                       if value is not None and not key.startswith("_"))
    if undecodable:
        log.notes.append(f"{undecodable} record(s) could not be decoded with this wandb "
                         "version and were skipped")
    if out_of_range:
        log.notes.append(f"{out_of_range} history row(s) had a step outside the 64-bit range "
                         "and were skipped")
    return log


def _update_config(config: dict[str, object], items) -> None:
    for item in items:
        key = _item_key(item)
        if key.startswith("_"):
            continue
        try:
            config[key] = json.loads(item.value_json)
        except ValueError:
            continue
