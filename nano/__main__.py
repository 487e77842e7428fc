"""`python -m nano data|train|rl …`: the nano agent's data, its SFT run, and GRPO/LLDS.

Flags have env-var fallbacks (NANO_DATA_DIR, NANO_OUT, NANO_STEPS, …), turned into the
config objects here and nowhere else.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from nano.build import DataConfig
from nano.sft import TrainConfig

DEFAULT_DATA_DIR = "nano-data"
DEFAULT_OUT = "nano-run"


def _env(name: str, default):
    return os.environ.get(name, default)


def data_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m nano data",
                                description="Write the tokenizer, training trajectories "
                                "(teacher through the real agent loop) and vitalqa.")
    p.add_argument("--out", default=_env("NANO_DATA_DIR", DEFAULT_DATA_DIR),
                   help="directory for tokenizer/ and train.jsonl [NANO_DATA_DIR]")
    p.add_argument("--benchmark-dir", default=_env("NANO_BENCHMARK_DIR", None),
                   help="write DIR/vitalqa/test.jsonl too (the shipped copy: assets) "
                   "[NANO_BENCHMARK_DIR]")
    p.add_argument("--corpus", default=_env("NANO_CORPUS", "default"), help="[NANO_CORPUS]")
    p.add_argument("--engine", default=_env("NANO_ENGINE", "bm25"), help="[NANO_ENGINE]")
    p.add_argument("--vocab-size", type=int, default=int(_env("NANO_VOCAB", 4096)),
                   help="[NANO_VOCAB]")
    p.add_argument("--limit", type=int, default=_env("NANO_LIMIT", None),
                   help="at most this many training questions [NANO_LIMIT]")
    p.add_argument("--no-trajectories", action="store_true",
                   help="write only the tokenizer and the benchmark file")
    return p


def train_parser() -> argparse.ArgumentParser:
    d = TrainConfig.__dataclass_fields__
    p = argparse.ArgumentParser(prog="python -m nano train",
                                description="Supervised training from scratch (state-masked "
                                "loss, with a fading LM loss on the documents). Resumes from "
                                "OUT/checkpoint when it exists.")
    p.add_argument("--data", default=_env("NANO_DATA", f"{DEFAULT_DATA_DIR}/train.jsonl"),
                   help="trajectories [NANO_DATA]")
    p.add_argument("--tokenizer", default=_env("NANO_TOKENIZER", f"{DEFAULT_DATA_DIR}/tokenizer"),
                   help="[NANO_TOKENIZER]")
    p.add_argument("--out", default=_env("NANO_OUT", DEFAULT_OUT), help="[NANO_OUT]")
    p.add_argument("--init", default=_env("NANO_INIT", None),
                   help="start from this saved model instead of from scratch [NANO_INIT]")
    for name in ("hidden", "layers", "heads", "kv_heads", "intermediate", "max_len",
                 "batch_tokens", "steps", "warmup", "seed", "threads", "save_every",
                 "log_every", "copy_drills", "induction_steps", "induction_every"):
        p.add_argument("--" + name.replace("_", "-"), type=int,
                       default=int(_env("NANO_" + name.upper(), d[name].default)),
                       help=f"[NANO_{name.upper()}]")
    for name in ("minutes", "content_weight", "lr", "weight_decay", "doc_weight", "swap_answers",
                 "doc_fade_start", "doc_fade_end"):
        p.add_argument("--" + name.replace("_", "-"), type=float,
                       default=float(_env("NANO_" + name.upper(), d[name].default)),
                       help=f"[NANO_{name.upper()}]")
    p.add_argument("--limit", type=int, default=_env("NANO_LIMIT", None),
                   help="at most this many trajectories [NANO_LIMIT]")
    p.add_argument("--first-turns", action="store_true",
                   default=_env("NANO_FIRST_TURNS", "") not in ("", "0"),
                   help="also train on each run's first turn alone [NANO_FIRST_TURNS]")
    p.add_argument("--wire-induction", action="store_true",
                   default=_env("NANO_WIRE_INDUCTION", "") not in ("", "0"),
                   help="write an induction circuit into the fresh weights before training "
                   "(nano/wire.py) [NANO_WIRE_INDUCTION]")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("data", "train", "rl"):
        print("usage: python -m nano {data,train,rl} [--help]", file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "rl":
        try:
            from nano import rl
        except ImportError as err:
            print(f"python -m nano rl needs nano/rl.py, which this checkout lacks ({err}).",
                  file=sys.stderr)
            return 2
        return rl.main(rest) or 0
    if command == "data":
        from nano.build import build_data

        a = data_parser().parse_args(rest)
        build_data(DataConfig(out=Path(a.out),
                              benchmark=Path(a.benchmark_dir) if a.benchmark_dir else None,
                              corpus=a.corpus, engine=a.engine, vocab_size=a.vocab_size,
                              limit=int(a.limit) if a.limit else None,
                              trajectories=not a.no_trajectories))
        return 0
    from nano.sft import train

    a = train_parser().parse_args(rest)
    values = {k: v for k, v in vars(a).items()
              if k not in ("data", "tokenizer", "out", "limit", "init")}
    try:
        train(TrainConfig(data=Path(a.data), tokenizer=Path(a.tokenizer), out=Path(a.out),
                          init=Path(a.init) if a.init else None,
                          limit=int(a.limit) if a.limit else None, **values))
    except ValueError as err:  # bad flags or data: the message says what to change
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
