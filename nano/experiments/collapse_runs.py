"""Run (or resume) the collapse-regime runs, two at a time, and ship their logs.

    python -m nano.experiments.collapse_runs [--seeds 0,1,2,3,4] [--jobs 2]
    python -m nano.experiments.collapse_runs --ship-only
    python -m nano.experiments.collapse_runs --seeds 100 --lr 5e-4 --stop-after-fall 10 \
        --runs-dir nano-runs-46 --ship assets/nano-runs/confirm/pilot

The defaults are issue 40's ten runs (lr 3e-4, 80 steps, seeds 0-4); issue 46's
confirmation passes its seeds, lr, steps and stopping rule (assets/nano-runs/README.md, "The
confirmation").

Each run is `python -m nano rl ... --resume` with the pre-registered settings
(assets/nano-runs/README.md, "The collapse-regime experiment"), in RUNS_DIR/<name>; a run
stopped anywhere (a session's end, kill) goes on from its last checkpoint the next time
this is started, and a finished run (its final model written) is skipped. Runs go in
pairs by seed (GRPO and LLDS-A of seed 0 first, so the Compare pair is ready first).
After each run ends, and with --ship-only at any time, each run's `metrics.jsonl`,
`train.log` and `command.txt` are copied to SHIP/<name>/, and the seed-0 final models to
SHIP/<name>/model.

Needs the start model and question files named in the pre-registration (nano-data/...).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

START = "nano-data/start-sixth"
TRAIN = "nano-data/headroom-1024/train.jsonl"
VAL = "nano-data/rl-data/val_sample.jsonl"
ANCHORS = "assets/nano-runs/sweep/anchors.jsonl"
METHODS = {"grpo": ["--method", "grpo"],
           "llds-a": ["--method", "llds-a", "--lambda", "0.2", "--gate", "lazy"]}
LOGS = ("metrics.jsonl", "train.log", "command.txt", "stopped.json")
MODEL_SEED = 0  # the seed whose final models ship (the Compare tab's pair)


@dataclass(frozen=True)
class Regime:
    """What differs between the experiments' runs: lr, length, the stopping rule."""

    lr: str = "3e-4"
    steps: int = 80
    stop_after_fall: int = 0  # 0: every run trains all its steps (issue 40)


def run_name(method: str, seed: int, regime: Regime = Regime()) -> str:
    return f"{method}-lr{regime.lr}-seed{seed}"


def command(method: str, seed: int, runs_dir: Path, regime: Regime = Regime()) -> list[str]:
    """The pre-registered command of one run."""
    stop = ["--stop-after-fall", str(regime.stop_after_fall)] if regime.stop_after_fall else []
    return [sys.executable, "-m", "nano", "rl", *METHODS[method], "--model", START,
            "--train-data", TRAIN, "--val-data", VAL, "--val-name", "vitalqa",
            "--out", str(runs_dir / run_name(method, seed, regime)), "--lr", regime.lr,
            "--warmup-steps", "14", "--steps", str(regime.steps), *stop, "--kl-coef", "0.001",
            "--batch-questions", "8", "--group-size", "4", "--mini-batches", "2",
            "--micro-batch", "8", "--max-new-tokens", "128", "--val-every", "5",
            "--val-limit", "48", "--anchors", ANCHORS, "--anchor-every", "2",
            "--save-every", "5", "--threads", "1", "--seed", str(seed), "--resume"]


def finished(run_dir: Path) -> bool:
    return (run_dir / "model" / "config.json").is_file()


def ship(run_dir: Path, ship_dir: Path, seed: int) -> None:
    """Copy a run's logs (and, for the Compare seed, its final model) into the repository."""
    if not (run_dir / "metrics.jsonl").is_file():
        return
    target = ship_dir / run_dir.name
    target.mkdir(parents=True, exist_ok=True)
    for name in LOGS:
        if (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, target / name)
    if seed == MODEL_SEED and finished(run_dir):
        shutil.copytree(run_dir / "model", target / "model", dirs_exist_ok=True)


def shipped_ended(shipped: Path, seed: int, regime: Regime) -> bool:
    """The run's shipped logs are of an ended run: stopped by the rule, or all its steps
    (and, for the Compare seed, its model shipped too). On a new machine, whose run folders
    are gone, such a run is not trained again."""
    if seed == MODEL_SEED and not (shipped / "model" / "config.json").is_file():
        return False
    if (shipped / "stopped.json").is_file():
        return True
    try:
        lines = (shipped / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        return bool(lines) and json.loads(lines[-1]).get("step", -1) >= regime.steps
    except (OSError, ValueError):
        return False


def train_one(method: str, seed: int, runs_dir: Path, ship_dir: Path, regime: Regime) -> str:
    run_dir = runs_dir / run_name(method, seed, regime)
    if not finished(run_dir) and shipped_ended(ship_dir / run_dir.name, seed, regime):
        return f"{run_dir.name}: ended, its logs shipped already; not trained again"
    if finished(run_dir):
        ship(run_dir, ship_dir, seed)
        return f"{run_dir.name}: already finished"
    begun = time.time()
    with open(runs_dir / f"{run_dir.name}.out", "a", encoding="utf-8") as out:
        done = subprocess.run(command(method, seed, runs_dir, regime), stdout=out,
                              stderr=subprocess.STDOUT, check=False)
    ship(run_dir, ship_dir, seed)
    return (f"{run_dir.name}: exit {done.returncode} after {(time.time() - begun) / 60:.1f} "
            "min")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m nano.experiments.collapse_runs",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (one thread each)")
    parser.add_argument("--runs-dir", type=Path, default=Path("nano-runs-40"))
    parser.add_argument("--ship", type=Path, default=Path("assets/nano-runs/collapse"))
    parser.add_argument("--ship-only", action="store_true",
                        help="copy the logs as they stand, train nothing")
    parser.add_argument("--lr", default=Regime.lr, help="peak learning rate, as written in "
                                                        "the run's name")
    parser.add_argument("--steps", type=int, default=Regime.steps)
    parser.add_argument("--stop-after-fall", type=int, default=0,
                        help="stop a run once the collapse rule has held this many steps")
    args = parser.parse_args(argv)
    regime = Regime(args.lr, args.steps, args.stop_after_fall)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    order = [(method, seed) for seed in seeds for method in METHODS]
    if args.ship_only:
        for method, seed in order:
            ship(args.runs_dir / run_name(method, seed, regime), args.ship, seed)
        return 0
    to_train = [(method, seed) for method, seed in order
                if not (finished(args.runs_dir / run_name(method, seed, regime)) or
                        shipped_ended(args.ship / run_name(method, seed, regime), seed, regime))]
    missing = [p for p in (START + "/config.json", TRAIN, VAL, ANCHORS) if not Path(p).is_file()]
    if missing and to_train:  # the inputs matter only to a run that trains
        print(f"error: missing {', '.join(missing)}; build them as the pre-registration in "
              "assets/nano-runs/README.md says.", file=sys.stderr)
        return 2
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for line in pool.map(lambda job: train_one(*job, args.runs_dir, args.ship, regime),
                             order):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
