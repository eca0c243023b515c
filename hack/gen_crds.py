#!/usr/bin/env python3
"""Write crds/*.yaml from the contract models (`make crds`)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from sandbox_operator.crdgen import write_all  # noqa: E402


def main() -> int:
    for path in write_all(ROOT / "crds"):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
