"""The observer seam against the real operator: one tool call acquires two sandboxes, runs a Python
program that calls a host tool (and one that is not registered), collects a declared output,
disposes one sandbox and then the conversation's scope. The observer receives every event of that
sequence, each joined to the call and to a key the call's ``ToolCallEnded`` lists, failures as
class names. The observer also raises from every method, and nothing the calls return changes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from sandbox_operator.client import (
    EgressObserved,
    EgressStreamEnded,
    FileSystemSink,
    HostToolCalled,
    OutputsCollected,
    SandboxAcquired,
    SandboxClient,
    SandboxDisposed,
    SandboxObserver,
    ScopeDisposed,
    StoreFileRead,
    ToolCallEnded,
)
from sandbox_operator.client.hosttools import HostToolRegistry, Identity, host_tool
from sandbox_operator.client.hosttools.channel import reclaim_run, run_with_host_tools
from sandbox_operator.contract import Capability, SandboxKey, SandboxSpec
from tests.fixtures import egress_probe as closed
from tests.fixtures.operator import DECLARATIONS, PYTHON, Kit, local_config, observed_client

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CALL = "call-observer-1"
SMALL = {
    "requests": {"cpu": "10m", "memory": "16Mi"},
    "limits": {"cpu": "500m", "memory": "256Mi"},
}


class RaisingRecorder(SandboxObserver):
    """Keeps every event, then raises: the calls must not notice."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.arrived = asyncio.Event()  # set by every event

    def _keep(self, event: object) -> None:
        self.events.append(event)
        self.arrived.set()
        raise RuntimeError("observer failure that must stay contained")

    sandbox_acquired = _keep
    sandbox_disposed = _keep
    scope_disposed = _keep
    egress_observed = _keep
    egress_stream_ended = _keep
    host_tool_called = _keep
    store_file_read = _keep
    outputs_collected = _keep
    tool_call_ended = _keep

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


@pytest.fixture
async def observed(
    kubeconfig: str, namespace: str
) -> AsyncIterator[tuple[SandboxClient, RaisingRecorder]]:
    recorder = RaisingRecorder()
    async with observed_client(kubeconfig, namespace, recorder) as c:
        yield c, recorder


@pytest.fixture
async def module_observed(
    kubeconfig: str, module_kit: Kit
) -> AsyncIterator[tuple[SandboxClient, RaisingRecorder]]:
    """``observed`` on the module's namespace, served by the module's operator (the egress tests
    share one, with the operator-run egress proxy)."""
    recorder = RaisingRecorder()
    async with observed_client(kubeconfig, module_kit.ns, recorder) as c:
        yield c, recorder


def spec() -> SandboxSpec:
    return SandboxSpec.model_validate(
        {
            "kind": "python",
            "image": PYTHON,
            "requires": [
                Capability.EXEC,
                Capability.RUN_CODE,
                Capability.FILES_IN,
                Capability.FILES_OUT,
                Capability.HOST_TOOLS,
            ],
            "resources": SMALL,
            "declaredOutputs": [{"path": "result.json", "mediaType": "application/json"}],
        }
    )


