"""No test module imports another: what tests and benchmarks share lives in tests/fixtures/.

Every ``.py`` under tests/ and benchmarks/ is parsed (not imported) and each import resolved to
the module it names, relative imports and ``importlib.import_module("...")`` with a literal
included. Of the test tree, only ``tests.fixtures`` (helpers and the fixtures tests/conftest.py
registers) and ``tests.acas_standin`` (the ACAS stand-in server, not tests) may be imported:
importing from a tier (``tests.unit``, ``tests.e2e``, ``tests.integration``, ``tests.maf``),
a conftest included, is refused.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ("tests.fixtures", "tests.acas_standin")


def _package(path: Path) -> list[str]:
    """The dotted package a file under the repository root belongs to."""
    return list(path.relative_to(ROOT).parent.parts)


def imported_modules(source: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every module the source imports, as absolute dotted names.

    ``from a import b`` gives both ``a`` and ``a.b`` (``b`` may be a module)."""
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package(path)
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (
                    isinstance(node.func, ast.Name)
                    and node.func.id in ("import_module", "__import__")
                )
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def refused(module: str) -> bool:
    """A module of the test tree other than the shared ones (the bare ``tests`` package is fine)."""
    if not module.startswith("tests."):
        return False
    return not any(module == s or module.startswith(s + ".") for s in SHARED)


def violations(source: str, path: Path) -> list[str]:
    return sorted(
        {
            f"{path.relative_to(ROOT)}:{line}: {module}"
            for line, module in imported_modules(source, path)
            if refused(module)
        }
    )


def test_no_test_module_imports_another() -> None:
    files = sorted(p for d in ("tests", "benchmarks") for p in (ROOT / d).rglob("*.py"))
    assert len(files) > 100  # the tree was found
    found = [v for p in files for v in violations(p.read_text(), p)]
    assert not found, "import these from tests/fixtures/ instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("where", "source"),
    [
        ("tests/e2e/test_a.py", "from tests.e2e.test_b import helper"),
        ("tests/e2e/test_a.py", "from tests.e2e import test_b as b"),
        ("tests/unit/test_a.py", "import tests.unit.test_b"),
        ("tests/maf/test_a.py", "from tests.maf.conftest import Served"),
        ("tests/unit/test_a.py", "def f():\n    from tests.integration.test_b import x"),
        ("tests/unit/test_a.py", "from .test_b import helper"),
        ("tests/unit/maf/test_a.py", "from ..test_b import helper"),
        ("benchmarks/bench.py", "from tests.e2e.test_b import helper"),
        ("tests/unit/test_a.py", "importlib.import_module('tests.unit.test_b')"),
        ("tests/unit/test_a.py", "from tests import unit"),
    ],
)
def test_an_import_of_a_test_module_is_found(where: str, source: str) -> None:
    assert violations(source, ROOT / where)


@pytest.mark.parametrize(
    "source",
    [
        "from tests.fixtures.chart import template",
        "from tests.fixtures import egress_probe as closed",
        "from tests.acas_standin import StandinServer",
        "import pytest\nfrom sandbox_operator import labels",
    ],
)
def test_shared_modules_may_be_imported(source: str) -> None:
    assert violations(source, ROOT / "tests" / "unit" / "test_a.py") == []
