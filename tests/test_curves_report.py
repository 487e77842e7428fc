"""analyze_uploads, the figures, the HTML report and the CLI, on SYNTHETIC logs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from plotly.offline import get_plotlyjs

from curves import analyze_uploads
from curves.report import render_report
from curves.synthetic import (
    synthetic_run,
    write_console,
    write_parquet,
    write_wandb_chart_csv,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def uploads(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("uploads")
    grpo = synthetic_run("grpo", seed=0)
    llds = synthetic_run("llds", seed=1)
    bad = folder / "broken.bin"
    bad.write_bytes(b"\x00\xff" * 50)
    return {
        "grpo": write_console(folder / "synthetic-grpo.log",
                              [("synthetic-grpo-lambda0.0", grpo)], style="ansi"),
        "llds": write_parquet(folder / "synthetic-llds-lambda0.2-history.parquet", llds),
        "bad": bad,
    }


@pytest.fixture(scope="module")
def result(uploads):
    return analyze_uploads([str(uploads["grpo"]), str(uploads["llds"]), str(uploads["bad"])])


def test_bad_file_becomes_a_message_and_others_are_kept(result):
    assert [run.name for run in result.runs] == ["synthetic-grpo-lambda0.0",
                                                  "synthetic-llds-lambda0.2"]
    (error,) = result.errors
    assert error.source == "broken.bin" and "binary" in error.text
    assert list(result.summary["method"]) == ["GRPO", "LLDS"]
    assert list(result.summary["collapsed"]) == ["yes", "no"]


def test_likelihood_figure_overlays_both_runs_with_phases(result):
    fig = result.figures["likelihood"]
    names = [trace.name for trace in fig.data if trace.showlegend is not False]
    assert "synthetic-grpo-lambda0.0 [GRPO] pos (A≥0)" in names
    assert "synthetic-llds-lambda0.2 [LLDS] neg (A<0)" in names
    # Phases II and III of the GRPO run are shaded; the stable LLDS run has none.
    assert len([s for s in fig.layout.shapes if s.type == "rect"]) == 2
    labels = fig.layout.annotations
    texts = [a.text for a in labels]
    assert any(t.startswith("synthetic-grpo-lambda0.0: II @ ") for t in texts)
    assert any("steady decay" in a.hovertext for a in labels)  # the details on hover
    assert "II: steady decay, III: accelerated decay" in fig.layout.title.subtitle.text
    assert not any("synthetic-llds" in t for t in texts)
    hover = next(t.hovertemplate for t in fig.data if t.hovertemplate)
    assert "actor/pos_avg_old_log_prob" in hover and "raw" in hover
    panel = next(p for p in result.panels if p.id == "likelihood")
    # Plain words first, the precise term as a gloss.
    assert "at least their group's average (advantage ≥ 0" in panel.note
    assert "rounded to 3 decimals" in panel.note
    assert "rounded to 3 decimals" in fig.layout.title.subtitle.text


def test_panels_and_axes(result):
    ids = [panel.id for panel in result.panels]
    for expected in ("likelihood", "reward", "grad_norm", "entropy", "llds_penalty",
                     "valid_search", "validation"):
        assert expected in ids
    assert result.figures["grad_norm"].layout.yaxis.type == "log"
    ranges = {tuple(fig.layout.xaxis.range) for fig in result.figures.values()}
    assert ranges == {(1.0, 200.0)}  # one shared step axis
    spikes = [t for t in result.figures["grad_norm"].data if t.mode == "markers"]
    assert spikes and min(spikes[0].x) >= 150


def test_annotations_off_and_no_smoothing(uploads):
    plain = analyze_uploads([str(uploads["grpo"])], smoothing=0.0, annotate=False,
                            metrics=["actor/pg_loss", "no/such_key"])
    fig = plain.figures["likelihood"]
    assert not fig.layout.shapes and not fig.layout.annotations
    assert len(fig.data) == 2  # pos and neg, no faint raw copies
    assert "metric:actor/pg_loss" in plain.figures
    assert any("'no/such_key' is in none" in m.text for m in plain.messages)


def test_labels_override_and_unknown_names_warn(uploads):
    res = analyze_uploads([str(uploads["grpo"])],
                          labels={"synthetic-grpo-lambda0.0": "llds", "ghost": "GRPO"})
    assert res.runs[0].method == "LLDS" and res.summary.iloc[0]["method"] == "LLDS"
    assert any("no run named 'ghost'" in m.text for m in res.messages)


def test_export_preferred_over_console_log(tmp_path):
    table = synthetic_run("grpo", seed=2)
    console = write_console(tmp_path / "train.log", [("synthetic-same", table)])
    chart = write_wandb_chart_csv(tmp_path / "chart.csv", [("synthetic-same", table)],
                                  ["critic/score/mean", "actor/pos_avg_old_log_prob"])
    res = analyze_uploads([str(console), str(chart)])
    assert len(res.runs) == 1 and res.runs[0].source_format == "wandb-csv"
    assert any("console log is not used" in m.text for m in res.messages)


def test_nothing_readable_gives_messages_not_exceptions(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    res = analyze_uploads([str(empty), str(tmp_path / "missing.csv")])
    assert res.runs == [] and res.panels == [] and res.summary.empty
    assert [m.source for m in res.errors] == ["empty.log", "missing.csv"]
    assert "No run could be read" in render_report(res)


def test_html_report_is_self_contained(result):
    page = render_report(result)
    plotly_js = get_plotlyjs()
    assert page.count(plotly_js) == 1  # plotly.js inline, once
    ours = page.replace(plotly_js, "")
    assert not re.search(r"<script[^>]*\bsrc=", ours) and "cdn.plot.ly" not in ours
    assert "Plotly.newPlot" in ours
    assert page.count('id="panel-') == len(result.panels) >= 8
    specs = re.findall(r'Plotly\.newPlot\(\s*"panel-likelihood",\s*(\[.*?\]),\s*\{', page,
                       flags=re.S)
    names = {trace["name"] for trace in json.loads(specs[0])}
    assert "synthetic-grpo-lambda0.0 [GRPO] pos (A≥0)" in names
    assert "synthetic-llds-lambda0.2 [LLDS] pos (A≥0)" in names
    assert "<td>synthetic-grpo-lambda0.0</td>" in page and "broken.bin" in page
    assert "min_drop_z=5.0" in page


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "curves", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_cli_writes_report_and_prints_summary(uploads, tmp_path):
    out = tmp_path / "report.html"
    proc = _cli(str(uploads["grpo"]), str(uploads["llds"]), "--out", str(out),
                "--label", "synthetic-llds-lambda0.2=LLDS")
    assert proc.returncode == 0, proc.stderr
    assert "synthetic-grpo-lambda0.0" in proc.stdout and "steady decay onset" in proc.stdout
    assert out.exists() and "Plotly.newPlot" in out.read_text(encoding="utf-8")


@pytest.mark.slow
def test_cli_bad_file_exits_nonzero_without_traceback(uploads, tmp_path):
    proc = _cli(str(uploads["bad"]), "--out", str(tmp_path / "r.html"))
    assert proc.returncode == 1
    assert "broken.bin" in proc.stderr and "binary" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r.html").exists()
    proc = _cli(str(uploads["grpo"]), "--label", "x=PPO")
    assert proc.returncode == 2 and "NAME=GRPO" in proc.stderr


def test_cli_as_in_the_readme_two_train_logs_in_run_folders(tmp_path):
    """`python -m curves runs/grpo/train.log runs/llds-a/train.log --out report.html`
    on the shipped nano runs: same file name, same run name inside; both are plotted, told
    apart by their folders."""
    shipped = ROOT / "assets" / "nano-runs" / "preliminary"
    for folder, run in (("grpo", "s5-nano-grpo"), ("llds-a", "s5-nano-llds-a")):
        (tmp_path / "runs" / folder).mkdir(parents=True)
        text = (shipped / run / "train.log").read_text(encoding="utf-8")
        (tmp_path / "runs" / folder / "train.log").write_text(text, encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "curves", "runs/grpo/train.log",
                           "runs/llds-a/train.log", "--out", "report.html"], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "plotting failed" not in proc.stdout + proc.stderr
    assert "(grpo/train.log)" in proc.stdout and "(llds-a/train.log)" in proc.stdout
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    specs = re.findall(r"Plotly\.newPlot\(\s*\"[^\"]+\",\s*(\[.*?\]),\s*\{", page, re.S)
    names = {trace["name"] for spec in specs for trace in json.loads(spec)}
    assert any("grpo/train.log" in n for n in names), names
    assert any("llds-a/train.log" in n for n in names), names


def test_same_named_logs_are_told_apart_by_the_shortest_distinct_tail():
    from curves import _distinct_tails

    assert _distinct_tails([Path("a.log"), Path("x/train.log"), Path("y/train.log")]) == [
        "a.log", "x/train.log", "y/train.log"]
    assert _distinct_tails([Path("r/a/grpo/train.log"), Path("r/b/grpo/train.log")]) == [
        "a/grpo/train.log", "b/grpo/train.log"]
