"""A cluster test's directory and its tier marker agree.

The marker decides what cluster the fixtures bring up (tests/fixtures/cluster.py): any collected
test marked ``e2e`` asks for a node (kubelet, containerd, runc, gVisor), otherwise the control
plane alone (level ``api``). So ``make test-integration`` proves that nothing in
tests/integration/ needs a node only while no test there is marked ``e2e``, and a test in
tests/e2e/ without the marker could be run by ``-m e2e`` selections never. Collected (not run)
by pytest itself, so per-test marks and parametrized cases count as they do in a real run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NO_TESTS_COLLECTED = 5  # pytest's exit code when a selection is empty


def _collected(directory: str, selection: str) -> tuple[int, str]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--collect-only",
            "-q",
            "-m",
            selection,
            directory,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("directory", "stray"),
    [
        ("tests/integration", "e2e or not integration"),
        ("tests/e2e", "integration or not e2e"),
    ],
)
def test_every_cluster_test_carries_the_marker_of_its_directory(directory: str, stray: str) -> None:
    pytest.importorskip("kubernetes")  # the cluster tiers' fixtures need the operator's extras
    code, out = _collected(directory, stray)
    assert code == NO_TESTS_COLLECTED, f"{directory}: tests selected by -m {stray!r}:\n{out}"


def test_the_directories_hold_tests_at_all() -> None:
    """The check above would pass on an empty or unreadable tree: each tier has tests."""
    pytest.importorskip("kubernetes")
    for directory, marker in (("tests/integration", "integration"), ("tests/e2e", "e2e")):
        code, out = _collected(directory, marker)
        assert code == 0 and " tests collected" in out, out
