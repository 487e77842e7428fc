"""The lr sweep's pre-registered rule (nano/experiments/sweep_verdict.py) on metrics rows
written here: a clear gain with small KL passes, a gain inside the noise or a KL above the
bound does not, and the CLI picks the highest passing lr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from nano.experiments.sweep_verdict import verdict

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = [sys.executable, "-m", "nano.experiments.sweep_verdict"]


def rows(early: float, late: float, kl: float, wobble: float = 0.05) -> list[dict]:
    out = [{"step": 0, "anchor/logp": -0.7}]
    for step in range(1, 51):
        base = early if step <= 10 else late if step > 40 else (early + late) / 2
        out.append({"step": step, "critic/score/mean": base + (wobble if step % 2 else -wobble),
                    "actor/kl_loss": kl})
    return out


def test_a_clear_gain_with_small_kl_passes_and_noise_or_drift_does_not():
    assert verdict(rows(0.3, 0.5, 0.01))["improves"] is True
    assert verdict(rows(0.3, 0.5, 0.01))["kl_ok"] is True
    assert verdict(rows(0.3, 0.31, 0.01, wobble=0.2))["improves"] is False  # inside the noise
    assert verdict(rows(0.3, 0.5, 0.2))["kl_ok"] is False
    short = [r for r in rows(0.3, 0.5, 0.01) if r["step"] <= 45]
    assert verdict(short)["complete"] is False and verdict(short)["improves"] is False


def test_cli_picks_the_highest_passing_lr(tmp_path):
    for lr, (early, late, kl) in {"3e-05": (0.3, 0.5, 0.01), "0.0001": (0.3, 0.6, 0.05),
                                  "0.0003": (0.3, 0.7, 0.5)}.items():
        run = tmp_path / f"lr{lr}"
        run.mkdir()
        (run / "command.txt").write_text(f"python -m nano rl --lr {lr} --steps 50\n")
        (run / "metrics.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows(early, late, kl)))
    out = subprocess.run([*SCRIPT, *sorted(map(str, tmp_path.iterdir()))],
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""},
                         capture_output=True, text=True, check=True).stdout
    assert "chosen lr: 0.0001" in out
    missing = subprocess.run([*SCRIPT, str(tmp_path / "nope")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "no metrics.jsonl" in missing.stderr
