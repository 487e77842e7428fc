"""nano/checkpoint.py: a save killed at any point leaves a resumable checkpoint (the one
before or the new one, never a mix, never a crash on the next save), leftovers of earlier
kills are tidied, and a state file that would run code is refused."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from nano import checkpoint

# Every file-system call a save makes goes through one of these (Path.rename and .mkdir,
# os.replace, and shutil.rmtree's unlink/rmdir); a kill can land before any of them.
FS_CALLS = ("rename", "replace", "unlink", "rmdir", "mkdir")


class Killed(Exception):
    """Stands for the process being killed at that point."""


class KillSwitch:
    """Raises Killed at the n-th file-system call (or file written by the model writer)."""

    def __init__(self, at: int):
        self.at, self.calls = at, 0

    def tick(self) -> None:
        self.calls += 1
        if self.calls == self.at:
            raise Killed(f"call {self.at}")

    def install(self, monkeypatch) -> None:
        for name in FS_CALLS:
            real = getattr(os, name)

            def wrapper(*args, _real=real, **kwargs):
                self.tick()
                return _real(*args, **kwargs)

            monkeypatch.setattr(os, name, wrapper)


def _writer(step: int, switch: KillSwitch | None = None):
    """Writes a model's worth of files, each tagged with the step."""
    def write(path: Path) -> None:
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            if switch is not None:
                switch.tick()
            (path / name).write_text(f"step {step}")
    return write


def _check(directory: Path, allowed: set[int]) -> int:
    """The checkpoint is whole (every file from one step) and no leftover remains."""
    step = checkpoint.load_state(directory)["step"]
    assert step in allowed
    files = sorted(p.name for p in directory.iterdir())
    assert files == ["config.json", "model.safetensors", "state.pt", "tokenizer.json"]
    assert {(directory / f).read_text() for f in files if f != "state.pt"} == {f"step {step}"}
    assert sorted(p.name for p in directory.parent.iterdir()) == [directory.name]
    return step


@pytest.mark.parametrize("previous", [True, False], ids=["rotation", "first-save"])
def test_a_kill_at_any_point_of_a_save_leaves_a_resumable_checkpoint(tmp_path, monkeypatch,
                                                                     previous):
    outcomes: set[int] = set()
    at = 0
    while True:
        at += 1
        directory = tmp_path / f"run{at}" / "checkpoint"
        directory.parent.mkdir()
        if previous:
            checkpoint.save(directory, _writer(1), {"step": 1})
        switch = KillSwitch(at)
        with monkeypatch.context() as patch:
            switch.install(patch)
            try:
                checkpoint.save(directory, _writer(2, switch), {"step": 2})
                finished = True
            except Killed:
                finished = False
        if not previous and not checkpoint.exists(directory):
            outcomes.add(0)  # killed before the first save was complete: nothing to resume
            assert not finished
        else:
            outcomes.add(_check(directory, {1, 2} if previous else {2}))
        # The next save after the kill works, and is what a resume reads.
        checkpoint.save(directory, _writer(3), {"step": 3})
        assert _check(directory, {3}) == 3
        if finished:
            break
    # mkdir, three files, the state's rename, (checkpoint -> .old,) .tmp -> checkpoint,
    # (.old's files and directory removed): each was a kill point
    assert at == (13 if previous else 7)  # the last try ran through: no call left
    assert outcomes == ({1, 2} if previous else {0, 2})


def test_leftovers_of_earlier_kills_are_resolved(tmp_path):
    def made(name: str, step: int, state: bool = True) -> Path:
        path = tmp_path / name
        path.mkdir(parents=True)
        _writer(step)(path)
        if state:
            torch.save({"step": step}, path / "state.pt")
        return path

    # Killed while removing checkpoint.old: it is half gone; the next save used to crash.
    made("a/checkpoint", 2)
    (made("a/checkpoint.old", 1) / "config.json").unlink()
    made("a/checkpoint.partial", 0, state=False)
    assert _check(tmp_path / "a" / "checkpoint", {2}) == 2
    checkpoint.save(tmp_path / "a" / "checkpoint", _writer(3), {"step": 3})
    assert _check(tmp_path / "a" / "checkpoint", {3}) == 3
    # Killed between the two renames: the finished new copy wins over the old one.
    made("b/checkpoint.old", 1)
    made("b/checkpoint.tmp", 2)
    assert checkpoint.exists(tmp_path / "b" / "checkpoint")
    assert _check(tmp_path / "b" / "checkpoint", {2}) == 2
    # ... unless the new copy was not finished: then the old one is the checkpoint.
    made("c/checkpoint.old", 1)
    made("c/checkpoint.tmp", 2, state=False)
    assert _check(tmp_path / "c" / "checkpoint", {1}) == 1
    # An unfinished first save is no checkpoint, and is cleared by the next save.
    made("d/checkpoint.tmp", 1, state=False)
    assert not checkpoint.exists(tmp_path / "d" / "checkpoint")
    checkpoint.save(tmp_path / "d" / "checkpoint", _writer(1), {"step": 1})
    assert _check(tmp_path / "d" / "checkpoint", {1}) == 1


class _RunsCode:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (str(self.marker),)


def test_a_state_file_that_would_run_code_is_refused(tmp_path):
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    marker = tmp_path / "code-ran"
    torch.save({"step": 1, "payload": _RunsCode(marker)}, directory / "state.pt")
    with pytest.raises(checkpoint.CheckpointError, match="run code"):
        checkpoint.load_state(directory)
    assert not marker.exists()


def test_the_trainers_real_state_loads_with_weights_only(tmp_path):
    """What the two trainers store (AdamW and LambdaLR state, torch and Python random
    states, a loss history of tuples) passes the weights-only loader unchanged."""
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "step": 7, "history": [(1, 0.5, 0.25)], "elapsed": 1.5,
             "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
             "config": {"lr": 1e-3, "answer_lambda": None, "method": "grpo"}}
    directory = tmp_path / "checkpoint"
    checkpoint.save(directory, lambda _: None, state)
    loaded = checkpoint.load_state(directory)
    assert loaded["step"] == 7 and loaded["history"] == [(1, 0.5, 0.25)]
    assert loaded["rng"]["python"] == random.getstate()
    assert torch.equal(loaded["rng"]["torch"], state["rng"]["torch"])
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fresh.load_state_dict(loaded["optimizer"])
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"],
                       optimizer.state_dict()["state"][0]["exp_avg"])
