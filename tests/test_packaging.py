"""The package metadata: console commands that resolve, and the runtime set in one place."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_pip_install_editable_gives_working_commands(tmp_path):
    """The README's `pip install -e .`, in a fresh virtual environment that sees the
    installed requirements: the commands exist and run."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "-e",
                          str(ROOT)], capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr[-2000:]
    for command in ("llds-curves", "llds-evaluate"):
        result = subprocess.run([str(venv / "bin" / command), "--help"], capture_output=True,
                                text=True, timeout=120, cwd=tmp_path)
        assert result.returncode == 0 and "usage" in result.stdout, result.stderr[-2000:]
