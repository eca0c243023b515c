"""Shared pytest wiring: fixtures live in tests/fixtures/, one module per concern.

The fixture modules registered here (cluster, operator, and those other tests share by fixture
name) need the operator's extras (the sync `kubernetes` client, PyYAML); a venv with only the
base install (the client an agent installs alone) runs the client's unit tests without them, so
they are loaded only where those extras are installed. Helper modules under tests/fixtures/ that
are not fixtures are imported by the tests that use them.
"""

import importlib.util

_OPERATOR_EXTRAS = ("kubernetes", "yaml")

pytest_plugins = (
    [
        name
        for name in (
            "tests.fixtures.cluster",
            "tests.fixtures.operator",
            "tests.fixtures.reconcile",
            "tests.fixtures.egress_probe",
            "tests.fixtures.egress_tls",
            "tests.fixtures.suspend",
            "tests.fixtures.acas_operator",
            "tests.fixtures.podenv",
        )
        if importlib.util.find_spec(name) is not None
    ]
    if all(importlib.util.find_spec(dep) is not None for dep in _OPERATOR_EXTRAS)
    else []
)

# The maf tiers import maf-sandbox, installed only in .venv-maf (Python 3.12): a venv without
# it (the main 3.11 one) does not collect them rather than fail on the import.
collect_ignore = [] if importlib.util.find_spec("maf_sandbox") is not None else ["maf", "unit/maf"]
