"""Which package of src/sandbox_operator may import which: AGENTS.md's "Import rules" table,
held against every import in the sources (tests/fixtures/import_graph.py: top level, inside
functions and under ``TYPE_CHECKING`` alike).

The table is the one source of the rules; this test reads it. So that the table cannot be
loosened until the sources pass, the rules the project fixed (issue #40 item 3) are written here
too and the table must keep them: contract <- policy <- backends <- reconcile <- cli, the client
never imports backends, reconcile, config or cli, backends never import reconcile, config or cli.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fixtures.import_graph import PACKAGE, SRC, ImportSite, all_sites, modules, unit

AGENTS = Path(__file__).resolve().parents[2] / "AGENTS.md"

#: Each lower one is never to import a higher one.
CHAIN = ("contract", "policy", "backends", "reconcile", "cli")
#: (importer, imported) pairs never allowed, whatever the table says.
FIXED_FORBIDDEN = frozenset(
    {(low, high) for i, low in enumerate(CHAIN) for high in CHAIN[i + 1 :]}
    | {("client", other) for other in ("backends", "reconcile", "config", "cli")}
    | {("backends", other) for other in ("reconcile", "config", "cli")}
)

Rules = dict[str, frozenset[str]]


def parse_rules(text: str) -> tuple[list[str], Rules]:
    """The rows of the "Import rules" table, in order, and what each may import."""
    section = text.split("\n## Import rules\n", 1)[1].split("\n## ", 1)[0]
    order: list[str] = []
    rules: Rules = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        name = cells[0].strip("`")
        order.append(name)
        rules[name] = frozenset(re.findall(r"`([a-z_]+)`", cells[1]))
    return order, rules


def violations(sites: list[ImportSite], rules: Rules, root: Path = SRC.parent) -> list[str]:
    """One line per import the rules do not allow: the file, the line and the row broken."""
    found: list[str] = []
    seen: set[tuple[Path, int, str]] = set()
    for site in sites:
        if (site.path, site.line, site.target) in seen:
            continue  # ``from a import b, c``: one line per statement and module
        seen.add((site.path, site.line, site.target))
        importer, imported = unit(site.importer), unit(site.target)
        if importer == imported or imported == PACKAGE:
            continue
        allowed = rules.get(importer, frozenset())
        if imported not in allowed:
            where = site.path.relative_to(root) if site.path.is_relative_to(root) else site.path
            found.append(
                f"{where}:{site.line}: {importer} imports {imported} ({site.target}); "
                f'AGENTS.md "Import rules": {importer} may import '
                f"{', '.join(sorted(allowed)) or 'nothing'}"
            )
    return found


def _units(src: Path = SRC) -> set[str]:
    return {unit(m) for m in modules(src)} - {PACKAGE}


def test_every_import_in_src_is_one_the_table_allows() -> None:
    _, rules = parse_rules(AGENTS.read_text())
    sites = all_sites()
    assert len(sites) > 500  # the walk found the package's imports
    assert violations(sites, rules) == []


def test_the_table_places_every_package_and_names_no_other() -> None:
    order, rules = parse_rules(AGENTS.read_text())
    assert len(order) == len(set(order)), "a package has two rows"
    assert sorted(_units()) == sorted(order)
    named = {n for allowed in rules.values() for n in allowed}
    assert named <= set(order), f"rows allow imports of unknown packages: {named - set(order)}"


def table_faults(order: list[str], rules: Rules) -> list[str]:
    """What is wrong with the table itself: a row allowing a row listed after it (a possible
    circle), or an allowed pair the fixed rules forbid."""
    faults = []
    for position, name in enumerate(order):
        after = rules[name] - set(order[:position])
        if after:
            faults.append(f"{name} may import rows listed after it: {sorted(after)}")
    for a, b in sorted({(a, b) for a, allowed in rules.items() for b in allowed}):
        if (a, b) in FIXED_FORBIDDEN:
            faults.append(f"{a} may import {b}, which the fixed rules forbid")
    return faults


def test_the_table_is_layered_and_keeps_the_fixed_rules() -> None:
    assert table_faults(*parse_rules(AGENTS.read_text())) == []


def test_a_loosened_table_is_refused() -> None:
    order = ["contract", "policy", "backends", "reconcile", "client"]
    rules: Rules = {
        "contract": frozenset({"policy"}),
        "policy": frozenset({"contract"}),
        "backends": frozenset({"contract", "policy"}),
        "reconcile": frozenset({"backends"}),
        "client": frozenset({"contract", "backends"}),
    }
    assert table_faults(order, rules) == [
        "contract may import rows listed after it: ['policy']",
        "client may import backends, which the fixed rules forbid",
        "contract may import policy, which the fixed rules forbid",
    ]


def test_the_package_root_imports_nothing() -> None:
    root = SRC / PACKAGE / "__init__.py"
    assert [s for s in all_sites() if s.path == root] == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = tmp_path / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return tmp_path


RULES: Rules = {"contract": frozenset(), "backends": frozenset({"contract"}), "client": frozenset()}


@pytest.mark.parametrize(
    "source",
    [
        "from sandbox_operator.backends.driver import X\n",
        "from ..backends import driver\n",
        "from sandbox_operator import backends\n",
        "import sandbox_operator.backends.driver\n",
        "def f():\n    from sandbox_operator.backends.driver import X\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from sandbox_operator.backends.driver import X\n",
    ],
    ids=["absolute", "relative", "package", "plain", "in-function", "type-checking"],
)
def test_a_wrong_import_is_named_by_file_line_and_rule(tmp_path: Path, source: str) -> None:
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "contract/__init__.py": "",
            "backends/__init__.py": "",
            "backends/driver.py": "from sandbox_operator.contract import X\n",
            "client/__init__.py": "",
            "client/plane.py": "import os\n\n" + source,
        },
    )
    found = violations(all_sites(src), RULES, root=src)
    assert len(found) == 1
    assert re.match(
        r"sandbox_operator/client/plane\.py:[3-6]: client imports backends "
        r"\(sandbox_operator\.backends(\.driver)?\); "
        r'AGENTS.md "Import rules": client may import nothing$',
        found[0],
    ), found


def test_the_table_parser_reads_rows_in_order() -> None:
    text = (
        "# Title\n\n## Import rules\n\n| package | may import | why |\n| --- | --- | --- |\n"
        "| `contract` | — | base |\n| `client` | `contract`, `naming` | agents |\n\n## Next\n"
        "| `other` | `x` | not this table |\n"
    )
    assert parse_rules(text) == (
        ["contract", "client"],
        {"contract": frozenset(), "client": frozenset({"contract", "naming"})},
    )
