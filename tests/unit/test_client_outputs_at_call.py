"""Outputs a workload can name only when it runs (#25 item 9): the spec's
``outputsNamedAtCallTime`` gates them, ``list_outputs`` names what a directory holds (the
list-then-collect route), and ``collect_outputs(named_at_call=...)`` collects them with the
declared ones, in the same phases and under the same caps."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from sandbox_operator.client import (
    ArtifactNameCollision,
    ArtifactNameInvalid,
    CallTimeOutputsNotAllowed,
    CapabilityNotRequired,
    OutputNotRegular,
    SyncSandbox,
    TransferCapExceeded,
    collect_outputs,
    list_outputs,
)
from sandbox_operator.client.sync import _Loop
from sandbox_operator.contract import Capability, DeclaredOutput, Disposition, SandboxSpec
from tests.fixtures.client_outputs import ListSink, make, put


def at_call(tmp_path: Path, *, flag: bool = True, **fields: Any) -> Any:
    sandbox, rec = make(tmp_path, [{"path": "report.txt", "mediaType": "text/plain"}])
    sandbox.spec = sandbox.spec.model_copy(update={"outputs_named_at_call_time": flag, **fields})
    sandbox.required = frozenset(sandbox.spec.requires)
    return sandbox, rec


def out(path: str, **fields: Any) -> DeclaredOutput:
    return DeclaredOutput(path=path, media_type="image/png", **fields)


async def test_without_the_flag_nothing_named_at_the_call_is_collected(tmp_path: Path) -> None:
    sandbox, rec = at_call(tmp_path, flag=False)
    put(tmp_path, "report.txt", b"r")
    put(tmp_path, "plots/a.png", b"a")
    sink = ListSink()
    with pytest.raises(CallTimeOutputsNotAllowed) as caught:
        await collect_outputs(sandbox, sink, named_at_call=[out("plots/a.png")])
    assert caught.value.kind == "t" and caught.value.count == 1
    assert isinstance(caught.value, ValueError)
    assert rec.calls == [] and sink.delivered == []  # refused before the sandbox is touched


async def test_list_then_collect_lands_the_declared_and_the_listed(tmp_path: Path) -> None:
    sandbox, _ = at_call(tmp_path)
    put(tmp_path, "report.txt", b"r")
    put(tmp_path, "plots/b.png", b"bb")
    put(tmp_path, "plots/a.png", b"a")
    (tmp_path / "work" / "plots" / "sub").mkdir()
    listed = await list_outputs(sandbox, "plots", media_type="image/png")
    assert [o.path for o in listed] == ["plots/a.png", "plots/b.png"]  # dirs left out
    assert all(o.media_type == "image/png" and o.disposition is Disposition.LAND for o in listed)
    sink = ListSink()
    result = await sandbox.collect_outputs(sink, named_at_call=listed)
    assert [a.name for a in result.landed] == ["report.txt", "plots/a.png", "plots/b.png"]
    assert [a.data for a in sink.delivered] == [b"r", b"a", b"bb"]


async def test_files_out_caps_the_union(tmp_path: Path) -> None:
    sandbox, rec = at_call(tmp_path)  # maxFiles 4, one declared
    put(tmp_path, "report.txt", b"r")
    names = [f"p{i}.png" for i in range(4)]
    for name in names:
        put(tmp_path, name, b"x")
    sink = ListSink()
    with pytest.raises(TransferCapExceeded) as caught:
        await collect_outputs(sandbox, sink, named_at_call=[out(n) for n in names])
    assert caught.value.cap == "max_files" and caught.value.actual == 5
    assert rec.calls == [] and sink.delivered == []


async def test_a_call_time_name_colliding_with_a_declared_one_is_refused(tmp_path: Path) -> None:
    sandbox, rec = at_call(tmp_path)
    with pytest.raises(ArtifactNameCollision):
        await collect_outputs(sandbox, ListSink(), named_at_call=[out("x.png", name="REPORT.txt")])
    assert rec.calls == []


async def test_a_listed_link_is_kept_so_the_collection_refuses_it(tmp_path: Path) -> None:
    sandbox, _ = at_call(tmp_path)
    put(tmp_path, "report.txt", b"r")
    (tmp_path / "work" / "plots").mkdir()
    os.symlink("/etc/hostname", tmp_path / "work" / "plots" / "evil.png")
    listed = await list_outputs(sandbox, "plots")
    assert [o.path for o in listed] == ["plots/evil.png"]
    sink = ListSink()
    with pytest.raises(OutputNotRegular):
        await collect_outputs(sandbox, sink, named_at_call=listed)
    assert sink.delivered == []


async def test_a_guest_name_that_is_no_literal_path_is_refused_not_skipped(
    tmp_path: Path,
) -> None:
    sandbox, _ = at_call(tmp_path)
    put(tmp_path, "plots/a*.png", b"a")
    with pytest.raises(ArtifactNameInvalid) as caught:
        await list_outputs(sandbox, "plots")
    assert caught.value.name == "plots/a*.png"


async def test_listing_is_gated_by_files_list(tmp_path: Path) -> None:
    sandbox, _ = at_call(tmp_path)
    sandbox.required = frozenset({Capability.EXEC, Capability.FILES_OUT})
    with pytest.raises(CapabilityNotRequired):
        await list_outputs(sandbox, ".")


def test_the_flag_needs_files_out_in_the_model_and_the_crd() -> None:
    from tests.fixtures.crds import BASE, spec_rules_pass

    with pytest.raises(ValidationError, match="outputsNamedAtCallTime needs files_out"):
        SandboxSpec.model_validate(
            {"kind": "k", "image": "i", "outputsNamedAtCallTime": True, "requires": ["exec"]}
        )
    assert not spec_rules_pass({**BASE, "outputsNamedAtCallTime": True})
    assert spec_rules_pass({**BASE, "outputsNamedAtCallTime": True, "requires": ["files_out"]})
    assert spec_rules_pass({**BASE, "outputsNamedAtCallTime": False})


def test_an_unset_flag_stays_off_the_wire() -> None:
    """A Sandbox created before the field existed has none: an apply must not add it."""
    spec = SandboxSpec.model_validate({"kind": "k", "image": "i"})
    assert "outputsNamedAtCallTime" not in spec.to_wire()
    flagged = spec.model_copy(
        update={"outputs_named_at_call_time": True, "requires": frozenset(Capability)}
    )
    assert flagged.to_wire()["outputsNamedAtCallTime"] is True


def test_the_sync_handle_has_the_route_too(tmp_path: Path) -> None:
    sandbox, _ = at_call(tmp_path)
    put(tmp_path, "report.txt", b"r")
    put(tmp_path, "late.png", b"z")
    loop = _Loop()
    try:
        sync = SyncSandbox(sandbox, loop)
        listed = sync.list_outputs(".")
        late = [o for o in listed if o.path == "late.png"]
        result = sync.collect_outputs(ListSink(), named_at_call=late)
        assert [a.name for a in result.landed] == ["report.txt", "late.png"]
    finally:
        loop.stop()
