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
    requirements installed where this test runs: the commands exist and run. A `.pth` file
    names this interpreter's own site-packages, so the test is the same under the system
    Python (CI) and inside the virtual environment the README recommends (where
    `--system-site-packages` would see the system's packages, not the outer venv's)."""
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    inner = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True, timeout=60)
    outer = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (Path(inner.stdout.strip()) / "outer-site.pth").write_text("\n".join(outer) + "\n")
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "-e",
                          str(ROOT)], capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr[-2000:]
    for command in ("llds-curves", "llds-evaluate"):
        result = subprocess.run([str(venv / "bin" / command), "--help"], capture_output=True,
                                text=True, timeout=120, cwd=tmp_path)
        assert result.returncode == 0 and "usage" in result.stdout, result.stderr[-2000:]


def test_ci_runs_the_readmes_test_command_in_a_fresh_virtual_environment():
    """The README's two commands head it; CI types the test command as a newcomer does,
    after the README's advice to make a virtual environment."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = readme.split("Run the tests:", 1)
    assert len(blocks) == 2, "README: no 'Run the tests:' line"
    command = next(line.strip() for line in blocks[1].splitlines() if line.strip())
    assert command.startswith("pip install -r requirements.txt") and "pytest" in command
    assert "python3 -m venv .venv" in readme
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    venv = next(i for i, line in enumerate(ci) if line.startswith("python3 -m venv "))
    activate = next(i for i, line in enumerate(ci) if "/bin/activate" in line)
    runs = next(i for i, line in enumerate(ci) if line.strip() == command
                or line.strip().startswith(command.replace(" && python -m pytest", "")))
    assert venv < activate < runs
