"""No import circle in src/sandbox_operator: every module's imports, at top level, in functions
and under ``TYPE_CHECKING`` alike, form a graph without cycles. A circle is a module that cannot
be understood (or imported first) without the one that imports it; break it by moving what both
need to a module of its own."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "sandbox_operator"


def _modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for path in (SRC / PACKAGE).rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project's modules ``module`` imports (the deepest existing module of each name)."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names]
        for name in names:
            target = resolve(name) if name.startswith(PACKAGE) else None
            if target is not None and target != module:
                found.add(target)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_of_src_has_no_circle() -> None:
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    assert len(graph) > 100  # the walk found the package
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
