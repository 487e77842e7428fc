"""Issue 46's confirmation (nano/experiments/confirm.py): the H1 endpoint, Holm's correction,
the power calculation, the verdict's CLI on run folders written here, and the warning rules
frozen at the pre-registration (their calls on the exploratory runs must not change until
the verdict)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agent.testing import ROOT
from nano.experiments.confirm import (
    RULES,
    anchor_change,
    holm,
    mann_whitney_greater,
    power_fisher,
    read_runs,
)
from tests.test_collapse_verdict import rows

SCRIPT = [sys.executable, "-m", "nano.experiments.confirm"]

# The calls registered in assets/nano-runs/README.md ("Frozen calls"): run -> (anchor line,
# curves phase II as read, curves phase II from the fork's keys alone).
FROZEN = {
    "grpo-lr3e-4-seed0": (10, 0, 40), "grpo-lr3e-4-seed1": (42, 0, None),
    "grpo-lr3e-4-seed2": (18, 0, None), "grpo-lr3e-4-seed3": (24, 20, 30),
    "grpo-lr3e-4-seed4": (58, 2, None), "llds-a-lr3e-4-seed0": (None, None, None),
    "llds-a-lr3e-4-seed1": (64, 62, None), "llds-a-lr3e-4-seed2": (None, None, None),
    "llds-a-lr3e-4-seed3": (None, 56, None), "llds-a-lr3e-4-seed4": (None, None, None),
}


def test_anchor_change_is_the_window_mean_minus_step_zero():
    assert anchor_change(rows()) == pytest.approx(0.0)
    assert anchor_change(rows(anchor_from=24)) == pytest.approx(-0.3 * 4 / 6)  # 24-30 of 20-30
    short = rows(steps=12, anchor_from=8)  # stopped before the window: its last 3 measures
    assert anchor_change(short) == pytest.approx(-0.3)
    assert anchor_change([{"step": 2, "anchor/logp": -1.0}]) is None


def test_holm_steps_down_and_stops_at_the_first_kept():
    assert holm({"H1": 0.001, "H2": 0.04}) == {"H1": True, "H2": True}
    assert holm({"H1": 0.03, "H2": 0.04}) == {"H1": False, "H2": False}
    assert holm({"H1": 0.001, "H2": 0.06}) == {"H1": True, "H2": False}


def test_the_tests_and_the_power_figures_the_registration_cites():
    assert mann_whitney_greater([1, 2, 3], [-1, -2, -3]) == pytest.approx(1 / 20)
    assert power_fisher(12, 0.4, 0.2, 0.05) == pytest.approx(0.18, abs=0.01)
    assert power_fisher(10, 0.9, 0.2, 0.05) == pytest.approx(0.94, abs=0.01)
    assert power_fisher(10, 0.9, 0.2, 0.025) == pytest.approx(0.84, abs=0.01)


def write_run(root, method: str, seed: int, data: list[dict], stopped: dict | None = None):
    run = root / f"{method}-lr5e-4-seed{seed}"
    run.mkdir(parents=True)
    flags = "--method grpo" if method == "grpo" else "--method llds-a --lambda 0.2"
    (run / "command.txt").write_text(f"python -m nano rl {flags} --seed {seed}\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    if stopped:
        (run / "stopped.json").write_text(json.dumps(stopped))


@pytest.mark.slow
def test_cli_prints_runs_tests_and_the_warning_tables(tmp_path):
    root = tmp_path / "runs"
    for seed in range(101, 105):  # GRPO: anchor down from 20, collapses at 42 and stops at 52
        write_run(root, "grpo", seed, rows(fall=(40, 52), steps=52, anchor_from=20),
                  stopped={"step": 52, "collapse_at": 42, "held_steps": 10})
        write_run(root, "llds-a", seed, rows())
    write_run(root, "llds-a", 105, rows(steps=30))  # still running
    done = subprocess.run([*SCRIPT, str(root)], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=300)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "| grpo-lr5e-4-seed101 | GRPO | 101 | 52 | step 42 (stopped) | -0.300 |" in out
    assert "| llds-a-lr5e-4-seed105 | LLDS-A | 105 | 30 | not judged (running) |" in out
    assert "1 not yet judged (the verdict is provisional)" in out
    assert "difference +0.300 ± 0.000 (SE); Mann-Whitney one-sided p = 0.014 -> holds" in out
    assert "GRPO 4 of 4, LLDS-A 0 of 4; difference +1.00; Fisher one-sided p = 0.014 -> holds" \
        in out
    assert "Standing at steps 20, 40, 60, 80 (GRPO, 4 runs): 4, 4, 0, 0" in out
    assert "Warning rule: anchor line" in out
    assert "| collapsed | 4 | 0 |" in out and "lead (steps) 22, 22, 22, 22" in out
    assert "Stopped by the rule: 4 runs, each after the fall held 10, 10, 10, 10 steps." in out
    missing = subprocess.run([*SCRIPT, str(tmp_path / "none")], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no run folder" in missing.stderr


@pytest.mark.slow
def test_the_warning_rules_are_as_frozen_at_the_preregistration():
    """The three warning rules give, on the exploratory runs, the calls registered before
    the confirmation's first run; a change to them before the verdict fails here."""
    readings = read_runs(ROOT / "assets" / "nano-runs" / "collapse")
    assert {r.name: tuple(r.warned[k] for k in RULES) for r in readings} == FROZEN
    readme = (ROOT / "assets" / "nano-runs" / "README.md").read_text(encoding="utf-8")
    frozen = readme.split("### Frozen calls")[1].split("###")[0]
    for name, calls in FROZEN.items():
        cells = " | ".join("-" if c is None else str(c) for c in calls)
        assert f"| {name} | {cells} |" in frozen, name


