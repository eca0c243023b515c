"""An exec over its output budget still kills its command when the flood on stdout overtook the
wrapper's pid line on stderr (the node copies the two streams apart, so that order is not
kept): the transport reads on for that line, and the kill reaches the group. Before, the kill
had no pid, reached ``nothing``, and the sandbox was disposed as unclean (CI, busybox on runc).

The API server is faked at ``CoreV1Api``: frames in the order the race delivers them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from sandbox_operator.client import OutputBudgetExceeded
from sandbox_operator.client.dataplane import pod as pod_module
from sandbox_operator.client.dataplane import scripts
from sandbox_operator.client.dataplane.execplane import ExecDataPlane
from sandbox_operator.client.dataplane.local import LocalExecTransport
from sandbox_operator.client.dataplane.pod import PodExecTransport, PodTarget
from sandbox_operator.client.unclean import unclean_reason

_SUCCESS = bytes([3]) + json.dumps({"status": "Success"}).encode()


@dataclass
class Msg:
    type: aiohttp.WSMsgType
    data: bytes


class Socket:
    """One exec's websocket: its frames, then closed."""

    def __init__(self, frames: Sequence[bytes]) -> None:
        self.frames = list(frames)

    async def __aenter__(self) -> Socket:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def __aiter__(self) -> AsyncIterator[Msg]:
        for frame in self.frames:
            yield Msg(aiohttp.WSMsgType.BINARY, frame)
        yield Msg(aiohttp.WSMsgType.CLOSE, b"")


class Node:
    """What the fake API server answers: the flooding command's frames (stdout first, the pid
    line after ``late`` of them), and each kill's success; it records the kills' argv."""

    def __init__(self, *, header_after: int) -> None:
        self.header_after = header_after
        self.kills: list[list[str]] = []

    def frames(self, argv: list[str]) -> list[bytes]:
        if tuple(argv[: len(scripts.KILL)]) == scripts.KILL:
            self.kills.append(argv)
            return [_SUCCESS]
        flood = [bytes([1]) + b"y\n" * 32_768 for _ in range(8)]  # 8 x 64 KiB on stdout
        header = bytes([2]) + b"SBX:pid:4242:group\n"
        return [*flood[: self.header_after], header, *flood[self.header_after :]]


def fake_api(node: Node) -> type:
    class FakeCoreV1Api:
        def __init__(self, _client: Any) -> None:
            pass

        async def connect_get_namespaced_pod_exec(
            self, _pod: str, _ns: str, *, command: list[str], **_kw: Any
        ) -> Socket:
            return Socket(node.frames(command))

    return FakeCoreV1Api


@pytest.mark.parametrize("header_after", [0, 3, 8], ids=["header-first", "mid-flood", "last"])
async def test_the_kill_reaches_the_group_whatever_arrived_first(
    monkeypatch: pytest.MonkeyPatch, header_after: int
) -> None:
    node = Node(header_after=header_after)
    monkeypatch.setattr(pod_module, "CoreV1Api", fake_api(node))
    plane = ExecDataPlane(PodExecTransport(object(), PodTarget("ns", "pod")))
    with pytest.raises(OutputBudgetExceeded) as caught:
        await plane.exec(["sh", "-c", "yes"], cwd="/work", timeout=30.0, max_output_bytes=100_000)
    exc = caught.value
    assert (exc.kill_delivered, exc.kill_reach) == (True, "group")
    assert node.kills and node.kills[0][-1] == "4242"
    assert unclean_reason(exc) is None


async def test_without_the_wait_the_line_is_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """The transport alone, asked not to wait: the pid line behind the flood never arrives
    (what made the kill reach nothing), so the wait is what the fix adds."""
    node = Node(header_after=3)
    monkeypatch.setattr(pod_module, "CoreV1Api", fake_api(node))
    transport = PodExecTransport(object(), PodTarget("ns", "pod"))
    raw = await transport.run(["sh", "-c", "yes"], stdin=None, timeout=30.0, max_output=100_000)
    assert raw.overflowed and b"SBX:pid" not in raw.stderr
    raw = await transport.run(
        ["sh", "-c", "yes"], stdin=None, timeout=30.0, max_output=100_000, header_wait=5.0
    )
    assert raw.overflowed and raw.stderr == b"SBX:pid:4242:group\n"
    assert len(raw.stdout) <= 100_000 + 65_536  # nothing more of stdout was kept


async def test_the_local_transport_reads_on_for_the_line_too() -> None:
    """The same race on local processes: the flood is written before the line."""
    script = "head -c 400000 /dev/zero; echo SBX:pid:1:group >&2; sleep 3"
    transport = LocalExecTransport()
    raw = await transport.run(
        ["sh", "-c", script], stdin=None, timeout=20.0, max_output=100_000, header_wait=5.0
    )
    assert raw.overflowed and raw.stderr == b"SBX:pid:1:group\n"
    assert len(raw.stdout) <= 100_000 + 65_536
    raw = await transport.run(["sh", "-c", script], stdin=None, timeout=20.0, max_output=100_000)
    assert raw.overflowed and raw.stderr == b""
