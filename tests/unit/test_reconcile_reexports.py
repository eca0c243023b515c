"""A name of the reconciler is imported from the module that defines it, never through another
reconcile module that imported it first: reconcile/sandbox.py once re-exported twenty names (its
``__all__``) so the handlers and tests could import them from there, which hid where each one
lives and tied every importer to the pass module. Parsed from the sources of src/, tests/,
benchmarks/ and hack/; function-level imports count too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECONCILE = ROOT / "src" / "sandbox_operator" / "reconcile"
PACKAGE = "sandbox_operator.reconcile"


def _top_level(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names the module defines, names it imports) at its top level."""
    defined: set[str] = set()
    imported: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return defined, imported - defined


def _modules() -> dict[str, tuple[set[str], set[str]]]:
    return {
        f"{PACKAGE}.{path.stem}": _top_level(ast.parse(path.read_text()))
        for path in RECONCILE.glob("*.py")
        if path.stem != "__init__"
    }


def _importers() -> list[Path]:
    return [
        path
        for top in ("src", "tests", "benchmarks", "hack")
        for path in sorted((ROOT / top).rglob("*.py"))
    ]


def test_no_reconcile_module_lists_an_imported_name_in_all() -> None:
    found: list[str] = []
    for path in sorted(RECONCILE.glob("*.py")):
        tree = ast.parse(path.read_text())
        defined, _ = _top_level(tree)
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                names = ast.literal_eval(node.value)
                found += [f"{path.name}: {n}" for n in names if n not in defined]
    assert not found, f"re-exported, not defined here: {found}"


def test_reconcile_names_are_imported_from_where_they_are_defined() -> None:
    modules = _modules()
    found: list[str] = []
    for path in _importers():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.module not in modules:
                continue
            _, reexported = modules[node.module]
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno} {a.name} from {node.module}"
                for a in node.names
                if a.name in reexported
            ]
    assert not found, f"import these from the module that defines them: {found}"
