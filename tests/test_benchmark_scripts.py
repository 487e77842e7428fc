"""The benchmark scripts run as `python -m benchmarks.<name>` from the checkout root, where
`benchmarks/agent.py` and friends must not hide the packages of the same names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__")


def test_every_benchmark_names_its_module_form():
    for name in SCRIPTS:
        text = (ROOT / "benchmarks" / f"{name}.py").read_text(encoding="utf-8")
        assert "sys.path" not in text, name
        assert f"python benchmarks/{name}.py" not in text, name


@pytest.mark.slow
def test_every_benchmark_imports_as_a_module_with_its_help():
    code = ("import importlib, sys\n"
            f"for name in {SCRIPTS!r}:\n"
            "    importlib.import_module('benchmarks.' + name)\n"
            "import agent, curves, evaluator, retriever\n"
            "assert all(not m.__file__.endswith(('benchmarks/agent.py', 'benchmarks/curves.py'))"
            " for m in (agent, curves))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    help_run = subprocess.run([sys.executable, "-m", "benchmarks.curves", "--help"], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    assert help_run.returncode == 0 and "usage" in help_run.stdout, help_run.stderr[-2000:]