def test_the_pilot_pair_picks_the_regime_by_the_registered_rule(tmp_path):
    from nano.experiments.confirm import pick_regime

    grpo_fell = {"step": 52, "collapse_at": 42, "held_steps": 10}
    write_run(tmp_path / "a", "grpo", 100, rows(fall=(40, 52), steps=52), stopped=grpo_fell)
    write_run(tmp_path / "a", "llds-a", 100, rows())
    why, runner = pick_regime(tmp_path / "a")
    assert "pilot lr (lr 5e-4, 80 steps, seeds 101-110)" in why
    assert runner == ["--seeds", ",".join(map(str, range(101, 111))), "--lr", "5e-4",
                      "--steps", "80", "--stop-after-fall", "10"]
    write_run(tmp_path / "b", "grpo", 100, rows(fall=(40, 52), steps=52), stopped=grpo_fell)
    write_run(tmp_path / "b", "llds-a", 100, rows(fall=(60, 80)))  # both collapsed
    assert pick_regime(tmp_path / "b")[1][:6] == ["--seeds", ",".join(
        map(str, range(101, 113))), "--lr", "3e-4", "--steps", "120"]
    write_run(tmp_path / "c", "grpo", 100, rows(steps=40))  # still running
    write_run(tmp_path / "c", "llds-a", 100, rows())
    with pytest.raises(ValueError, match="has not ended"):
        pick_regime(tmp_path / "c")


@pytest.mark.slow
def test_the_power_table_and_the_regime_print_from_the_repository_as_registered():
    """`--power` on the exploratory runs prints the table pasted in the pre-registration;
    `--regime` on the shipped pilot pair prints the registered choice and its arguments."""
    power = subprocess.run([*SCRIPT, "--power", "assets/nano-runs/collapse"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert power.returncode == 0, power.stderr
    readme = (ROOT / "assets" / "nano-runs" / "README.md").read_text(encoding="utf-8")
    table = [line for line in power.stdout.splitlines() if line.startswith("| ")]
    assert len(table) == 6 and all(line in readme for line in table)
    regime = subprocess.run([*SCRIPT, "--regime", "assets/nano-runs/confirm/pilot"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert regime.returncode == 0, regime.stderr
    assert "GRPO pilot collapsed, LLDS-A pilot did not collapse: pilot lr" in regime.stderr
    assert regime.stdout.split() == ["--seeds", ",".join(map(str, range(101, 111))), "--lr",
                                     "5e-4", "--steps", "80", "--stop-after-fall", "10"]


def test_the_runner_ships_a_stopped_runs_logs_under_its_regimes_name(tmp_path):
    """`collapse_runs --ship-only` with the confirmation's regime copies each run's logs,
    its stopping record included, from the run folder to the shipped one."""
    runs, ship = tmp_path / "nano-runs-46", tmp_path / "ship"
    write_run(runs, "grpo", 101, rows(fall=(40, 52), steps=52),
              stopped={"step": 52, "collapse_at": 42, "held_steps": 10})
    done = subprocess.run([sys.executable, "-m", "nano.experiments.collapse_runs", "--seeds",
                           "101", "--lr", "5e-4", "--stop-after-fall", "10", "--runs-dir",
                           str(runs), "--ship", str(ship), "--ship-only"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    shipped = ship / "grpo-lr5e-4-seed101"
    assert sorted(p.name for p in shipped.iterdir()) == ["command.txt", "metrics.jsonl",
                                                         "stopped.json"]
    assert not (ship / "llds-a-lr5e-4-seed101").exists()  # nothing logged: nothing shipped


def test_the_runner_does_not_train_again_a_run_whose_ended_logs_are_shipped(tmp_path):
    """On a new machine (no run folders), a seed whose two runs ended and were shipped (one
    stopped by the rule, one with all its steps) is not trained again."""
    runs, ship = tmp_path / "nano-runs-46", tmp_path / "ship"
    runs.mkdir()
    write_run(ship, "grpo", 105, rows(fall=(40, 52), steps=52),
              stopped={"step": 52, "collapse_at": 42, "held_steps": 10})
    write_run(ship, "llds-a", 105, rows(steps=81))
    done = subprocess.run([sys.executable, "-m", "nano.experiments.collapse_runs", "--seeds",
                           "105", "--lr", "5e-4", "--stop-after-fall", "10", "--runs-dir",
                           str(runs), "--ship", str(ship)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("not trained again") == 2, done.stdout
    assert list(runs.iterdir()) == []  # nothing started
