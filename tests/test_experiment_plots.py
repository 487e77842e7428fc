"""The confirmation's two pictures (curves/experiment_plots.py) on outcomes the test writes."""

from __future__ import annotations

import json

from curves.experiment_plots import RunOutcome, anchor_figure, standing, survival_figure

RUNS = [RunOutcome("g1", "GRPO", "confirmatory", 15, -4.1),
        RunOutcome("g2", "GRPO", "confirmatory", None, -0.5),
        RunOutcome("g3", "GRPO", "confirmatory", 60, None),
        RunOutcome("l1", "LLDS-A", "confirmatory", None, 0.4),
        RunOutcome("l0", "LLDS-A", "exploratory", 66, 0.3)]


def test_a_run_falls_at_its_collapse_step_and_not_before():
    grpo = [r for r in RUNS if r.method == "GRPO"]
    assert [standing(grpo, s) for s in (0, 14, 15, 59, 60, 80)] == [3, 3, 2, 2, 1, 1]


def test_survival_has_a_line_per_method_and_set_with_its_count():
    figure = survival_figure(RUNS, 80)
    names = [trace.name for trace in figure.data]
    assert names == ["GRPO, confirmatory (1 of 3 standing)",
                     "LLDS-A, confirmatory (1 of 1 standing)",
                     "LLDS-A, exploratory (0 of 1 standing)"]
    grpo = figure.data[0]
    assert list(grpo.x) == list(range(81)) and grpo.y[14] == 1.0 and grpo.y[15] == 2 / 3
    assert figure.data[2].line.dash == "dot"  # the exploratory set, told apart


def test_anchor_strip_has_a_point_a_measured_run_and_axes_that_hold_them():
    figure = anchor_figure(RUNS, (20, 30))
    points = {trace.name: list(trace.y) for trace in figure.data}
    assert points == {"GRPO, confirmatory (2 runs)": [-4.1, -0.5],
                      "LLDS-A, confirmatory (1 run)": [0.4],
                      "LLDS-A, exploratory (1 run)": [0.3]}
    low, high = figure.layout.yaxis.range
    assert low <= -4.1 and high >= 0.4
    assert "steps 20-30" in figure.layout.title.text


def test_the_tab_gives_the_verdict_once_every_registered_run_has_ended(tmp_path):
    """Twenty run folders written here (GRPO's anchor falls and it collapses in 7 of 10,
    LLDS-A's holds and it never does): the tab's sentence is the verdict's two tests as the
    verdict script prints them; with one run still going it says the verdict waits."""
    from app.ui.curves_tab import confirmation_findings
    from nano.experiments.confirm import read_runs, verdict
    from tests.test_collapse_verdict import rows
    from tests.test_confirm import write_run

    for seed in range(101, 111):
        write_run(tmp_path, "grpo", seed, rows(fall=(40, 80), anchor_from=10) if seed < 108
                  else rows(anchor_from=10))
        write_run(tmp_path, "llds-a", seed, rows())
    said = confirmation_findings(tmp_path)
    lines = verdict(read_runs(tmp_path))
    h1 = next(line for line in lines if line.startswith("H1 ("))
    h2 = next(line for line in lines if line.startswith("H2 ("))
    assert said.startswith("All 20 runs have ended; the pre-registered verdict")
    assert f"{h1}. {h2}." in said and "GRPO 7 of 10, LLDS-A 0 of 10" in said
    (tmp_path / "llds-a-lr5e-4-seed110" / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows(steps=40)))
    assert "The pre-registered verdict waits for all of them" in confirmation_findings(
        tmp_path)
