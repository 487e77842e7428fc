"""Logs whose metrics carry other trainers' names: plain `step,reward` CSVs and JSON lines,
TRL's names (`reward`, `kl`, `completions/mean_length`, with or without `train/`), the HF
Trainer's `trainer_state.json` (and a checkpoint folder holding one), and a visitor's own
column names (`reward=my_score`). The Training-curves tab in Chromium reads a simple CSV
and, refusing one, leaves no empty table. (Logs written by a real TRL run: test_trl.py.)"""

from __future__ import annotations

import json

import pytest

from curves import analyze_uploads
from curves.parse import LogFormatError, read_log
from curves.runs import column_aliases, known_names, resolve_metrics
from curves.sources import read_source


def write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return path


def test_plain_and_trl_names_map_to_the_panels():
    assert resolve_metrics(["step", "reward", "kl", "entropy", "response_length"]) == {
        "reward": "reward", "kl": "kl", "entropy": "entropy",
        "response_length": "response_length"}
    trl = resolve_metrics(["train/reward", "train/kl", "train/completions/mean_length",
                           "train/grad_norm", "train/loss"])
    assert trl == {"reward": "train/reward", "kl": "train/kl", "grad_norm": "train/grad_norm",
                   "response_length": "train/completions/mean_length"}
    # verl's name wins where a log has both.
    assert resolve_metrics(["critic/score/mean", "reward"])["reward"] == "critic/score/mean"
    assert "`completion_length`" in known_names() and "`critic/score/mean`" in known_names()


def test_a_visitors_simple_csv_and_jsonl_are_read(tmp_path):
    csv = write(tmp_path / "mine.csv", "step,reward\n" + "".join(
        f"{s},{s / 20:.2f}\n" for s in range(1, 21)))
    jsonl = write(tmp_path / "mine.jsonl", "".join(
        json.dumps({"step": s, "reward": s / 20, "kl": s / 100}) + "\n" for s in range(1, 21)))
    for path in (csv, jsonl):
        result = analyze_uploads([str(path)])
        assert not [m for m in result.messages if m.level == "error"], result.messages
        assert "Reward" in [p.title for p in result.panels]
        assert len(result.analyses) == 1


def test_a_visitors_own_column_names(tmp_path):
    path = write(tmp_path / "own.csv", "step,my_score,div\n1,0.1,0.0\n2,0.2,0.1\n3,0.4,0.2\n")
    with pytest.raises(LogFormatError, match=r"keys found: div, my_score.*reward=my_score"):
        read_log(path)
    parsed = read_source(path, column_aliases("reward=my_score, kl=div"))
    assert set(parsed.runs[0].table.columns) == {"critic/score/mean", "actor/kl_loss"}
    for bad, said in (("reward", "not metric=column"), ("happiness=x", "not a metric we plot"),
                      ("=x", "not metric=column")):
        with pytest.raises(ValueError, match=said):
            column_aliases(bad)
    assert column_aliases(" ") == {}


def trainer_state(history: list[dict]) -> str:
    """A trainer_state.json as the HF Trainer writes it (indent 2)."""
    return json.dumps({"best_metric": None, "epoch": 1.0, "global_step": history[-1]["step"],
                       "log_history": history, "logging_steps": 1, "max_steps": 10,
                       "trial_name": None}, indent=2)


def test_trainer_state_json_and_a_checkpoint_folder(tmp_path):
    history = [{"step": s, "epoch": s / 10, "reward": s / 10, "kl": s / 100, "loss": 0.1,
                "completions/mean_length": 40.0 + s, "rewards/em/mean": s / 10}
               for s in range(1, 6)]
    history.append({"step": 5, "eval_reward": 0.3, "epoch": 0.5})
    run = tmp_path / "grpo-run"
    for step in (2, 5):
        (run / f"checkpoint-{step}").mkdir(parents=True)
        write(run / f"checkpoint-{step}" / "trainer_state.json",
              trainer_state([h for h in history if h["step"] <= step]))
    parsed = read_log(run / "checkpoint-5" / "trainer_state.json")
    assert parsed.format == "trainer-state" and len(parsed.runs) == 1
    table = parsed.runs[0].table
    assert list(table.index) == [1, 2, 3, 4, 5] and table.loc[5, "eval_reward"] == 0.3
    assert parsed.runs[0].name == "grpo-run/checkpoint-5"
    folder = read_source(run)  # the output folder: its latest checkpoint's state
    assert list(folder.runs[0].table.index) == [1, 2, 3, 4, 5]
    deep = write(tmp_path / "trainer_state.json", '{"log_history": ' + "[" * 100_000
                 + "]" * 100_000 + "}")
    with pytest.raises(LogFormatError, match="not valid JSON"):
        read_log(deep)
    (tmp_path / "empty").mkdir()
    empty = write(tmp_path / "empty" / "trainer_state.json", trainer_state([{"step": 0}]))
    with pytest.raises(LogFormatError, match="no metric values found"):
        read_log(empty)


@pytest.mark.slow
@pytest.mark.browser
def test_the_tab_reads_a_simple_csv_names_a_column_and_leaves_no_empty_table(
        browser, tmp_path):
    from playwright.sync_api import expect

    from agent.testing import free_port
    from app.ui import build_app, launch_options
    from tests.browser import ARTIFACTS, require_chromium
    from tests.test_ui_curves_browser import NoDocuments, no_model

    require_chromium()
    own = write(tmp_path / "own.csv", "step,my_score\n" + "".join(
        f"{s},{s / 30:.3f}\n" for s in range(1, 31)))
    demo = build_app(no_model, NoDocuments())
    port = free_port()
    demo.launch(**launch_options(port=port, prevent_thread_lock=True, quiet=True))
    try:
        page = browser.new_context(viewport={"width": 1000, "height": 1100}).new_page()
        page.goto(f"http://127.0.0.1:{port}/")
        page.get_by_role("tab", name="Training curves").click()
        page.locator("#curves-files input[type=file]").set_input_files(str(own))
        messages = page.locator("#curves-messages")
        expect(messages).to_contain_text("no recognised training metric", timeout=60_000)
        expect(messages).to_contain_text("my_score")
        expect(page.locator("#curves-summary")).to_be_hidden()
        page.locator("#curves-aliases textarea, #curves-aliases input").first.fill(
            "reward=my_score")
        page.locator("#curves-analyze").click()
        expect(page.locator("#curves-summary")).to_be_visible(timeout=60_000)
        expect(page.locator("#curves-summary")).to_contain_text("own")
        expect(messages).not_to_contain_text("no recognised training metric")
        expect(page.locator(".js-plotly-plot").first).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "curves-own-names.png"), full_page=True)
        page.context.close()
    finally:
        demo.close()
