"""Parsers on SYNTHETIC logs (curves/synthetic.py) in every format and quirk we read."""

from __future__ import annotations

import gzip
import math

import numpy as np
import pandas as pd
import pytest

from curves.parse import LogFormatError, detect_format, read_log
from curves.runs import guess_method, resolve_metrics, validation_dataset
from curves.synthetic import (
    console_line,
    synthetic_run,
    write_console,
    write_jsonl,
    write_parquet,
    write_tensorboard,
    write_wandb_chart_csv,
    write_wandb_single_csv,
)

LIK = "actor/pos_avg_old_log_prob"
REWARD = "critic/score/mean"


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return synthetic_run("grpo", steps=60, seed=3)


# --------------------------------------------------------------------------- console

@pytest.mark.parametrize("style", ["plain", "np", "ansi"])
def test_console_styles_read_the_same_values(tmp_path, table, style):
    path = write_console(tmp_path / "synthetic.log", [("synthetic-grpo", table)], style=style)
    parsed = read_log(path)
    assert parsed.format == "verl-console"
    (run,) = parsed.runs
    assert run.name == "synthetic-grpo"  # from experiment_name in the config dump
    assert run.rounded
    assert list(run.table.index) == list(range(1, 61))
    np.testing.assert_allclose(run.table[LIK], table[LIK].round(3), atol=1e-9)
    # Validation keys exist on every 10th step only; elsewhere they are missing, not zero.
    val = run.table["val/test_score/nq"]
    assert val.notna().sum() == 6
    assert val.loc[10] == pytest.approx(table.loc[10, "val/test_score/nq"], abs=1e-3)


def test_console_nan_inf_and_bad_pairs(tmp_path):
    lines = [
        "step:1 - actor/grad_norm:nan - critic/score/mean:0.1 - actor/pg_loss:inf",
        "step:2 - actor/grad_norm:np.float64(-inf) - critic/score/mean:np.float32(0.2)",
        "step:3 - garbage without pairs",
        "step:4 - critic/score/mean:0.4 - actor/lr:tensor(1e-6, device='cuda:0') - "
        "note:hello",
        "step:5 - critic/score/mean:0.5 - actor/grad_norm:0.3 - actor/pg_lo",  # cut off
    ]
    path = tmp_path / "quirks.log"
    path.write_text("\n".join(lines))
    parsed = read_log(path)
    table = parsed.runs[0].table
    assert math.isnan(table.loc[1, "actor/grad_norm"])
    assert table.loc[1, "actor/pg_loss"] == math.inf
    assert table.loc[2, "actor/grad_norm"] == -math.inf
    assert table.loc[2, REWARD] == pytest.approx(0.2)
    assert table.loc[4, "actor/lr"] == pytest.approx(1e-6)
    assert 3 not in table.index
    assert table.loc[5, "actor/grad_norm"] == pytest.approx(0.3)
    assert parsed.bad_lines == 1
    text = " ".join(parsed.notes)
    assert "1 step line(s) could not be parsed" in text
    assert "2 key:value pair(s)" in text  # 'note:hello' and the cut-off 'actor/pg_lo'
    assert "does not end with a newline" in text


def test_console_ignores_global_step_keys_and_noise(tmp_path):
    row = pd.Series({"training/global_step": 7.0, REWARD: 0.5})
    path = tmp_path / "noise.log"
    path.write_text(
        "Traceback (most recent call last):\n  ValueError: step:999 is not a step line\n"
        "Training Progress:  3%|#  | 7/200 [00:07<03:13, 1.0it/s]\r"
        + console_line(7, row) + "\n"
    )
    run = read_log(path).runs[0]
    assert list(run.table.index) == [7]
    assert run.table.loc[7, "training/global_step"] == 7


def test_console_resumed_run_later_value_wins(tmp_path, table):
    first = table.loc[1:40]
    resumed = table.loc[30:60].copy()
    resumed[REWARD] = resumed[REWARD] + 1.0  # tell the two copies of steps 30-40 apart
    path = write_console(tmp_path / "resume.log",
                         [("synthetic-resume", first), ("synthetic-resume", resumed)])
    parsed = read_log(path)
    (run,) = parsed.runs
    assert list(run.table.index) == list(range(1, 61))
    assert run.table.loc[35, REWARD] == pytest.approx(resumed.loc[35, REWARD], abs=1e-3)
    assert run.table.loc[29, REWARD] == pytest.approx(first.loc[29, REWARD], abs=1e-3)
    assert any("resumed at step 30" in note and "later values are kept" in note
               for note in run.notes)


def test_console_two_runs_in_one_file_are_split(tmp_path, table):
    other = synthetic_run("llds", steps=30, seed=4)
    path = write_console(tmp_path / "two.log",
                         [("synthetic-grpo-lambda0.0", table), ("synthetic-llds-lambda0.2", other)])
    parsed = read_log(path)
    assert [r.name for r in parsed.runs] == ["synthetic-grpo-lambda0.0", "synthetic-llds-lambda0.2"]
    assert [r.method for r in parsed.runs] == ["GRPO", "LLDS"]
    assert len(parsed.runs[1].table) == 30
    assert any("holds 2 runs" in note for note in parsed.notes)


