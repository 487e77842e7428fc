"""What the LLDS term costs a step in TRL: the worked example's run (the nano agent, the toy
reward, num_iterations=2) with TRL's own GRPOTrainer against LLDSGRPOTrainer, same seed.

    python -m benchmarks.trl_llds [--steps 10] [--repeats 2]

Prints seconds a step of each (the best of --repeats runs, each from a fresh trainer) and
their ratio, and the CPU they came from. Goal: the term costs under 5 % a step (it reuses the
log-probabilities TRL computed; no second forward pass).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.cpu import describe


def seconds_a_step(llds: bool, steps: int) -> float:
    from trl import GRPOTrainer

    from llds_trl.example import make_trainer

    with tempfile.TemporaryDirectory() as out:
        trainer = make_trainer(Path(out), 0.1, steps,
                               trainer_class=None if llds else GRPOTrainer)
        started = time.perf_counter()
        trainer.train()
        return (time.perf_counter() - started) / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trl_llds",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    plain = min(seconds_a_step(False, args.steps) for _ in range(args.repeats))
    llds = min(seconds_a_step(True, args.steps) for _ in range(args.repeats))
    print(f"{describe()}; {args.steps} steps, best of {args.repeats}")
    print(f"TRL GRPOTrainer (plain): {plain:.3f} s a step")
    print(f"LLDSGRPOTrainer (lambda 0.1): {llds:.3f} s a step")
    print(f"LLDS / plain: {llds / plain:.3f}x (goal < 1.05x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
