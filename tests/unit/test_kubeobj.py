"""``sandbox_operator.kubeobj`` is the one place an object's metadata is read from the wire dict
and the built-in kind names are spelled: its ``meta`` answers for an absent or null metadata, and
no other module of src/ defines a ``meta`` helper or spells one of those kinds as a literal."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from sandbox_operator import kubeobj

SRC = Path(__file__).resolve().parents[2] / "src" / "sandbox_operator"
HOME = SRC / "kubeobj.py"
KINDS = {
    kubeobj.POD_KIND,
    kubeobj.NETWORK_POLICY_KIND,
    kubeobj.PERSISTENT_VOLUME_CLAIM_KIND,
    kubeobj.SERVICE_ACCOUNT_KIND,
    kubeobj.ROLE_KIND,
    kubeobj.ROLE_BINDING_KIND,
}
#: Modules still allowed to spell a kind literal, each with why (and the kinds it may spell).
KIND_LITERAL_EXCEPTIONS: dict[str, tuple[set[str], str]] = {
    "backends/runtimeclass/observe.py": (
        {kubeobj.POD_KIND},
        "classify_pod is being split into smaller functions (#40 item 3); its one literal "
        "moves with that split rather than conflict with it",
    ),
}


@pytest.mark.parametrize(
    "obj", [None, {}, {"metadata": None}, {"metadata": {}}, {"kind": "Pod", "spec": {}}]
)
def test_meta_of_an_object_without_metadata_is_empty(obj: Any) -> None:
    assert dict(kubeobj.meta(obj)) == {}


def test_meta_is_the_objects_own_metadata_not_a_copy() -> None:
    metadata = {"name": "a", "namespace": "ns", "labels": {"x": "y"}}
    assert kubeobj.meta({"metadata": metadata}) is metadata


def test_the_empty_answer_cannot_be_written_into() -> None:
    empty: Any = kubeobj.meta(None)
    with pytest.raises(TypeError):
        empty["name"] = "shared by every caller"


def _sources() -> list[tuple[str, ast.Module]]:
    return [
        (str(path.relative_to(SRC)), ast.parse(path.read_text()))
        for path in sorted(SRC.rglob("*.py"))
        if path != HOME
    ]


def test_no_other_module_defines_a_meta_helper() -> None:
    found = [
        f"{name}:{node.lineno} {node.name}"
        for name, tree in _sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name in {"meta", "_meta"}
    ]
    assert not found, f"use sandbox_operator.kubeobj.meta instead of: {found}"


def test_no_other_module_spells_a_kind_it_holds() -> None:
    found: list[str] = []
    for name, tree in _sources():
        allowed = KIND_LITERAL_EXCEPTIONS.get(name, (set(), ""))[0]
        found += [
            f"{name}:{node.lineno} {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in KINDS and node.value not in allowed
        ]
    assert not found, f"use the kubeobj constant instead of the literal: {found}"


def test_every_exception_is_still_needed() -> None:
    sources = dict(_sources())
    for name, (kinds, _why) in KIND_LITERAL_EXCEPTIONS.items():
        spelled = {
            node.value
            for node in ast.walk(sources[name])
            if isinstance(node, ast.Constant) and node.value in kinds
        }
        assert spelled == kinds, f"{name} no longer spells {kinds - spelled}: drop the exception"
