"""AGENTS.md's "Which operator test shows what" table is held against the tree (#40 item 4):
every file it names exists, every test name it gives in parentheses (``(`bound`)``, as ``-k``
would select) matches a test of that file, and every test module under tests/ has a row, but
for the few listed in ``NO_ROW`` with why. A module moved, renamed or added without its row
fails here.

In a row's first cell a name with a ``/`` is a path from the repository root; a bare
``test_x.py`` lies in the directory of the path before it in the cell.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ROOT / "AGENTS.md"
HEADING = "## Which operator test shows what"

#: Test modules that need no row, and why: they test the tests' own support or CI's tooling,
#: not a behaviour of the product or of the local cluster.
NO_ROW = {
    "tests/unit/test_acas_standin.py": "the ACA stand-in (tests/acas_standin/) is test support",
    "tests/unit/test_pytest_total.py": "hack/pytest_total.py sums CI's pytest runs",
}


@dataclass(frozen=True)
class Named:
    """One file a row's first cell names, with the test names given for it in parentheses."""

    path: str
    keywords: tuple[str, ...]
    row: str


def table_rows(text: str) -> list[str]:
    """The first cells of the table under ``HEADING`` (header and rule left out)."""
    if HEADING not in text:
        raise AssertionError(f"AGENTS.md has no section {HEADING!r}")
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    cells = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("|")]
    return [c for c in cells[2:] if c]


def named_files(cell: str) -> list[Named]:
    """The files a first cell names, bare names resolved against the path before them, each with
    the backquoted names in the parentheses right after it."""
    out: list[Named] = []
    directory = ""
    for match in re.finditer(r"`([^`]+\.py)`((?:\s*\([^)]*\))*)", cell):
        name, after = match.group(1), match.group(2)
        if "/" in name:
            directory = str(Path(name).parent)
            path = name
        elif directory:
            path = f"{directory}/{name}"
        else:
            raise AssertionError(f"{name!r} has no path before it to lie beside: {cell}")
        keywords = tuple(re.findall(r"`([^`]+)`", after))
        out.append(Named(path, keywords, cell))
    return out


def names_of_tests(path: Path) -> list[str]:
    """The names of the test functions of a module, in classes too."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    ]


def repository_modules() -> dict[str, list[str]]:
    """Every test module under tests/, with its tests' names."""
    return {
        str(p.relative_to(ROOT)): names_of_tests(p) for p in (ROOT / "tests").rglob("test_*.py")
    }


def problems(text: str, modules: dict[str, list[str]]) -> list[str]:
    """What is wrong with the table in ``text`` against ``modules`` (each test module there is,
    with its tests' names): a named file that does not exist, a test name no test of its file
    has, a test module without a row."""
    found: list[str] = []
    named: set[str] = set()
    for cell in table_rows(text):
        for item in named_files(cell):
            named.add(item.path)
            if item.path not in modules and not (ROOT / item.path).is_file():
                found.append(f"{item.path}: named in the table, no such file")
                continue
            tests = modules.get(item.path, [])
            for keyword in item.keywords:
                if not any(keyword in t for t in tests):
                    found.append(f"{item.path}: no test matches `{keyword}`")
    for module in sorted(set(modules) - named - set(NO_ROW)):
        found.append(f"{module}: a test module with no row in the table")
    for module in sorted(set(NO_ROW) & named):
        found.append(f"{module}: has a row and is in NO_ROW too")
    return found


def test_the_table_names_what_exists_and_every_test_module() -> None:
    found = problems(AGENTS.read_text(), repository_modules())
    assert not found, "AGENTS.md, " + HEADING.lstrip("# ") + ":\n" + "\n".join(found)


def test_the_modules_that_need_no_row_exist() -> None:
    assert all((ROOT / path).is_file() for path in NO_ROW), NO_ROW


TABLE = f"""{HEADING}

| File | What it shows |
| --- | --- |
| `tests/unit/test_a.py`, `test_b.py` (`fast`) | a and b |
| `tests/e2e/test_c.py` (slow) | c |

## Next
"""


def test_bare_names_lie_beside_the_path_before_them() -> None:
    (cell, _) = table_rows(TABLE)
    assert [(n.path, n.keywords) for n in named_files(cell)] == [
        ("tests/unit/test_a.py", ()),
        ("tests/unit/test_b.py", ("fast",)),
    ]


GOOD = {
    "tests/unit/test_a.py": ["test_a"],
    "tests/unit/test_b.py": ["test_b_fast", "test_b_slow"],
    "tests/e2e/test_c.py": ["test_c"],
}


def test_a_table_in_step_with_the_tree_passes() -> None:
    assert problems(TABLE, GOOD) == []


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"tests/integration/test_new.py": ["test_new"]},
         "tests/integration/test_new.py: a test module with no row"),
        ({"tests/e2e/test_c.py": None, "tests/integration/test_c.py": ["test_c"]},
         "tests/e2e/test_c.py: named in the table, no such file"),
        ({"tests/unit/test_b.py": ["test_b_slow"]}, "tests/unit/test_b.py: no test matches `fast`"),
    ],
)  # fmt: skip
def test_a_stale_table_is_found(change: dict[str, list[str] | None], needle: str) -> None:
    modules = {**GOOD, **change}
    found = problems(TABLE, {k: v for k, v in modules.items() if v is not None})
    assert any(needle in p for p in found), found
