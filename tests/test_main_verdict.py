"""The main runs' pre-registered criteria (nano/experiments/main_verdict.py) on metrics rows
and evaluator runs written here: an anchor fall while the reward holds, before things
deteriorate, is displacement; a fall that comes with or after the collapse, or that
recovers, is not; a paired gain counts only above 2 SE and the between-seed spread."""

from __future__ import annotations

import re
import subprocess
import sys

from agent.testing import ROOT
from nano.experiments.main_verdict import displacement, holds
from tests.test_evaluator_citable import _vitalqa_run

SCRIPT = [sys.executable, "-m", "nano.experiments.main_verdict"]
RUNS = ROOT / "assets" / "nano-runs"


def rows(anchor: dict[int, float], reward_after: float = 0.5, collapse_at: int | None = None,
         steps: int = 60) -> list[dict]:
    """Reward 0.5 ± 0.05 (then `reward_after` from `collapse_at`, entropy and grad norm up)."""
    out = []
    for step in range(steps + 1):
        row = {"step": step}
        if step:
            late = collapse_at is not None and step >= collapse_at
            wobble = 0.05 if step % 2 else -0.05
            row.update({"critic/score/mean": (reward_after if late else 0.5) + wobble,
                        "actor/entropy_loss": 0.5 if late else 0.1,
                        "actor/grad_norm": 3.0 if late else 0.5, "actor/kl_loss": 0.01})
        if step in anchor:
            row["anchor/logp"] = anchor[step]
        out.append(row)
    return out


def anchors(values: list[float]) -> dict[int, float]:
    return {5 * i: v for i, v in enumerate(values)}


def test_a_fall_while_the_reward_holds_before_the_collapse_is_displacement():
    falling = anchors([-0.70, -0.70, -0.72, -0.78, -0.80, -0.85, -0.90, -1.5, -2.0])
    d = displacement(rows(falling, reward_after=0.1, collapse_at=35))
    assert d["shown"] is True and d["fall_at"] == 15
    assert d["deteriorates_by"] == "entropy" and 35 <= d["deteriorates_at"] <= 40
    # No collapse at all: a fall that holds to the end counts too.
    assert displacement(rows(falling))["shown"] is True


def test_a_fall_that_recovers_or_comes_with_the_collapse_is_not():
    recovers = anchors([-0.70, -0.72, -0.78, -0.80, -0.70, -0.69, -0.70, -0.71, -0.70])
    assert displacement(rows(recovers))["shown"] is False
    with_collapse = anchors([-0.70] * 8 + [-0.9, -2.0])  # falls at step 40, after step 35
    d = displacement(rows(with_collapse, reward_after=0.1, collapse_at=35))
    assert d["shown"] is False and d["deteriorates_at"] is not None
    small = anchors([-0.70, -0.72, -0.73, -0.74, -0.74, -0.74, -0.74, -0.74, -0.74])
    assert displacement(rows(small))["shown"] is False  # 0.04 < the 0.05 line
    assert displacement(rows({}))["shown"] is False  # no anchor logged


def test_the_llds_criterion_needs_2_se_and_the_seed_spread():
    def em(right: set[int], n: int = 200) -> dict[str, int]:
        return {f"q{i}": int(i in right) for i in range(n)}

    grpo = {0: em(set(range(100))), 1: em(set(range(102))), 2: em(set(range(98)))}
    clear = {s: em(set(range(140 + s))) for s in range(3)}
    h = holds(grpo, clear)
    assert h["holds"] is True and abs(h["gain"] - 0.205) < 1e-9 and h["n"] == 200
    tiny = {s: em(set(range(50, 154 + s))) for s in range(3)}  # many discordant
    assert holds(grpo, tiny)["holds"] is False  # within 2 SE
    spread = {0: em(set(range(100))), 1: em(set(range(200))), 2: em(set(range(130)))}
    h = holds(grpo, spread)
    assert h["gain"] > 2 * h["se"] and h["gain"] < h["spread"] and h["holds"] is False


