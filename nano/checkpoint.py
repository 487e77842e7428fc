"""Training checkpoints on disk, shared by both trainers (`nano train`, `nano rl`).

A checkpoint is the directory `checkpoint/`: the model's files and `state.pt` (optimizer,
step, random states: tensors and plain Python values only). A save writes all of
`checkpoint.tmp/`, `state.pt` last (itself written under another name and renamed, so its
presence means the write finished), then rotates: `checkpoint/` -> `checkpoint.old/`,
`checkpoint.tmp/` -> `checkpoint/`, and `checkpoint.old/` is removed.

A kill can stop that sequence anywhere; `recover` turns every state it can leave into one
complete `checkpoint/` (or none, if no save ever finished):
  - `checkpoint/` present: it is complete (only a finished write is renamed to that name);
    the leftovers `.tmp`, `.old` (and `.partial`, an earlier trainer's name) are removed;
  - `checkpoint/` missing: the newest complete copy is renamed into place: `.tmp` when its
    `state.pt` is there (killed between the two renames, or before the first rotation),
    else `.old` (killed after the first rename, before `.tmp` was complete).
State files are loaded with `torch.load(weights_only=True)`: a crafted file that would run
code when unpickled is refused.
"""

from __future__ import annotations

import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

STATE = "state.pt"
TMP, OLD = ".tmp", ".old"
LEFTOVERS = (TMP, OLD, ".partial")  # ".partial": the name an earlier RL trainer wrote


class CheckpointError(Exception):
    """A checkpoint that cannot be used; the message says why and what to do."""


def _sibling(directory: Path, suffix: str) -> Path:
    return directory.with_name(directory.name + suffix)


def _complete(directory: Path) -> bool:
    return (directory / STATE).is_file()


def exists(directory: Path) -> bool:
    """Whether a run can resume from `directory` (once `recover` has tidied it)."""
    directory = Path(directory)
    return (_complete(directory) or _complete(_sibling(directory, TMP))
            or _sibling(directory, OLD).is_dir())


def check_out(out: Path, resume: bool) -> None:
    """A ValueError unless a trainer may write to `out`: a directory (or nothing yet) that
    holds no run, or one whose run it goes on with (`resume`): runs are never mixed."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; the run needs a directory: pass another "
                         "--out.")
    if exists(out / "checkpoint") and not resume:
        raise ValueError(f"--out {out} already holds a run (checkpoint/): pass --resume to go "
                         "on with it, or choose another --out.")


def recover(directory: Path) -> None:
    """Bring what an interrupted save left back to one complete checkpoint (see above)."""
    directory = Path(directory)
    tmp, old = _sibling(directory, TMP), _sibling(directory, OLD)
    if not directory.exists():
        if _complete(tmp):
            tmp.rename(directory)
        elif old.is_dir():
            old.rename(directory)
    for suffix in LEFTOVERS:
        leftover = _sibling(directory, suffix)
        if leftover.is_dir():
            shutil.rmtree(leftover)


def save(directory: Path, write_files: Callable[[Path], None], state: dict[str, Any]) -> None:
    """Write a checkpoint: `write_files(path)` fills the new directory (model, tokenizer,
    config), `state` goes to its state.pt; then the rotation described above."""
    import torch

    directory = Path(directory)
    recover(directory)
    tmp, old = _sibling(directory, TMP), _sibling(directory, OLD)
    tmp.mkdir(parents=True)
    write_files(tmp)
    torch.save(state, tmp / (STATE + ".part"))
    os.replace(tmp / (STATE + ".part"), tmp / STATE)
    if directory.exists():
        directory.rename(old)
    tmp.rename(directory)
    if old.exists():
        shutil.rmtree(old)


def load_state(directory: Path) -> dict[str, Any]:
    """The state of the checkpoint in `directory` (after `recover`)."""
    import torch

    directory = Path(directory)
    recover(directory)
    path = directory / STATE
    if not path.is_file():
        raise CheckpointError(f"{directory} holds no {STATE}, so the run cannot resume from "
                              "it; choose another --out, or move that directory away to "
                              "start afresh.")
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"{path} holds objects other than tensors and plain values; it was refused "
            "because loading it would run code from the file. Resume only from checkpoints "
            f"this trainer wrote ({str(error).splitlines()[0]}).") from None
