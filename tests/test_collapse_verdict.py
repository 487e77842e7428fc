"""Issue 40's pre-registered collapse rule (nano/experiments/collapse.py) on metrics rows
written here: a fall of reward and validation held to the end is a collapse at its first
step; one that lifts is transient; one too close to the end is not judged a collapse; the
one-sided Fisher test and the CLI's table, survival and warnings."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agent.testing import ROOT
from nano.experiments.collapse import (
    RunReading,
    anchor_warning,
    collapse_step,
    findings,
    fisher_one_sided,
    read_runs,
    reward_means,
)

SCRIPT = [sys.executable, "-m", "nano.experiments.collapse"]


def rows(fall: tuple[int, int] | None = None, steps: int = 80, val_falls: bool = True,
         anchor_from: int | None = None) -> list[dict]:
    """Reward 0.8 ± 0.05 (0.05 over the steps of `fall`), validation 0.7 every 5 steps
    (0.0 inside the fall if `val_falls`), anchor every 2 steps (-0.7, then -1.0 from
    `anchor_from`)."""
    out = []
    for step in range(steps + 1):
        down = fall is not None and fall[0] <= step <= fall[1]
        row: dict = {"step": step}
        if step:
            row["critic/score/mean"] = 0.05 if down else 0.8 + (0.05 if step % 2 else -0.05)
        if step % 5 == 0:
            row["val/test_score/vitalqa"] = 0.0 if down and val_falls else 0.7
        if step % 2 == 0:
            row["anchor/logp"] = -1.0 if anchor_from is not None and step >= anchor_from else -0.7
        out.append(row)
    return out


def test_the_reward_mean_is_over_the_last_five_steps():
    means = reward_means(rows())
    assert min(means) == 5 and max(means) == 80
    assert means[5] == pytest.approx((0.85 + 0.75 + 0.85 + 0.75 + 0.85) / 5)


def test_a_fall_held_to_the_end_is_a_collapse_at_its_first_step():
    # Reward 0.05 from step 50: R5 is below half its peak from step 52 (0.05*3+0.8*2)/5,
    # validation 0 from its step-50 measure.
    collapse, transients = collapse_step(rows(fall=(50, 80)))
    assert collapse == 52 and transients == []


def test_a_fall_that_lifts_is_transient_and_one_near_the_end_is_not_judged():
    collapse, transients = collapse_step(rows(fall=(30, 49)))
    assert collapse is None and transients == [(32, 49)]  # validation back at 50
    assert collapse_step(rows(fall=(77, 80))) == (None, [])  # 2 steps before the end
    # The reward falls but validation holds: no collapse.
    assert collapse_step(rows(fall=(50, 80), val_falls=False)) == (None, [])


def test_the_anchor_warning_is_the_line_crossed_and_held_up_to_the_collapse():
    assert anchor_warning(rows(anchor_from=30), until=52) == 30
    assert anchor_warning(rows(anchor_from=60), until=52) is None  # after the collapse
    assert anchor_warning(rows(), until=None) is None


def test_fisher_one_sided_matches_the_preregistered_figures():
    def runs(method: str, collapsed: int) -> list[RunReading]:
        return [RunReading(f"{method}{i}", method, i, 80, True,
                           collapse_at=50 if i < collapsed else None) for i in range(5)]

    assert fisher_one_sided(runs("GRPO", 5), runs("LLDS-A", 0)) == pytest.approx(1 / 252)
    assert fisher_one_sided(runs("GRPO", 4), runs("LLDS-A", 0)) == pytest.approx(0.0238, 1e-2)
    assert fisher_one_sided(runs("GRPO", 3), runs("LLDS-A", 0)) == pytest.approx(0.0833, 1e-2)
    assert fisher_one_sided(runs("GRPO", 2), runs("LLDS-A", 2)) > 0.5


def write_layout(root, layout: dict) -> None:
    for (method, seed), data in layout.items():
        run = root / f"{method}-lr3e-4-seed{seed}"
        run.mkdir(parents=True)
        flags = "--method grpo" if method == "grpo" else "--method llds-a --lambda 0.2"
        (run / "command.txt").write_text(f"python -m nano rl {flags} --seed {seed}\n")
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))


def test_findings_say_the_counts_the_anchor_and_the_verdict(tmp_path):
    """The Training-curves tab's sentence on the collapse runs, computed by the rule."""
    prevented = {("grpo", s): rows(fall=(40 + s, 80), anchor_from=20) for s in range(5)}
    prevented |= {("llds-a", s): rows() for s in range(4)} | {("llds-a", 4): rows(steps=40)}
    write_layout(tmp_path / "a", prevented)
    said = findings(read_runs(tmp_path / "a"))
    assert "4 LLDS-A seeds trained to step 80, 1 more not yet" in said
    assert "GRPO collapsed in 5 of 5 runs (at steps 42, 45, 45, 45, 46)" in said
    assert "LLDS-A in 0 of 4 runs;" in said
    assert "ended above where it began in 0 of 4 LLDS-A runs and 0 of 5 GRPO runs" in said
    assert "so LLDS-A prevented the collapse by the pre-registered test" in said
    assert "p = 0.01)" in said
    both = {("grpo", 0): rows(fall=(50, 80)), ("llds-a", 0): rows(fall=(60, 80))}
    write_layout(tmp_path / "b", both)
    said = findings(read_runs(tmp_path / "b"))
    assert "LLDS-A in 1 of 1 runs (at step 62)" in said and "not shown to prevent" in said
    write_layout(tmp_path / "c", {("grpo", 0): rows(steps=30)})
    assert findings(read_runs(tmp_path / "c")) == ""  # nothing judged: nothing to say


