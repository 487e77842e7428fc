"""JSON nested past Python's recursion limit in a log (issue 48): the line (or value, or side
file) that holds it is skipped and said so, the rest of the file is read. Before, json.loads'
RecursionError refused the whole file and its good rows were lost. SYNTHETIC values."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from curves import analyze_uploads
from curves.parse import detect_format, read_log
from curves.sources import read_source
from tests.test_curves_budget import _history_record, _wandb_file
from tests.test_curves_sources import _legacy_wandb_folder

REWARD = "critic/score/mean"
DEEP_LIST = "[" * 100_000 + "]" * 100_000
DEEP_DICT = '{"step": 1000, "x": ' + '{"a": ' * 100_000 + "1" + "}" * 100_001
SKIPPED = "2 line(s) were nested too deeply to read"


def _row(step: int) -> str:
    return json.dumps({"step": step, REWARD: step / 100, "actor/kl_loss": 0.01}) + "\n"


def _log(path: Path, deep_first: bool = False) -> Path:
    """49 good rows and the two deep lines (in the middle, or first)."""
    rows = [_row(step) for step in range(49)]
    deep = [DEEP_LIST + "\n", DEEP_DICT + "\n"]
    lines = deep + rows if deep_first else rows[:20] + deep[:1] + rows[20:40] + deep[1:] + \
        rows[40:]
    path.write_text("".join(lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("deep_first", [False, True], ids=["middle", "first"])
def test_a_line_nested_100000_deep_is_skipped_and_the_49_rows_kept(tmp_path, deep_first):
    path = _log(tmp_path / "train.jsonl", deep_first)
    assert detect_format(str(path)) == "jsonl"
    parsed = read_log(path)
    (run,) = parsed.runs
    assert list(run.table.index) == list(range(49))
    assert run.table[REWARD].tolist() == pytest.approx([step / 100 for step in range(49)])
    assert parsed.bad_lines == 2
    assert any(note.startswith(SKIPPED) for note in parsed.notes), parsed.notes


def test_the_tool_reports_the_skipped_lines_and_plots_the_run(tmp_path):
    """What the UI and `python -m curves` show: a warning, no error, the run analysed."""
    result = analyze_uploads([str(_log(tmp_path / "train.jsonl"))])
    assert not result.errors, [m.text for m in result.errors]
    assert [m.text[:len(SKIPPED)] for m in result.messages if m.level == "warning"] == [SKIPPED]
    assert [len(run.table) for run in result.runs] == [49] and result.analyses


def test_a_deep_line_first_in_a_long_file_is_still_json_lines(tmp_path):
    """The first line alone decides the format when it runs past the 64 KB head."""
    path = tmp_path / "train.jsonl"
    path.write_text(DEEP_DICT + "\n" + "".join(_row(step) for step in range(49)))
    assert detect_format(str(path)) == "jsonl"
    assert len(read_log(path).runs[0].table) == 49


def test_a_wandb_folder_with_deep_side_files_is_still_read(tmp_path):
    table = pd.DataFrame({REWARD: [i / 10 for i in range(60)]},
                         index=pd.Index(range(60), name="step"))
    folder = _legacy_wandb_folder(tmp_path, table)
    (folder / "files" / "wandb-summary.json").write_text(DEEP_LIST)
    (folder / "files" / "config.yaml").write_text("[" * 5000 + "]" * 5000)
    (run,) = read_source(folder).runs
    assert run.table[REWARD].tolist() == pytest.approx(table[REWARD].tolist())


def test_a_wandb_log_with_a_deep_value_keeps_its_rows(tmp_path):
    pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")
    deep = "[" * 5000 + "]" * 5000  # past the limit, and within one record of the log
    config = pb.Record(config=pb.ConfigRecord(update=[
        pb.ConfigItem(key="deep", value_json=deep),
        pb.ConfigItem(key="seed", value_json="7")])).SerializeToString()
    deep_row = pb.Record(history=pb.HistoryRecord(item=[
        pb.HistoryItem(key="_step", value_json="20"),
        pb.HistoryItem(key=REWARD, value_json="0.2"),
        pb.HistoryItem(key="deep", value_json=deep)])).SerializeToString()
    rows = [_history_record(step, {REWARD: step / 100}) for step in range(20)]
    path = _wandb_file(tmp_path / "run-abc.wandb", [config, *rows, deep_row])
    (run,) = read_source(path).runs
    assert list(run.table.index) == list(range(21)) and run.table[REWARD].iloc[-1] == 0.2
    assert run.params.get("seed") == "7"
