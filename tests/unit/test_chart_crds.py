"""The chart's CRDs are exact copies of crds/ (made by hack/chart_crds.py, never by hand)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from tests.fixtures.chart import CHART, ROOT, by_kind, template

SOURCE = ROOT / "crds"
COPIES = CHART / "files" / "crds"


def _chart_crds_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_crds", ROOT / "hack" / "chart_crds.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _source_crds() -> dict[str, dict[str, Any]]:
    crds = [yaml.safe_load(p.read_text()) for p in sorted(SOURCE.glob("*.yaml"))]
    return {c["metadata"]["name"]: c for c in crds}


def test_crds_exist_to_copy() -> None:
    names = set(_source_crds())
    assert {"sandboxes.sandbox-operator.dev", "sandboxscopes.sandbox-operator.dev"} <= names


def test_chart_copies_are_byte_identical_to_crds_dir() -> None:
    drift = _chart_crds_script().drift(SOURCE, COPIES)
    assert drift == [], f"chart CRDs differ from crds/: {drift}; run `make chart-crds`"


def test_rendered_crds_equal_the_source_apart_from_chart_metadata() -> None:
    rendered = {c["metadata"]["name"]: c for c in by_kind(template(), "CustomResourceDefinition")}
    source = _source_crds()
    assert rendered.keys() == source.keys()
    for name, crd in rendered.items():
        meta, source_meta = crd["metadata"], source[name]["metadata"]
        assert meta["annotations"].pop("helm.sh/resource-policy") == "keep"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        # The chart adds its own labels; every label of the source survives unchanged.
        for key in [k for k in meta["labels"] if k not in source_meta.get("labels", {})]:
            assert key.startswith(("app.kubernetes.io/", "helm.sh/")), key
            meta["labels"].pop(key)
        for key in ("labels", "annotations"):
            if not meta[key] and key not in source_meta:
                del meta[key]
        assert crd == source[name], f"{name} renders differently from crds/"


def test_crds_can_be_left_out_and_unkept() -> None:
    assert by_kind(template({"crds.install": "false"}), "CustomResourceDefinition") == []
    for crd in by_kind(template({"crds.keep": "false"}), "CustomResourceDefinition"):
        assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})


def test_sync_makes_an_exact_copy_and_removes_strays(tmp_path: Path) -> None:
    script = _chart_crds_script()
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "a.yaml").write_text("kind: A\n")
    (dst / "a.yaml").write_text("kind: edited-by-hand\n")
    (dst / "stray.yaml").write_text("kind: Old\n")
    assert script.drift(src, dst) == ["a.yaml", "stray.yaml"]
    assert script.sync(src, dst) == ["a.yaml", "stray.yaml"]
    assert sorted(p.name for p in dst.iterdir()) == ["a.yaml"]
    assert (dst / "a.yaml").read_text() == "kind: A\n"
    assert script.drift(src, dst) == []
