#!/usr/bin/env python3
"""Rewrite the generated tables of docs/ from their sources (`make docs`).

The reasons, metrics and RBAC tables are rendered by sandbox_operator.docgen between marker
comments; tests/unit/test_docgen.py fails when a committed page differs. `--check` only reports
what is out of date and exits 1 if anything is.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from sandbox_operator.docgen import drift, write_all  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report drift, change nothing")
    args = parser.parse_args(argv)
    if args.check:
        stale = drift(ROOT)
        for what in stale:
            print(f"docs: out of date: {what} (run `make docs`)", file=sys.stderr)
        return 1 if stale else 0
    for path in write_all(ROOT):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
