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
