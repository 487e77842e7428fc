"""Seed groups drawn as a mean with a band, and the displacement / anchor keys (SYNTHETIC)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from curves import analyze_uploads
from curves.analysis import analyse_run
from curves.plots import build_panels
from curves.runs import make_run
from curves.seeds import mean_band, seed_groups
from curves.synthetic import synthetic_run, write_jsonl

LIK = "actor/pos_avg_old_log_prob"
REWARD = "critic/score/mean"


def _run(name: str, shift: float = 0.0, params: dict | None = None, steps: int = 40):
    table = synthetic_run("grpo", steps=steps, seed=1)[[LIK, REWARD]] + shift
    return make_run(name, table, f"{name}.jsonl", "jsonl", params=params)


def test_seed_groups_by_name_and_by_config():
    runs = [_run("synthetic-grpo-seed0"), _run("synthetic-grpo-seed1"),
            _run("synthetic-grpo_seed2"), _run("synthetic-llds-lambda0.2-seed0"),
            _run("synthetic-a", params={"seed": "1", "lr": "1e-6", "experiment_name": "a"}),
            _run("synthetic-b", params={"seed": "2", "lr": "1e-6", "experiment_name": "b"}),
            _run("synthetic-c", params={"seed": "3", "lr": "3e-6"})]
    groups = seed_groups(runs)
    assert [(label, [r.name for r in members]) for label, members in groups] == [
        ("synthetic-grpo (mean of 3 seeds)",
         ["synthetic-grpo-seed0", "synthetic-grpo-seed1", "synthetic-grpo_seed2"]),
        ("synthetic (mean of 2 seeds)", ["synthetic-a", "synthetic-b"]),
    ]


def test_mean_band_minmax_and_standard_error():
    a = pd.Series([1.0, 2.0, 3.0], index=[1, 2, 3])
    b = pd.Series([3.0, 4.0], index=[1, 2])
    c = pd.Series([5.0, 9.0], index=[1, 2])
    minmax = mean_band([a, b, c], "minmax")
    assert list(minmax.index) == [1, 2, 3]
    np.testing.assert_allclose(minmax["mean"], [3.0, 5.0, 3.0])
    np.testing.assert_allclose(minmax["low"], [1.0, 2.0, 3.0])
    np.testing.assert_allclose(minmax["high"], [5.0, 9.0, 3.0])
    np.testing.assert_array_equal(minmax["n"], [3, 3, 1])
    se = mean_band([a, b, c], "se")
    spread = np.std([1.0, 3.0, 5.0], ddof=1) / np.sqrt(3)
    assert se.loc[1, "low"] == pytest.approx(3.0 - spread)
    assert se.loc[1, "high"] == pytest.approx(3.0 + spread)
    assert se.loc[3, "low"] == se.loc[3, "high"] == 3.0  # one run there: no spread
    with pytest.raises(ValueError, match="minmax, se"):
        mean_band([a], "iqr")


def _likelihood_traces(panels):
    (panel,) = [p for p in panels if p.id == "likelihood"]
    return panel.figure.data


def test_panels_draw_a_seed_group_as_mean_and_band():
    runs = [_run("synthetic-grpo-seed0", 0.0), _run("synthetic-grpo-seed1", 0.1),
            _run("synthetic-grpo-seed2", 0.2), _run("synthetic-lambda0.2", 0.5)]
    analyses = [analyse_run(run) for run in runs]
    plain = _likelihood_traces(build_panels(runs, analyses, smoothing=0))
    assert len(plain) == 4  # one line per run
    banded = _likelihood_traces(build_panels(runs, analyses, smoothing=0, band="minmax"))
    names = [trace.name for trace in banded]
    assert names.count("synthetic-grpo (mean of 3 seeds) [GRPO] pos (A≥0)") == 2  # band, mean
    panel = next(p for p in build_panels(runs, analyses, smoothing=0, band="minmax")
                 if p.id == "likelihood")
    assert panel.figure.layout.legend.title.text == "shaded: min-max over seeds"  # said once
    assert not any("seed1" in name for name in names)
    assert any(name.startswith("synthetic-lambda0.2") for name in names)
    fill, mean = banded[0], banded[1]
    assert fill.fill == "toself"
    expected = runs[0].table[LIK] + 0.1  # the middle run is the mean of the three
    np.testing.assert_allclose(mean.y, expected.to_numpy())
    np.testing.assert_allclose(np.asarray(fill.y)[: len(expected)], expected + 0.1)
    with pytest.raises(ValueError, match="band must be one of"):
        build_panels(runs, analyses, band="all")


def test_displacement_and_sparse_anchor_keys_are_plotted(tmp_path):
    table = synthetic_run("grpo", steps=50, seed=2)
    table["displacement/pos_logp"] = table[LIK] - 0.2
    table["displacement/zero_logp"] = table[LIK] - 0.3
    table["displacement/neg_logp"] = table[LIK] - 0.4
    table["displacement/ref_log_ratio"] = 0.01
    table["anchor/logp"] = np.where(table.index % 10 == 0, -0.7, np.nan)
    path = write_jsonl(tmp_path / "synthetic-nano.jsonl", table)
    result = analyze_uploads([str(path)], smoothing=0)
    assert not result.errors
    traces = {trace.name: trace for trace in _likelihood_traces(result.panels)}
    for suffix in ("pos (A≥0)", "A>0 per token", "A=0 per token", "A<0 per token",
                   "anchor set"):
        assert f"synthetic-nano [GRPO] {suffix}" in traces
    anchor = traces["synthetic-nano [GRPO] anchor set"]
    assert list(anchor.x) == [10, 20, 30, 40, 50]
    assert anchor.mode == "lines+markers"
    assert traces["synthetic-nano [GRPO] A>0 per token"].mode == "lines"
    assert "ref_log_ratio" in result.figures


def test_displacement_keys_alone_are_a_training_log(tmp_path):
    table = pd.DataFrame({"displacement/pos_logp": [-0.5, -0.6], "anchor/logp": [-1.0, -1.1]},
                         index=pd.Index([1, 2], name="step"))
    path = write_jsonl(tmp_path / "synthetic-only-displacement.jsonl", table)
    result = analyze_uploads([str(path)], smoothing=0)
    assert not result.errors and len(result.runs) == 1


def test_cli_seed_band(tmp_path, capsys):
    from curves.__main__ import main

    paths = [str(write_jsonl(tmp_path / f"synthetic-grpo-seed{i}.jsonl",
                             synthetic_run("grpo", steps=30, seed=i))) for i in range(2)]
    out = tmp_path / "report.html"
    assert main([*paths, "--seed-band", "se", "--out", str(out)]) == 0
    assert "synthetic-grpo (mean of 2 seeds)" in out.read_text()
    with pytest.raises(SystemExit) as info:
        main([*paths, "--seed-band", "iqr"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
