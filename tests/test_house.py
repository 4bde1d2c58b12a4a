"""The package's shape, checked: no import cycle, no upward import, modules of a readable size.

The layers (docs/development.md, "Layering"): a module imports only from its own layer or the
ones below.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "exporter" / "gpufleet"

# Bottom first. A top-level module or sub-package of gpufleet belongs to exactly one layer.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"__init__", "schema", "exposition"}),
    frozenset({"reporter", "client", "web", "promapi", "secrets"}),
    frozenset({"gpu", "fleet", "rules"}),
    frozenset({"agent", "sources", "dashboards"}),
    frozenset({"simulate"}),
    frozenset({"detect"}),
    frozenset({"lab", "demo", "deploytree"}),
    frozenset({"cli", "__main__"}),
)
LONG_MODULE_LINES = 460  # "about 450"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The gpufleet modules the file imports, at module level or inside a function."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            subs = [f"{base}.{alias.name}" for alias in node.names]
            names = [sub for sub in subs if sub in modules] or [base]
        else:
            continue
        out.update(target for target in names if target in modules and target != name)
    return out


def _area(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"  # gpufleet itself: its version


def _layer(area: str) -> int:
    for index, layer in enumerate(LAYERS):
        if area in layer:
            return index
    raise AssertionError(f"gpufleet.{area} is in no layer of tests/test_house.py: add it")


def test_no_module_imports_a_higher_layer() -> None:
    modules = _modules()
    upward = []
    for name, path in modules.items():
        for target in _imports(name, path, modules):
            if _layer(_area(target)) > _layer(_area(name)):
                upward.append(f"{name} -> {target}")
    assert not upward, upward


def test_no_import_cycle_between_modules() -> None:
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for target in _imports(name, path, modules):
            # a package's __init__ re-exporting its own modules is not a cycle
            if not (path.name == "__init__.py" and target.startswith(name + ".")):
                graph[name].add(target)
    cycles = _cycles(graph)
    assert not cycles, cycles


def test_no_module_is_long_without_saying_why() -> None:
    long = []
    for name, path in _modules().items():
        lines = path.read_text().splitlines()
        if len(lines) > LONG_MODULE_LINES and not any(
            line.startswith("# long module:") for line in lines[:15]
        ):
            long.append(f"{name}: {len(lines)} lines")
    assert not long, f"over {LONG_MODULE_LINES} lines with no '# long module: <why>': {long}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    return found