def test_console_restart_without_names_gets_numbered(tmp_path, table):
    path = tmp_path / "restart.log"
    lines = [console_line(int(s), r) for s, r in table.loc[1:20].iterrows()]
    lines += [console_line(int(s), r) for s, r in table.loc[1:10].iterrows()]
    path.write_text("\n".join(lines) + "\n")
    names = [r.name for r in read_log(path).runs]
    assert names == ["restart", "restart #2"]


def test_console_validation_line_for_same_step_is_merged(tmp_path):
    path = tmp_path / "val.log"
    path.write_text("step:5 - critic/score/mean:0.3\nstep:5 - val/test_score/nq:0.25\n"
                    "step:6 - critic/score/mean:0.31\n")
    (run,) = read_log(path).runs
    assert run.table.loc[5, "val/test_score/nq"] == pytest.approx(0.25)
    assert run.table.loc[5, REWARD] == pytest.approx(0.3)


def test_console_found_after_long_startup_output(tmp_path):
    path = tmp_path / "late.txt"
    with open(path, "w") as handle:
        for i in range(3000):
            handle.write(f"(WorkerDict pid={i}) INFO loading shard {i} of the model weights\n")
        handle.write("step:1 - critic/score/mean:0.2\nstep:2 - critic/score/mean:0.3\n")
    assert path.stat().st_size > 64 * 1024
    assert detect_format(str(path)) == "verl-console"
    assert len(read_log(path).runs[0].table) == 2


# --------------------------------------------------------------------------- other formats

@pytest.mark.parametrize("step_field", ["step", "_step"])
def test_jsonl(tmp_path, table, step_field):
    path = write_jsonl(tmp_path / "synthetic.jsonl", table, step_field=step_field)
    with open(path, "a") as handle:
        handle.write('{"step": 61, "critic/score/me')  # truncated last line
    parsed = read_log(path)
    assert parsed.format == "jsonl"
    run = parsed.runs[0]
    assert not run.rounded
    np.testing.assert_allclose(run.table[LIK], table[LIK])
    assert parsed.bad_lines == 1
    assert any("truncated" in note for note in parsed.notes)


def test_jsonl_nested_and_named_runs(tmp_path):
    path = tmp_path / "nested.jsonl"
    path.write_text(
        '{"step": 1, "experiment_name": "synthetic-a", "critic": {"score": {"mean": 0.1}}}\n'
        '{"step": 2, "experiment_name": "synthetic-a", "critic": {"score": {"mean": 0.2}}}\n'
        '{"step": 1, "experiment_name": "synthetic-b-llds", "critic": {"score": {"mean": 0.5}}}\n'
    )
    runs = read_log(path).runs
    assert [r.name for r in runs] == ["synthetic-a", "synthetic-b-llds"]
    assert runs[0].table.loc[2, REWARD] == pytest.approx(0.2)


@pytest.mark.parametrize("step_col", ["_step", "Step"])
def test_wandb_single_run_csv(tmp_path, table, step_col):
    path = write_wandb_single_csv(tmp_path / "synthetic-run.csv", table, step_col=step_col)
    parsed = read_log(path)
    assert parsed.format == "wandb-csv"
    (run,) = parsed.runs
    assert "_runtime" not in run.table.columns
    np.testing.assert_allclose(run.table[REWARD], table[REWARD])


def test_wandb_chart_export_splits_runs_and_drops_bands(tmp_path, table):
    other = synthetic_run("llds", steps=60, seed=5)
    path = write_wandb_chart_csv(tmp_path / "chart.csv",
                                 [("synthetic-grpo", table), ("synthetic-llds", other)],
                                 [REWARD, LIK])
    parsed = read_log(path)
    assert [r.name for r in parsed.runs] == ["synthetic-grpo", "synthetic-llds"]
    assert sorted(parsed.runs[1].table.columns) == sorted([REWARD, LIK])
    np.testing.assert_allclose(parsed.runs[1].table[LIK], other[LIK])
    assert any("__MIN/__MAX" in note for note in parsed.notes)


def test_plain_csv_with_step_column(tmp_path, table):
    path = tmp_path / "metrics.csv"
    table.reset_index().to_csv(path, index=False)
    parsed = read_log(path)
    assert parsed.format == "csv"
    assert len(parsed.runs[0].table) == 60


def test_parquet_history_named_from_file(tmp_path, table):
    path = write_parquet(tmp_path / "abc123-history.parquet", table)
    parsed = read_log(path)
    assert parsed.format == "wandb-parquet"
    assert parsed.runs[0].name == "abc123"
    assert "_timestamp" not in parsed.runs[0].table.columns
    np.testing.assert_allclose(parsed.runs[0].table[LIK], table[LIK])


