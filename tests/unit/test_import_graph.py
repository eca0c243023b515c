"""No import circle in src/sandbox_operator: every module's imports, at top level, in functions
and under ``TYPE_CHECKING`` alike (tests/fixtures/import_graph.py), form a graph without
cycles. A circle is a module that cannot be understood (or imported first) without the one that
imports it; break it by moving what both need to a module of its own. Which package may import
which at all is tests/unit/test_import_rules.py."""

from __future__ import annotations

from tests.fixtures.import_graph import all_sites, modules


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
    graph: dict[str, set[str]] = {m: set() for m in modules()}
    for site in all_sites():
        graph[site.importer].add(site.target)
    assert len(graph) > 100  # the walk found the package
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
