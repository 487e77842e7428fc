"""`python -m nano data|train|rl`: flags built from the config dataclasses with NANO_* env
fallbacks, and bad flags or inputs refused with exit 2 before anything is read or written
(no training runs in these tests)."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from nano.__main__ import config_parser, main
from nano.build import DataConfig
from nano.rl import RLConfig
from nano.sft import TrainConfig

CONFIGS = {"data": DataConfig, "train": TrainConfig, "rl": RLConfig}


@pytest.fixture
def inputs(tmp_path) -> dict[str, Path]:
    """Files that pass the path checks (their contents are never read by these tests)."""
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "q", "golden_answers": ["a"]}\n')
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    a_file = tmp_path / "a-file"
    a_file.write_text("keep")
    return {"data": data, "tokenizer": tokenizer, "model": model, "file": a_file,
            "out": tmp_path / "out"}


@pytest.mark.parametrize("command", sorted(CONFIGS))
def test_every_field_is_a_flag_and_no_flag_is_hand_listed(command):
    config_class = CONFIGS[command]
    parser = config_parser(command, config_class)
    assert config_class(**vars(parser.parse_args([]))) == config_class()
    flags = {a.dest for a in parser._actions if a.dest != "help"}
    assert flags == {f.name for f in dataclasses.fields(config_class)}
    assert all(f.metadata.get("help") for f in dataclasses.fields(config_class))


def test_flags_env_fallbacks_and_renamed_flags(monkeypatch):
    monkeypatch.setenv("NANO_TRAIN_LR", "0.5")
    monkeypatch.setenv("NANO_TRAIN_FIRST_TURNS", "1")
    monkeypatch.setenv("NANO_RL_RESUME", "yes")
    monkeypatch.setenv("NANO_DATA_LIMIT", "")
    train = TrainConfig(**vars(config_parser("train", TrainConfig).parse_args(
        ["--heads", "8", "--init", "m"])))
    assert (train.lr, train.first_turns, train.heads, train.init) == (0.5, True, 8, Path("m"))
    rl = RLConfig(**vars(config_parser("rl", RLConfig).parse_args(
        ["--lambda", "0.3", "--answer-lambda", "0.1"])))
    assert (rl.llds_lambda, rl.answer_lambda, rl.resume) == (0.3, 0.1, True)
    data = DataConfig(**vars(config_parser("data", DataConfig).parse_args(
        ["--no-trajectories", "--benchmark-dir", "assets"])))
    assert (data.trajectories, data.benchmark, data.limit) == (False, Path("assets"), None)
    monkeypatch.setenv("NANO_TRAIN_STEPS", "many")
    with pytest.raises(SystemExit) as exit_:
        config_parser("train", TrainConfig).parse_args([])
    assert exit_.value.code == 2


def _refused(argv: list[str], capsys, message: str, *untouched: Path) -> None:
    before = {p: p.read_bytes() if p.is_file() else p.exists() for p in untouched}
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert {p: p.read_bytes() if p.is_file() else p.exists() for p in untouched} == before


@pytest.mark.parametrize("change, message", [
    (["--data", "missing.jsonl"], "--data missing.jsonl: no such file"),
    (["--tokenizer", "no-tokenizer"], "--tokenizer no-tokenizer: no tokenizer there"),
    (["--heads", "3"], "--heads 3 does not divide --hidden 256"),
    (["--threads", "0"], "--threads is 0"),
    (["--save-every", "0"], "--save-every is 0"),
    (["--out", "FILE"], "is a file"),
    (["--steps", "-5"], "--steps is -5"),
    (["--init", "no-model"], "--init no-model: no saved model"),
    (["--wire-induction", "--init", "MODEL"], "pass one of the two"),
])
def test_train_refuses_bad_flags_before_any_work(inputs, capsys, change, message):
    change = [str(inputs["file"]) if c == "FILE" else str(inputs["model"]) if c == "MODEL"
              else c for c in change]
    argv = ["train", "--data", str(inputs["data"]), "--tokenizer", str(inputs["tokenizer"]),
            "--out", str(inputs["out"]), *change]
    _refused(argv, capsys, message, inputs["out"], inputs["file"])


def test_train_refuses_an_existing_checkpoint_without_resume(inputs, capsys):
    import torch

    saved = inputs["out"] / "checkpoint"
    saved.mkdir(parents=True)
    torch.save({"step": 3}, saved / "state.pt")
    argv = ["train", "--data", str(inputs["data"]), "--tokenizer", str(inputs["tokenizer"]),
            "--out", str(inputs["out"])]
    _refused(argv, capsys, "already holds a run (checkpoint/): pass --resume", saved / "state.pt")
    # A save interrupted mid-rotation is a run too (it is recovered on --resume).
    saved.rename(inputs["out"] / "checkpoint.old")
    _refused(argv, capsys, "pass --resume", inputs["out"] / "checkpoint.old" / "state.pt")


@pytest.mark.parametrize("change, message", [
    (["--model", ""], "--model is required"),
    (["--model", "no-model"], "--model no-model: no model there"),
    (["--train-data", ""], "--train-data is required"),
    (["--train-data", "missing.jsonl"], "--train-data missing.jsonl: no such file"),
    (["--val-data", "missing.jsonl"], "--val-data missing.jsonl: no such file"),
    (["--steps", "0"], "--steps is 0"),
    (["--threads", "0"], "--threads is 0"),
    (["--save-every", "0"], "--save-every is 0"),
    (["--group-size", "0"], "--group-size is 0"),
    (["--lambda", "-1"], "--lambda is -1.0"),
    (["--top-p", "1.5"], "--top-p is 1.5"),
    (["--out", "FILE"], "is a file"),
])
def test_rl_refuses_bad_flags_before_any_work(inputs, capsys, change, message):
    change = [str(inputs["file"]) if c == "FILE" else c for c in change]
    argv = ["rl", "--model", str(inputs["model"]), "--train-data", str(inputs["data"]),
            "--out", str(inputs["out"]), *change]
    _refused(argv, capsys, message, inputs["out"], inputs["file"])


def test_rl_refuses_a_bad_question_file_before_writing(inputs, capsys):
    inputs["data"].write_text('{"query": "no question"}\n')
    argv = ["rl", "--model", str(inputs["model"]), "--train-data", str(inputs["data"]),
            "--out", str(inputs["out"])]
    _refused(argv, capsys, "no 'question' field", inputs["out"])


def test_rl_method_is_one_of_the_known(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["rl", "--method", "ppo"])
    assert exit_.value.code == 2 and "invalid choice: 'ppo'" in capsys.readouterr().err


def test_a_missing_torch_is_named(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(["rl", "--help"]) == 2
    assert "needs PyTorch, which is not installed" in capsys.readouterr().err


class _RunsCode:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.mkdir, (str(self.marker),)


def test_rl_resume_refuses_a_state_file_that_would_run_code(inputs, capsys):
    import torch

    saved = inputs["out"] / "checkpoint"
    saved.mkdir(parents=True)
    marker = inputs["out"] / "code-ran"
    torch.save({"step": 1, "payload": _RunsCode(marker)}, saved / "state.pt")
    argv = ["rl", "--model", str(inputs["model"]), "--train-data", str(inputs["data"]),
            "--out", str(inputs["out"]), "--resume"]
    assert main(argv) == 2
    assert "loading it would run code" in capsys.readouterr().err
    assert not marker.exists() and not (inputs["out"] / "command.txt").exists()
