"""`python -m nano data|train|rl|headroom|warm`: the nano agent's data, its SFT run,
GRPO/LLDS, the choice of RL questions the starting agent has room to learn on, and the
start of an agent warm-started from a pretrained encoder.

Every command's flags are built here, by `config_parser`, from the fields of its config
dataclass (DataConfig, TrainConfig, RLConfig; the help text is in each field's metadata),
and each flag falls back to the env var NANO_<COMMAND>_<FIELD> (NANO_TRAIN_STEPS,
NANO_RL_LR, ...). Bad values and missing inputs are an error, exit 2, before anything is
read or written.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import shlex
import sys
import typing

from nano.options import flag_of

COMMANDS = {
    "data": "Write the tokenizer, training trajectories (teacher through the real agent "
            "loop) and vitalqa.",
    "train": "Supervised training from scratch (state-masked loss, with a fading LM loss "
             "on the documents); --resume goes on from OUT/checkpoint.",
    "rl": "GRPO / LLDS training of a small search agent (nano scale, CPU); --resume goes "
          "on from OUT/checkpoint.",
    "warm": "Write the starting model of an agent warm-started from a pretrained BERT "
            "encoder (all-MiniLM-L6-v2), or with --random its control, for nano train --init.",
    "headroom": "Write the training questions on which the starting agent's sampled share of "
                "right answers is in [--low, --high], for nano rl --train-data.",
}
TRUE = ("1", "true", "yes", "on")


def env_name(command: str, field: str) -> str:
    return f"NANO_{command.upper()}_{field.upper()}"


def _flag_type(hint: typing.Any) -> tuple[type, bool]:
    """(the value's type, whether None is allowed) of a field's annotation."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if args:
        return args[0], len(args) < len(typing.get_args(hint))
    return hint, False


def config_parser(command: str, config_class: type) -> argparse.ArgumentParser:
    """One flag per field of `config_class`: its name with dashes (or the `flag` in its
    metadata), its type from the annotation, its default from NANO_<COMMAND>_<FIELD> or the
    field; booleans are --name/--no-name."""
    parser = argparse.ArgumentParser(prog=f"python -m nano {command}",
                                     description=COMMANDS[command])
    hints = typing.get_type_hints(config_class)
    # The command's own fields first, then those it shares with others (a base class's).
    own = vars(config_class).get("__annotations__", {})
    for field in sorted(dataclasses.fields(config_class), key=lambda f: f.name not in own):
        kind, optional = _flag_type(hints[field.name])
        env = env_name(command, field.name)
        flag = flag_of(config_class, field.name)
        raw = os.environ.get(env)
        help_text = f"{field.metadata.get('help', '')} [{env}]"
        if kind is bool:
            default = field.default if raw is None else raw.strip().lower() in TRUE
            parser.add_argument(flag, dest=field.name, default=default, help=help_text,
                                action=argparse.BooleanOptionalAction)
            continue
        # argparse converts a string default with `type`, so a bad env value is a usage error.
        default = field.default if raw is None else (None if optional and not raw else raw)
        parser.add_argument(flag, dest=field.name, type=kind, default=default,
                            choices=field.metadata.get("choices"),
                            help=help_text + " (default: %(default)s)")
    return parser


def _config_class(command: str) -> type:
    if command == "data":
        from nano.build import DataConfig

        return DataConfig
    if command == "train":
        from nano.sft import TrainConfig

        return TrainConfig
    if command == "headroom":
        from nano.headroom import HeadroomConfig

        return HeadroomConfig
    if command == "warm":
        from nano.warm import WarmConfig

        return WarmConfig
    from nano.rl import RLConfig

    return RLConfig


def _run(command: str, config, argv: list[str]) -> None:
    if command == "data":
        from nano.build import build_data

        build_data(config)
    elif command == "train":
        from nano.sft import check_paths, train

        check_paths(config)
        train(config)
    elif command == "warm":
        from nano.warm import build

        build(config)
    elif command == "headroom":
        from nano.headroom import check_paths, measure, report

        check_paths(config)
        print(report(measure(config), config))
    else:
        from nano.rl import check_paths, train

        check_paths(config)
        out = train(config, "python -m nano rl " + shlex.join(argv))
        print(f"done: logs in {out / 'train.log'} and {out / 'metrics.jsonl'}, model in "
              f"{out / 'model'}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m nano {{{','.join(COMMANDS)}}} [--help]", file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if importlib.util.find_spec("torch") is None:
        print(f"python -m nano {command} needs PyTorch, which is not installed in this "
              "environment: install torch (see README) and run it again.", file=sys.stderr)
        return 2
    from evaluator.benchmarks import DataError
    from nano.checkpoint import CheckpointError

    config_class = _config_class(command)
    args = config_parser(command, config_class).parse_args(rest)
    try:
        config = config_class(**vars(args))
        _run(command, config, rest)
    except (ValueError, DataError, CheckpointError) as err:
        # bad flags, inputs or checkpoint: the message says what to change
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
