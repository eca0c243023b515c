"""collect_outputs phases and the filesystem sink."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_operator.client import (
    Artifact,
    ArtifactNameCollision,
    CollectedOutputs,
    LandingExists,
    LandingNotConfined,
    OutputMissing,
    OutputNotRegular,
    SinkRequired,
    TransferCapExceeded,
    collect_outputs,
    make_file_system_sink,
)
from tests.fixtures.client_outputs import ListSink, make, put


async def test_collects_in_declaration_order(tmp_path: Path) -> None:
    sb, _ = make(
        tmp_path,
        [
            {"path": "b.png", "mediaType": "image/png"},
            {"path": "out/a.txt", "mediaType": "text/plain", "name": "a.txt"},
            {"path": "opt.txt", "mediaType": "text/plain", "required": False},
            {"path": "c.json", "mediaType": "application/json", "disposition": "consume"},
        ],
    )
    put(tmp_path, "b.png", b"\x89PNG")
    put(tmp_path, "out/a.txt", b"aaa")
    put(tmp_path, "c.json", b"{}")
    sink = ListSink()
    result = await collect_outputs(sb, sink)
    assert isinstance(result, CollectedOutputs)
    assert [a.name for a in result.landed] == ["b.png", "a.txt"]
    assert [a.data for a in sink.delivered] == [b"\x89PNG", b"aaa"]
    assert result.absent == ["opt.txt"]
    assert result.consumed["c.json"].data == b"{}"


async def test_sink_required_before_touching(tmp_path: Path) -> None:
    sb, rec = make(tmp_path, [{"path": "a", "mediaType": "text/plain"}])
    with pytest.raises(SinkRequired):
        await collect_outputs(sb, None)
    assert rec.calls == []


async def test_collision_before_touching(tmp_path: Path) -> None:
    sb, rec = make(
        tmp_path,
        [
            {"path": "x/Report.txt", "mediaType": "text/plain", "name": "Report.txt"},
            {"path": "y/report.txt", "mediaType": "text/plain", "name": "report.txt"},
        ],
    )
    with pytest.raises(ArtifactNameCollision):
        await collect_outputs(sb, ListSink())
    assert rec.calls == []


async def test_missing_required_refuses_without_delivery(tmp_path: Path) -> None:
    sb, rec = make(
        tmp_path,
        [{"path": "a", "mediaType": "text/plain"}, {"path": "b", "mediaType": "text/plain"}],
    )
    put(tmp_path, "a", b"1")
    sink = ListSink()
    with pytest.raises(OutputMissing) as info:
        await collect_outputs(sb, sink)
    assert info.value.path == "b"
    assert sink.delivered == []
    assert not any(c.startswith("read") for c in rec.calls)


@pytest.mark.parametrize(
    ("sizes", "cap"),
    [([101], "max_bytes_per_file"), ([80, 80], "max_total_bytes")],
)
async def test_caps_checked_before_any_read(tmp_path: Path, sizes: list[int], cap: str) -> None:
    outs = [{"path": f"f{i}", "mediaType": "text/plain"} for i in range(len(sizes))]
    sb, rec = make(tmp_path, outs)
    for i, n in enumerate(sizes):
        put(tmp_path, f"f{i}", b"x" * n)
    sink = ListSink()
    with pytest.raises(TransferCapExceeded) as info:
        await collect_outputs(sb, sink)
    assert info.value.cap == cap
    assert info.value.direction == "filesOut"
    assert sink.delivered == []
    assert not any(c.startswith("read") for c in rec.calls)


async def test_symlinked_output_refused(tmp_path: Path) -> None:
    sb, _ = make(tmp_path, [{"path": "l", "mediaType": "text/plain"}])
    (tmp_path / "secret").write_text("s")
    (tmp_path / "work" / "l").symlink_to(tmp_path / "secret")
    with pytest.raises(OutputNotRegular) as info:
        await collect_outputs(sb, ListSink())
    assert info.value.kind == "symlink"


async def test_file_system_sink_lands_and_refuses(tmp_path: Path) -> None:
    sb, _ = make(
        tmp_path,
        [
            {"path": "a.txt", "mediaType": "text/plain"},
            {"path": "d/b.bin", "mediaType": "application/octet-stream", "name": "n/e/b.bin"},
        ],
    )
    put(tmp_path, "a.txt", b"A")
    put(tmp_path, "d/b.bin", b"\x00\xff")
    root = tmp_path / "landing"
    result = await sb.collect_outputs(make_file_system_sink(root))
    assert (root / "a.txt").read_bytes() == b"A"
    assert (root / "n/e/b.bin").read_bytes() == b"\x00\xff"
    assert result.landed[1].handle == str(root.resolve() / "n/e/b.bin")
    assert "b.bin" in result.landed[1].display
    # Existing destination refused by default, replaced on request.
    with pytest.raises(LandingExists):
        await sb.collect_outputs(make_file_system_sink(root))
    put(tmp_path, "a.txt", b"A2")
    await sb.collect_outputs(make_file_system_sink(root, existing="replace"))
    assert (root / "a.txt").read_bytes() == b"A2"


async def test_file_system_sink_confinement(tmp_path: Path) -> None:
    root = tmp_path / "root"
    elsewhere = tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / "link").symlink_to(elsewhere)
    (root / "f").symlink_to(elsewhere / "target")
    sink = make_file_system_sink(root)
    art = Artifact(name="link/x", path="x", media_type="text/plain", data=b"x")
    with pytest.raises(LandingNotConfined):
        await sink.deliver(art)
    for existing in ("refuse", "replace"):
        s = make_file_system_sink(root, existing=existing)  # type: ignore[arg-type]
        with pytest.raises(LandingNotConfined):
            await s.deliver(Artifact(name="f", path="f", media_type="text/plain", data=b"x"))
    assert os.listdir(elsewhere) == []
