"""The package layout: no import cycles (function-level imports included) and
dependencies that point one way, from front ends to the core.

Imports are read from the source with `ast`, so an import hidden inside a function
counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "app", "curves", "evaluator", "nano", "retriever")

# Which package may import which. `retriever` and `curves` stand alone; `agent` is the
# core the front ends share; `app` is the outermost front end.
ALLOWED = {
    "retriever": set(),
    "curves": set(),
    "agent": {"retriever"},
    "evaluator": {"agent", "retriever"},
    "nano": {"agent", "curves", "evaluator", "retriever"},  # experiments read logs via curves
    "app": {"agent", "curves", "evaluator", "nano", "retriever"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Modules of this repository that `module` imports, anywhere in its body."""
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node)
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for name in names:
            # the longest prefix that is one of our modules: `a.b.c` may be a name in `a.b`
            parts = name.split(".")
            for end in range(len(parts), 0, -1):
                candidate = ".".join(parts[:end])
                if candidate in known:
                    if candidate != module:
                        targets.add(candidate)
                    break
    return targets


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {module: _imports(module, path, known) for module, path in known.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _is_package_init(module: str) -> bool:
    return (ROOT / Path(*module.split(".")) / "__init__.py").exists()


def test_no_import_cycles_even_through_function_level_imports():
    graph = _graph()
    # A package's __init__ re-exporting its modules is not a cycle of logic: a module
    # importing `pkg.mod` also runs `pkg/__init__`, which is the language, not the design.
    graph = {
        module: {t for t in targets if not (_is_package_init(t) and module.startswith(t + "."))}
        for module, targets in graph.items()
        if not _is_package_init(module)
    }
    assert _cycles(graph) == []


def test_dependencies_point_from_front_ends_to_the_core():
    wrong = []
    for module, targets in _graph().items():
        package = module.split(".")[0]
        for target in targets:
            other = target.split(".")[0]
            if other != package and other not in ALLOWED[package]:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_the_checker_sees_a_cycle_hidden_in_a_function():
    graph = {"a.x": {"a.y"}, "a.y": {"a.x"}, "a.z": set()}
    assert _cycles(graph) == [["a.x", "a.y"]]
