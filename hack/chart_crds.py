#!/usr/bin/env python3
"""Copy the generated CRDs from crds/ into the Helm chart (charts/sandbox-operator/files/crds/).

The chart's CRD template reads these files; they must be byte-for-byte copies of crds/, which is
generated from the contract models (hack/gen_crds.py). Never edit the chart's copies by hand:
run `make chart-crds` (this script). `--check` only reports drift and exits 1 if there is any;
tests/unit/test_chart_crds.py makes the same check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "crds"
TARGET = ROOT / "charts" / "sandbox-operator" / "files" / "crds"


def drift(source: Path = SOURCE, target: Path = TARGET) -> list[str]:
    """Names of CRD files that differ between source and target (missing, extra or changed)."""
    want = {p.name: p.read_bytes() for p in sorted(source.glob("*.yaml"))}
    have = (
        {p.name: p.read_bytes() for p in sorted(target.glob("*.yaml"))} if target.is_dir() else {}
    )
    return sorted(n for n in want.keys() | have.keys() if want.get(n) != have.get(n))


def sync(source: Path = SOURCE, target: Path = TARGET) -> list[str]:
    """Make target an exact copy of source's *.yaml; return the names it changed."""
    changed = drift(source, target)
    target.mkdir(parents=True, exist_ok=True)
    for name in changed:
        src, dst = source / name, target / name
        if src.exists():
            dst.write_bytes(src.read_bytes())
        else:
            dst.unlink()
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report drift, change nothing")
    args = parser.parse_args(argv)
    if not any(SOURCE.glob("*.yaml")):
        print(
            f"chart-crds: no CRDs in {SOURCE.relative_to(ROOT)}/ (run `make crds`)", file=sys.stderr
        )
        return 1
    if args.check:
        changed = drift()
        for name in changed:
            print(f"chart-crds: {name} differs from crds/{name}", file=sys.stderr)
        return 1 if changed else 0
    for name in sync():
        print(f"chart-crds: updated {TARGET.relative_to(ROOT)}/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
