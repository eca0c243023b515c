"""Shared pytest wiring: fixtures live in tests/fixtures/, one module per concern."""

import importlib.util

pytest_plugins = [
    name
    for name in ("tests.fixtures.cluster", "tests.fixtures.operator")
    if importlib.util.find_spec(name) is not None
]