@pytest.mark.slow
def test_findings_on_the_shipped_runs_agree_with_the_verdict():
    runs = ROOT / "assets" / "nano-runs" / "collapse"
    done = subprocess.run([*SCRIPT, str(runs)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    said = findings(read_runs(runs))
    for method in ("GRPO", "LLDS-A"):
        line = next(x for x in done.stdout.splitlines() if x.startswith(f"{method}: "))
        count = line.split(": ")[1].split(" judged")[0]  # "2 of 3"
        assert f"{method} collapsed in {count} runs" in said or \
            f"and {method} in {count} runs" in said, (line, said)
    p = done.stdout.split("one-sided (LLDS-A collapses less): p = ")[1][:5]
    assert f"p = {float(p):.2f})" in said


@pytest.mark.slow
def test_cli_prints_each_run_the_test_survival_and_warnings(tmp_path):
    root = tmp_path / "collapse"
    layout = {("grpo", 0): rows(fall=(50, 80), anchor_from=30),
              ("grpo", 1): rows(fall=(40, 80), anchor_from=20),
              ("grpo", 2): rows(fall=(60, 80), anchor_from=10),
              ("grpo", 3): rows(fall=(30, 80)),
              ("grpo", 4): rows(fall=(70, 80)),
              ("llds-a", 0): rows(), ("llds-a", 1): rows(anchor_from=40),
              ("llds-a", 2): rows(), ("llds-a", 3): rows(), ("llds-a", 4): rows(steps=40)}
    write_layout(root, layout)
    done = subprocess.run([*SCRIPT, str(root)], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "GRPO: 5 of 5 judged runs collapsed (steps 52, 42, 62, 32, 72)" in out
    assert "LLDS-A: 0 of 4 judged runs collapsed" in out
    assert "| llds-a-lr3e-4-seed4 | LLDS-A | 4 | 40 |" in out and "not judged (running)" in out
    assert "p = 0.008 -> LLDS-A prevents the collapse; 1 runs still to reach step 80" in out
    assert "| GRPO | 5 | 5 | 4 | 2 | 0 |" in out and "| LLDS-A | 4 | 4 | 4 | 4 | 4 |" in out
    assert "crossed before 3 of 5 collapses, 22-52 steps before (median 22)" in out
    assert "crossed and held to the end in 1 of 4 runs that did not collapse" in out
    assert "Reproduction: no sweep run at" in out
    missing = subprocess.run([*SCRIPT, str(tmp_path / "none")], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no run folder" in missing.stderr


@pytest.mark.slow
def test_the_runs_readme_shows_what_the_script_prints_from_the_shipped_logs():
    """The collapse experiment's table and counts in assets/nano-runs/README.md are what
    the verdict prints from the logs shipped in assets/nano-runs/collapse/."""
    import re

    runs = ROOT / "assets" / "nano-runs"
    done = subprocess.run([*SCRIPT, str(runs / "collapse")], cwd=ROOT, capture_output=True,
                          text=True, env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=300)
    assert done.returncode == 0, done.stderr

    def rows(text: str) -> dict[str, str]:
        return {line.split("|")[1].strip(): line.strip() for line in text.splitlines()
                if re.match(r"\| (grpo|llds-a)-lr3e-4-seed\d+ \|", line)}

    readme = (runs / "README.md").read_text(encoding="utf-8")
    printed = rows(done.stdout)
    shipped = sorted(p.name for p in (runs / "collapse").iterdir() if p.is_dir())
    assert sorted(printed) == shipped and len(shipped) >= 2
    assert rows(readme) == printed
    for line in done.stdout.splitlines():
        if re.match(r"(GRPO|LLDS-A): \d+ of \d+ judged runs collapsed|Fisher's exact", line):
            assert line in readme, line
