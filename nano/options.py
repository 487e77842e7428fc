"""Config fields that carry their command-line help: `python -m nano` builds every flag
(and its NANO_* env-var fallback) from the config dataclasses' fields and this metadata."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def option(default: Any, help: str, flag: str | None = None,
           choices: tuple[str, ...] | None = None) -> Any:
    """A dataclass field with its default, its help text and, where the field's name is not
    the flag's (`--lambda` for llds_lambda), the flag; `choices` limits a string."""
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices})


def flag_of(config: Any, name: str) -> str:
    """The command-line flag of a config field (`--lambda` for llds_lambda)."""
    return config.__dataclass_fields__[name].metadata.get("flag") or "--" + name.replace("_", "-")


def check_bounds(config: Any, at_least_one: tuple[str, ...] = (),
                 not_negative: tuple[str, ...] = ()) -> None:
    """Refuse counts below 1 and amounts below 0, naming the flag as the user typed it."""
    for name in at_least_one:
        if getattr(config, name) < 1:
            raise ValueError(f"{flag_of(config, name)} is {getattr(config, name)}; it must be "
                             "at least 1.")
    for name in not_negative:
        if getattr(config, name) < 0:
            raise ValueError(f"{flag_of(config, name)} is {getattr(config, name)}; it cannot "
                             "be negative.")
