"""hack/pytest_total.py: one closing line for several pytest runs, the verdict of them all."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "pytest_total", Path(__file__).resolve().parents[2] / "hack" / "pytest_total.py"
)
assert _SPEC is not None and _SPEC.loader is not None
total = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(total)


def _log(tmp_path: Path, name: str, closing: str) -> str:
    path = tmp_path / name
    path.write_text(f"....\n{'=' * 10} {closing} {'=' * 10}\n")
    return str(path)


def test_the_two_parts_of_the_cluster_run_sum_without_their_deselections(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    concurrent = _log(tmp_path, "a.log", "243 passed, 22 deselected in 641.62s (0:10:41)")
    exclusive = _log(tmp_path, "b.log", "22 passed, 243 deselected in 371.39s (0:06:11)")
    assert total.main([concurrent, exclusive], drop=frozenset({"deselected"})) == 0
    assert "265 passed in 1013.01s (all runs)" in capsys.readouterr().out
    assert total.main([concurrent, exclusive]) == 0
    assert "265 passed, 265 deselected" in capsys.readouterr().out


def test_a_failure_or_a_run_that_did_not_finish_fails_the_total(tmp_path: Path) -> None:
    passed = _log(tmp_path, "a.log", "10 passed in 1.00s")
    failed = _log(tmp_path, "b.log", "1 failed, 9 passed in 1.00s")
    assert total.main([passed, failed]) == 1
    assert total.main([passed, str(tmp_path / "missing.log")]) == 1
