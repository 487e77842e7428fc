"""The phase rule on SYNTHETIC curves with known phases (curves/synthetic.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from agent.testing import ROOT
from curves.analysis import (
    PhaseRule,
    analyse_run,
    centred_mean,
    detect_phases,
    grad_spikes,
    reward_collapse,
    summary_table,
)
from curves.plots import ema
from curves.runs import make_run
from curves.sources import read_source
from curves.synthetic import SyntheticPhases, synthetic_run

LIK = "actor/pos_avg_old_log_prob"
SHIPPED = ROOT / "assets" / "nano-runs"  # the nano runs this repository ships


def _shipped(run: str):
    log = SHIPPED / run / "metrics.jsonl"
    if not log.is_file():
        pytest.skip(f"{log} is not in this checkout")
    return read_source(str(log)).runs[0]


def _run(kind: str, seed: int = 0, **kwargs):
    return make_run(f"synthetic-{kind}-{seed}", synthetic_run(kind, seed=seed, **kwargs),
                    "synthetic", "csv")


@pytest.mark.parametrize("seed", range(5))
def test_known_onsets_found_within_tolerance(seed):
    truth = SyntheticPhases()
    a = analyse_run(_run("grpo", seed))
    assert a.decay_onset is not None and abs(a.decay_onset - truth.decay_at) <= 12
    assert a.accel_onset is not None and abs(a.accel_onset - truth.accel_at) <= 8
    assert a.reward_collapse_step is not None
    assert 0 <= a.reward_collapse_step - truth.collapse_at <= 10
    assert [label for label, _, _ in a.phases()] == ["I", "II", "III"]
    assert a.likelihood_change < -1.0


@pytest.mark.parametrize(("decay_at", "accel_at"), [(40, 150), (100, 160)])
def test_other_phase_positions(decay_at, accel_at):
    phases = SyntheticPhases(decay_at=decay_at, accel_at=accel_at, collapse_at=accel_at + 40,
                             steps=250)
    run = make_run("synthetic", synthetic_run("grpo", steps=250, seed=1, phases=phases),
                   "synthetic", "csv")
    a = analyse_run(run)
    assert abs(a.decay_onset - decay_at) <= 12
    assert abs(a.accel_onset - accel_at) <= 8


@pytest.mark.parametrize("kind", ["flat", "llds"])
@pytest.mark.parametrize("seed", range(8))
def test_stable_runs_report_no_phase_and_no_collapse(kind, seed):
    a = analyse_run(_run(kind, seed))
    assert a.decay_onset is None and a.accel_onset is None
    assert a.reward_collapse_step is None and a.grad_spikes == []
    assert a.phases() == []
    assert any("no decline met the phase-II rule" in note for note in a.notes)


def test_too_few_steps_claims_nothing():
    a = analyse_run(_run("grpo", steps=20))
    assert a.decay_onset is None and a.reward_collapse_step is None
    assert any("at least 30" in note for note in a.notes)
    assert any("collapse not judged" in note for note in a.notes)


def test_steady_decay_without_acceleration():
    steps = np.arange(1, 201)
    values = np.where(steps < 80, -0.3, -0.3 - 0.002 * (steps - 80))
    rng = np.random.default_rng(0)
    series = pd.Series(values + rng.normal(0, 0.005, 200), index=steps)
    _, decay, accel, notes = detect_phases(series, PhaseRule())
    assert abs(decay - 80) <= 8 and accel is None
    assert any("no accelerated decay" in note for note in notes)


def test_decline_that_recovers_is_not_claimed():
    steps = np.arange(1, 201)
    values = -0.3 - 0.1 * np.exp(-(((steps - 100) / 25.0) ** 2))  # dip and full recovery
    _, decay, _, notes = detect_phases(pd.Series(values, index=steps), PhaseRule())
    assert decay is None
    assert any("recovered" in note for note in notes)


def test_rule_parameters_change_the_outcome():
    run = _run("grpo", 0)
    assert analyse_run(run, PhaseRule(accel_ratio=1000.0)).accel_onset is None
    assert analyse_run(run, PhaseRule(min_drop=10.0)).decay_onset is None
    assert analyse_run(run, PhaseRule(min_steps=500)).decay_onset is None


def test_decay_onset_is_not_before_the_likelihood_peak():
    """A rise to step 60, a fall to 95 and a partial recovery, a point every 5 steps (the
    shape of GRPO seed 2 in the main runs): the first fitted decline spans steps 0-90, and
    its onset was step 0, before the likelihood had peaked."""
    steps = np.arange(0, 151, 5)
    shape = np.interp(steps, [0, 60, 95, 150], [-0.67, -0.634, -1.23, -0.73])
    rule = PhaseRule()
    for seed in range(4):
        noise = np.random.default_rng(seed).normal(0, 0.005, len(steps))
        series = pd.Series(shape + noise, index=steps)
        _, decay, _, _ = detect_phases(series, rule)
        peak = int(centred_mean(series, rule.smooth_window).idxmax())
        assert peak > 0 and decay is not None and decay >= peak


def test_main_grpo_seed2_decay_starts_at_its_likelihood_peak():
    a = analyse_run(_shipped("main-grpo-seed2"))
    assert a.likelihood_key == "anchor/logp"
    assert a.peak_step == 40 and a.decay_onset == 40  # was 0, against the plotted peak


def test_reward_drop_at_the_very_end_is_too_soon_to_call_unless_deep():
    def ending(value: float, points: int) -> pd.Series:
        return pd.Series(np.r_[np.full(100 - points, 0.5), np.full(points, value)],
                         index=np.arange(100))

    rule = PhaseRule(smooth_window=1)
    step, note = reward_collapse(ending(0.3, 5), rule)  # 40 % down: not deep
    assert step is None and "too soon" in note
    step, note = reward_collapse(ending(0.1, 2), rule)  # deep, but 2 points only
    assert step is None and "too soon" in note
    step, note = reward_collapse(ending(0.1, 5), rule)  # deep and held 5 points: called
    assert step == 95 and "deep fall near the end of the log" in note
    step, note = reward_collapse(ending(0.3, 5), PhaseRule(smooth_window=1,
                                                           reward_min_steps=5))
    assert step == 95 and note is None


def test_a_deep_dip_that_recovers_is_no_collapse():
    reward = pd.Series(np.full(120, 0.8), index=np.arange(120))
    reward[50:60] = 0.05
    assert reward_collapse(reward, PhaseRule()) == (None, None)


def test_the_lr_sweeps_collapsed_run_is_called():
    """The sweep's 3e-4 GRPO run: reward 0.03 at step 48, validation 0/48 at step 50, where
    its log ends; the 10-point rule called it "too soon"."""
    a = analyse_run(_shipped("sweep/grpo-lr3e-4-seed0"))
    assert a.reward_collapse_step == 48
    assert any("deep fall near the end of the log" in note for note in a.notes)
    assert not any("too soon" in note for note in a.notes)


def test_grad_spikes_found_where_injected():
    values = np.full(100, 0.3)
    values[[40, 70]] = 5.0
    assert grad_spikes(pd.Series(values, index=np.arange(100)), PhaseRule()) == [40, 70]


def test_missing_metrics_are_reported_not_guessed():
    table = synthetic_run("grpo").drop(columns=[LIK, "critic/score/mean"])
    a = analyse_run(make_run("synthetic", table, "synthetic", "csv"))
    assert a.peak_step is None and a.best_reward is None
    joined = " ".join(a.notes)
    assert LIK in joined and "critic/score/mean" in joined
    row = summary_table([a]).iloc[0]
    assert row["collapsed"] == "unknown" and pd.isna(row["steady decay onset (II)"])


def test_summary_table_rows():
    analyses = [analyse_run(_run("grpo", 0)), analyse_run(_run("llds", 0))]
    table = summary_table(analyses)
    assert list(table["run"]) == ["synthetic-grpo-0", "synthetic-llds-0"]
    assert list(table["method"]) == ["GRPO", "LLDS"]
    assert list(table["collapsed"]) == ["yes", "no"]
    grpo, llds = table.iloc[0], table.iloc[1]
    assert grpo["steps"] == 200 and grpo["step range"] == "1-200"
    assert grpo["final reward (last 5 mean)"] < 0.1 < grpo["best reward (smoothed)"]
    assert 100 <= grpo["best reward step"] <= 165
    assert grpo["first grad-norm spike"] >= 150
    assert pd.isna(llds["collapse step"])
    assert table["steady decay onset (II)"].dtype == "Int64"


def test_ema_weight():
    values = pd.Series([0.0, 1.0, 1.0])
    assert list(ema(values, 0.0)) == [0.0, 1.0, 1.0]
    np.testing.assert_allclose(ema(values, 0.5), [0.0, 0.5, 0.75])


def test_phases_come_from_the_anchor_set_when_it_has_enough_points():
    """A fixed anchor set re-scored every 5 steps (31 points over 150 steps) is the
    likelihood the phases are read from; the fork's noisy key (here flat) is not. With
    fewer points than the rule needs, the fork's key is used as before."""
    import numpy as np
    import pandas as pd

    from curves.analysis import analyse_run
    from curves.runs import TrainingRun

    steps = np.arange(151)
    rng = np.random.default_rng(0)
    fork = pd.Series(-0.7 + rng.normal(0, 0.05, len(steps)), index=steps)
    anchor = pd.Series(np.where(steps < 60, -0.7, -0.7 - 0.004 * (steps - 60)), index=steps)
    anchor[steps % 5 != 0] = np.nan
    table = pd.DataFrame({"actor/pos_avg_old_log_prob": fork, "anchor/logp": anchor,
                          "critic/score/mean": 0.5}, index=steps)
    result = analyse_run(TrainingRun(name="r", table=table, source="x", source_format="jsonl"))
    assert result.likelihood_key == "anchor/logp"
    assert result.phase_series.get("II") == "anchor/logp"
    assert 50 <= result.decay_onset <= 75
    sparse = table.copy()
    sparse.loc[sparse.index > 100, "anchor/logp"] = np.nan  # 21 points: too few
    result = analyse_run(TrainingRun(name="r", table=sparse, source="x", source_format="jsonl"))
    assert result.likelihood_key == "actor/pos_avg_old_log_prob"
    assert result.decay_onset is None  # the flat, noisy fork key declines nowhere


def test_one_collapse_rule_and_number_per_run_on_the_page():
    """A log with validation at its start is judged by the studio's rule (the one the
    experiments pre-registered): the Summary, the plot's mark and the experiment's own
    verdict give one step; a log without validation says it used the reward-only rule."""
    from curves import analyze_uploads
    from nano.experiments.collapse import read_run

    run = ROOT / "assets" / "nano-runs" / "collapse" / "grpo-lr3e-4-seed0"
    result = analyze_uploads([str(run / "metrics.jsonl")])
    row = result.summary.iloc[0]
    assert row["collapse step"] == read_run(run).collapse_at == 49
    assert row["collapse rule"] == "reward and validation both under half, held"
    labels = [a.text for p in result.panels for a in p.figure.layout.annotations]
    assert any(t.endswith(": collapse @ 49") for t in labels), labels
    assert not any("reward collapse @" in t for t in labels)
    analysis = analyse_run(_run("grpo"))
    assert analysis.collapse_rule.startswith("reward-only rule")
    assert analysis.collapse_step == analysis.reward_collapse_step
