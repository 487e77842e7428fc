"""The package metadata: console commands that resolve, and the runtime set in one place."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_console_command_names_a_callable_main():
    scripts = PROJECT["project"]["scripts"]
    assert {"llds-studio", "llds-evaluate", "llds-retriever", "llds-curves",
            "llds-nano"} <= set(scripts)
    for name, target in scripts.items():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), name


def test_dependencies_are_the_pinned_requirements():
    assert "dependencies" in PROJECT["project"]["dynamic"]
    source = PROJECT["tool"]["setuptools"]["dynamic"]["dependencies"]["file"]
    assert source == ["requirements.txt"]
    pins = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text(
        encoding="utf-8").splitlines()]
    assert "torch==2.13.0" in pins