PROGRAM = """
import json
import sandbox_host_tools as tools

answer = tools.call("record_note", text="seen by the host")
try:
    tools.call("not_registered", text="x")
    refused = None
except Exception as exc:
    refused = type(exc).__name__
with open({result!r}, "w") as fh:
    json.dump({{"answer": answer, "refused": refused}}, fh)
print("done")
"""


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
async def test_observer_sees_the_whole_sequence(
    observed: tuple[SandboxClient, RaisingRecorder],
    start_operator: Callable[..., Any],
    tmp_path: Path,
    runtime: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, recorder = observed
    start_operator(local_config(selection="fixed", pinned=runtime))
    scope_ref = await client.create_scope(scope="tenant-obs", thread_id=f"t-{runtime}")
    notes: list[str] = []

    @host_tool(source="test-notes", sink="test-notes", identity=Identity.APP)
    def record_note(text: str) -> dict[str, Any]:
        notes.append(text)
        return {"stored": len(notes)}

    registry = HostToolRegistry(observer=recorder)
    with pytest.warns(Warning):
        registry.register(record_note)

    sink = FileSystemSink(tmp_path / "landed")
    with caplog.at_level(logging.WARNING, logger="sandbox_operator.client.observer"):
        async with client.tool_call(CALL):
            sb = await client.acquire(scope_ref, "agents/observed", spec(), host_tools=registry)
            other = await client.acquire(scope_ref, "agents/bystander", spec())
            run = registry.start_run(
                limits_in=sb.spec.files_in, limits_out=sb.spec.files_out, key=sb.key
            )
            result_path = f"{sb.work_dir}/result.json"
            outcome = await run_with_host_tools(
                sb, PROGRAM.format(result=result_path), run, timeout=120
            )
            assert outcome.exit_code == 0, outcome.stderr
            assert b"done" in outcome.stdout
            collected = await sb.collect_outputs(sink)
            await reclaim_run(sb, outcome.layout)
            await client.dispose(sb, wait=True)
            disposed = await client.dispose_scope(scope_ref)

    # Outcomes: exactly what they would be without an observer.
    assert notes == ["seen by the host"]
    landed = json.loads((tmp_path / "landed" / "result.json").read_text())
    assert landed == {"answer": {"stored": 1}, "refused": "HostToolNotRegistered"}
    assert [a.name for a in collected.landed] == ["result.json"]
    assert disposed.disposed == 1 and disposed.complete, disposed
    # ... and the observer's failures were logged by class name, never raised.
    assert "RuntimeError" in caplog.text
    assert "must stay contained" not in caplog.text

    key = SandboxKey(scope="tenant-obs", thread_id=f"t-{runtime}", agent_dir="agents/observed")
    bystander = SandboxKey(
        scope="tenant-obs", thread_id=f"t-{runtime}", agent_dir="agents/bystander"
    )
    assert sb.key == key and other.key == bystander

    # Every event of the sequence arrived, in order of kind.
    kinds = [type(e).__name__ for e in recorder.events]
    firsts = [kinds.index(k) for k in (
        "SandboxAcquired", "HostToolCalled", "OutputsCollected", "SandboxDisposed",
        "ScopeDisposed", "ToolCallEnded",
    )]  # fmt: skip
    assert firsts == sorted(firsts), kinds
    assert kinds[-1] == "ToolCallEnded"

    [ended] = recorder.of(ToolCallEnded)
    assert ended.call == CALL and ended.failure is None
    assert set(ended.keys) == {key, bystander}

    # Joined: every call-scoped event carries the call and a key the call touched.
    for event in recorder.events:
        assert event.call == CALL, event
        if hasattr(event, "key"):
            assert event.key in ended.keys, event

    acquired = recorder.of(SandboxAcquired)
    assert {a.key for a in acquired} == {key, bystander}
    assert all(a.refusal is None for a in acquired)
    state = next(a.state for a in acquired if a.key == key)
    assert state == sb.effective_state
    assert state.backend == runtime
    assert state.isolation == ("container" if runtime == "runc" else "hardened_container")
    assert state.isolation_scope == "conversation" and state.served_by_kind == "Pod"
    assert state.host_tools == ("record_note",) and state.call == CALL
    assert state.egress == "closed" and state.egress_allow == ()

    served, refused = recorder.of(HostToolCalled)
    assert (served.key, served.tool, served.sequence) == (key, "record_note", 1)
    assert (served.source, served.sink, served.identity) == ("test-notes", "test-notes", "app")
    assert served.refusal is None and served.executed and served.completed
    assert served.delivery == "delivered" and served.response_bytes > 0
    assert (refused.tool, refused.refusal) == ("not_registered", "HostToolNotRegistered")
    assert not refused.executed and not refused.completed

    reads = recorder.of(StoreFileRead)
    assert any(r.path == "result.json" and r.bytes > 0 for r in reads), reads
    assert all(r.failure is None or r.failure[0].isupper() for r in reads)
    [outputs] = recorder.of(OutputsCollected)
    assert (outputs.key, outputs.landed, outputs.failure) == (key, 1, None)
    assert outputs.bytes == (tmp_path / "landed" / "result.json").stat().st_size

    [gone] = recorder.of(SandboxDisposed)
    assert (gone.key, gone.sandbox, gone.failure) == (key, sb.name, None)
    [scope] = recorder.of(ScopeDisposed)
    assert (scope.scope, scope.thread_id, scope.scope_ref) == (
        "tenant-obs",
        f"t-{runtime}",
        scope_ref,
    )
    assert (scope.count, scope.failure) == (1, None)


#: A python sandbox allowed to reach allowed.test only, through the operator's proxy.
ALLOW_SPEC = SandboxSpec.model_validate(
    {
        "kind": "python",
        "image": PYTHON,
        "requires": [Capability.EXEC, Capability.RUN_CODE],
        "resources": SMALL,
        "egress": "allowlist",
        "egressAllow": ["allowed.test"],
    }
)


def managed_proxy_config(runtime: str, image: str) -> dict[str, Any]:
    """One backend with the operator-run egress proxy (image = the operator's own)."""
    config: dict[str, Any] = closed.backend(runtime)
    (backend,) = config["backends"]
    backend["declarations"] = dict(DECLARATIONS, egressModes=["closed", "allowlist"])
    backend["egressProxy"] = {"managed": True}
    config["egressProxy"] = {
        "image": image,
        "imagePullPolicy": "Never",
        "port": 3128,
        "runtimeClassName": runtime,
        "config": {"limits": {"connectTimeoutSeconds": 5, "headerTimeoutSeconds": 2}},
    }
    return config


@pytest.fixture(scope="module")
def module_operator_config(operator_image: tuple[str, str]) -> dict[str, Any]:
    """The egress tests share one operator (``module_observed``), and so its egress proxy."""
    return managed_proxy_config("runc", ":".join(operator_image))


ASK_DENIED = """
import urllib.error, urllib.request
try:
    urllib.request.urlopen("http://denied.test/", timeout=20)
    print("answered")
except urllib.error.HTTPError as exc:
    print(exc.code)
"""


async def test_egress_decisions_reach_the_observer_keyed_without_a_call(
    module_observed: tuple[SandboxClient, RaisingRecorder],
) -> None:
    client, recorder = module_observed
    scope_ref = await client.create_scope(scope="tenant-obs", thread_id="t-egress")
    allow_spec = ALLOW_SPEC
    async with client.tool_call("call-egress"):
        sb = await client.acquire(scope_ref, "agents/egress", allow_spec)
        assert sb.effective_state is not None
        assert sb.effective_state.egress == "allowlist"
        assert sb.effective_state.egress_allow == ("allowed.test",)
        for _ in range(2):
            res = await sb.run_code(ASK_DENIED, timeout=60)
            assert res.stdout_text.strip() == "403", (res.stdout_text, res.stderr_text)
        # The proxy writes its summary at an interval: wait until both decisions are there
        # (the client's watch delivers them; a pull shares its watermark, so it may find none).
        deadline = asyncio.get_running_loop().time() + 60
        while len(recorder.of(EgressObserved)) < 2:
            assert asyncio.get_running_loop().time() < deadline
            await client.report_egress(sb)
            if len(recorder.of(EgressObserved)) < 2:
                await asyncio.sleep(1)
        await client.dispose(sb, wait=True)  # reports nothing twice

    egress = recorder.of(EgressObserved)
    assert len(egress) == 2, egress
    for e in egress:
        assert e.key == sb.key and e.call is None and e.sandbox == sb.name
        assert (e.verdict, e.reason, e.host, e.port) == (
            "DENY",
            "HostNotAllowed",
            "denied.test",
            80,
        )
        assert e.missed_before == 0
    [ended] = recorder.of(ToolCallEnded)
    assert ended.keys == (sb.key,) and ended.call == "call-egress"
    assert [type(e).__name__ for e in recorder.events].count("SandboxDisposed") == 1


ASK_DENIED_TIMES = """
import urllib.error, urllib.request
codes = []
for _ in range({times}):
    try:
        urllib.request.urlopen("http://denied.test/", timeout=20)
        codes.append("answered")
    except urllib.error.HTTPError as exc:
        codes.append(str(exc.code))
print(" ".join(codes))
"""


async def test_egress_is_pushed_in_order_and_the_tail_is_counted_at_the_end(
    module_observed: tuple[SandboxClient, RaisingRecorder],
) -> None:
    """(#25 item 8) Without report_egress: the client's watch delivers every decision, in seq
    order; one more request made just before the disposal (left to the proxy's interval) still
    arrives, because the proxy writes `final` at the deletion and the operator's finalizer waits
    for it; the stream then ends complete."""
    client, recorder = module_observed
    scope_ref = await client.create_scope(scope="tenant-obs", thread_id="t-push")
    allow_spec = ALLOW_SPEC
    sb = await client.acquire(scope_ref, "agents/push", allow_spec)
    res = await sb.run_code(ASK_DENIED_TIMES.format(times=3), timeout=60)
    assert res.stdout_text.split() == ["403"] * 3, (res.stdout_text, res.stderr_text)
    async with asyncio.timeout(60):  # the watch delivers; nothing here asks
        while len(recorder.of(EgressObserved)) < 3:
            recorder.arrived.clear()
            await recorder.arrived.wait()
    assert [e.seq for e in recorder.of(EgressObserved)] == [1, 2, 3]
    res = await sb.run_code(ASK_DENIED_TIMES.format(times=1), timeout=60)
    assert res.stdout_text.split() == ["403"], (res.stdout_text, res.stderr_text)
    await client.dispose(sb, wait=True)  # at once: the 4th is within the proxy's interval

    egress = recorder.of(EgressObserved)
    assert [(e.seq, e.missed_before) for e in egress] == [(1, 0), (2, 0), (3, 0), (4, 0)]
    assert all(e.key == sb.key and e.call is None and e.host == "denied.test" for e in egress)
    [end] = recorder.of(EgressStreamEnded)
    assert (end.key, end.sandbox, end.reported, end.missed, end.complete) == (
        sb.key,
        sb.name,
        4,
        0,
        True,
    )
    assert recorder.events.index(end) > recorder.events.index(egress[-1])