def test_cli_prints_the_table_and_both_verdicts(tmp_path):
    import json

    runs, evals = tmp_path / "runs", tmp_path / "evals"
    falling = anchors([-0.70, -0.70, -0.72, -0.78, -0.80, -0.85, -0.90, -0.95, -0.95])
    for method, flags in (("grpo", "--method grpo"), ("llds-a", "--method llds-a --lambda 0.2")):
        for seed in range(3):
            run = runs / f"main-{method}-seed{seed}"
            run.mkdir(parents=True)
            (run / "command.txt").write_text(f"python -m nano rl {flags} --seed {seed}\n")
            data = rows(falling if method == "grpo" and seed < 2 else anchors([-0.7] * 9))
            if method == "llds-a":  # the gate let the term act in every third step
                for row in data[1:]:
                    row["actor/loss_noreduce"] = 1e-4 if row["step"] % 3 == 0 else 0.0
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
            right = set(range(8 if method == "grpo" else 16))
            partial = method == "llds-a" and seed == 2  # an evaluation still running
            _vitalqa_run(evals / run.name, run.name, right, total=12 if partial else 20)
    done = subprocess.run([*SCRIPT, str(runs), str(evals)], cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": ""}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.count("| main-grpo-seed") == 3 and "| LLDS-A | 2 |" in out
    assert "0.400 (n 20)" in out and "0.800 (n 20)" in out
    assert out.count("partial") == 1 and "(n 12) partial" in out
    assert "2 of 3 GRPO runs -> shown" in out
    # 13 anchor points and no fork key: the curves phase rule has nothing to call phases on.
    assert out.count("| - / - |") == 6
    assert "LLDS-A vs GRPO (seeds 0, 1, 20 questions): gain +0.400" in out  # not the partial
    assert "-> holds" in out
    assert out.count("above 0 in 20 of 60 steps") == 3  # LLDS runs only, GRPO's left out
    # The scores saved into the run folders give the same table and verdicts without EVALS.
    env = {"PYTHONPATH": str(ROOT), "PATH": ""}
    saved = subprocess.run([*SCRIPT, "--save-scores", str(runs),
                            str(evals)], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=120)
    assert saved.returncode == 0 and "for 6 runs" in saved.stdout, saved.stderr
    alone = subprocess.run([*SCRIPT, str(runs)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert alone.stdout == out
    empty = subprocess.run([*SCRIPT, str(tmp_path / "none")], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert empty.returncode == 2 and "no run folder" in empty.stderr


def test_the_runs_readme_table_is_what_the_script_prints_from_the_shipped_logs():
    """The runs README's results table and verdicts are what main_verdict.py reads off the
    shipped logs and the shipped scores (pool_em.json) of the final models."""
    done = subprocess.run([*SCRIPT, str(RUNS)], cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": ""}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr

    def rows(text: str) -> dict[str, list[str]]:
        found = {}
        for line in text.splitlines():
            cells = [c.strip() for c in line.strip("|").split("|")]
            if re.fullmatch(r"main-[a-z-]+-seed\d+", cells[0]):  # not earlier "main-" runs
                found[cells[0]] = cells
        return found

    printed = rows(done.stdout)
    readme = rows((RUNS / "README.md").read_text(encoding="utf-8"))
    shipped = sorted(p.name for p in RUNS.glob("main-*") if p.is_dir())
    assert sorted(printed) == shipped and len(shipped) >= 2
    assert readme == printed
    assert all(p.joinpath("pool_em.json").is_file() for p in RUNS.glob("main-*"))
    readme_text = (RUNS / "README.md").read_text(encoding="utf-8")
    for line in done.stdout.splitlines():
        if " vs GRPO (seeds " in line:  # each verdict, with its gain and SE, as printed
            gain = re.search(r"gain ([+-]\d\.\d{3}) ± (\d\.\d{3})", line)
            assert gain and f"{gain[1].replace('-', '−')} ± {gain[2]}" in readme_text