def test_tensorboard_event_file_and_truncation(tmp_path, table):
    event_file = write_tensorboard(tmp_path / "runs" / "synthetic-tb-lambda0.2", table)
    parsed = read_log(event_file)
    assert parsed.format == "tensorboard"
    (run,) = parsed.runs
    assert run.name == "synthetic-tb-lambda0.2" and run.method == "LLDS"
    np.testing.assert_allclose(run.table[LIK], table[LIK], rtol=1e-6)  # float32 on disk
    cut = tmp_path / "cut.tfevents"
    data = event_file.read_bytes()
    cut.write_bytes(data[: len(data) - 7])
    parsed_cut = read_log(cut)
    assert parsed_cut.runs[0].table.shape[0] == 60
    assert any("truncated" in note for note in parsed_cut.notes)


def test_format_comes_from_content_not_name(tmp_path, table):
    pq = write_parquet(tmp_path / "looks-like.log", table)
    js = write_jsonl(tmp_path / "looks-like.csv", table)
    console = write_console(tmp_path / "looks-like.json", [("synthetic", table)])
    assert detect_format(str(pq)) == "wandb-parquet"
    assert detect_format(str(js)) == "jsonl"
    assert detect_format(str(console)) == "verl-console"


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "empty"),
        (b"\n\n  \n", "blank"),
        (bytes(range(256)) * 40, "binary"),
        ("step:1 - critic/score/mean:0.5 caf\xe9\n".encode("latin-1") * 3, "not UTF-8"),
        ("step:1 - critic/score/mean:0.5\n".encode("utf-16"), "UTF-16"),
        (gzip.compress(b"step:1 - critic/score/mean:0.5\n"), "gzip"),
        (b"PK\x03\x04rest-of-a-zip", "zip"),
        (b"hello world\nthis is not a log\n", "unknown format"),
        (b"a,b,c\n1,2,3\n4,5,6\n", "no step column"),
        (b"step:1 - foo/bar:0.5 - baz:1\n", "keys found: baz, foo/bar"),
        (b"PAR1 this parquet file was cut off", "damaged or truncated"),
    ],
)
def test_bad_inputs_raise_clear_errors(tmp_path, content, expected):
    path = tmp_path / "upload"
    path.write_bytes(content)
    with pytest.raises(LogFormatError, match=expected):
        read_log(path)


def test_unknown_format_error_names_the_formats(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("just some notes\n")
    with pytest.raises(LogFormatError) as info:
        read_log(path)
    for name in ("verl console", "Weights & Biases", "JSON lines", "TensorBoard", "CSV"):
        assert name in str(info.value)


def test_size_limit(tmp_path):
    path = tmp_path / "big.log"
    path.write_text("step:1 - critic/score/mean:0.5\n" * 100)
    with pytest.raises(LogFormatError, match="over the 0 MB limit"):
        read_log(path, max_bytes=1000)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(LogFormatError, match="cannot open"):
        read_log(tmp_path / "nope.log")
    with pytest.raises(LogFormatError, match="folder"):
        read_log(tmp_path)


def test_truncated_parquet(tmp_path, table):
    path = write_parquet(tmp_path / "x-history.parquet", table)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(LogFormatError, match="damaged or truncated"):
        read_log(path)


# --------------------------------------------------------------------------- runs / metrics

@pytest.mark.parametrize(
    ("name", "method"),
    [
        ("nq-search-r1-grpo-qwen2.5-3b-lambda0.2", "LLDS"),
        ("nq-search-r1-grpo-qwen2.5-3b-lambda_0.1", "LLDS"),
        ("nq-search-r1-grpo-qwen2.5-3b-lambda0.0", "GRPO"),
        ("llds-lambda0", "GRPO"),  # the LLDS fork with lambda 0 is plain GRPO
        ("LLDS-A-GRPO-Qwen2.5-3B-Base", "LLDS"),
        ("grpo-noreduce-run", "LLDS"),
        ("search-r1-grpo-qwen2.5-7b", "GRPO"),
        ("run-42", "GRPO"),
    ],
)
def test_guess_method(name, method):
    assert guess_method(name)[0] == method


def test_guess_method_from_logged_coefficient():
    table = pd.DataFrame({"actor/loss_noreduce_coef": [0.2, 0.2]}, index=[1, 2])
    assert guess_method("run-42", table) == ("LLDS", "actor/loss_noreduce_coef = 0.2")


def test_resolve_metrics_maps_verl_keys():
    columns = [LIK, "actor/neg_avg_old_log_prob", REWARD, "critic/rewards/mean",
               "actor/grad_norm", "actor/entropy_loss", "actor/loss_noreduce",
               "env/number_of_valid_search", "val/test_score/nq",
               "val-core/hotpotqa/acc/mean@1", "val/other_thing", "custom/key"]
    found = resolve_metrics(columns)
    assert found["lik_pos"] == LIK
    assert found["reward"] == REWARD  # score preferred over rewards
    assert found["entropy"] == "actor/entropy_loss"
    assert found["llds_penalty"] == "actor/loss_noreduce"
    assert found["val:nq"] == "val/test_score/nq"
    assert found["val:hotpotqa"] == "val-core/hotpotqa/acc/mean@1"
    assert "custom/key" not in found.values() and "val/other_thing" not in found.values()
    assert validation_dataset("val-core/nq/acc/std@4") is None
