"""The observer seam: every event, keyed and joined by call; contained; never built for nobody."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from sandbox_operator import labels as lbl
from sandbox_operator import naming
from sandbox_operator.client import (
    Artifact,
    EffectiveState,
    EgressObserved,
    EgressStreamEnded,
    HostToolCalled,
    LandedArtifact,
    OutputMissing,
    OutputsCollected,
    Sandbox,
    SandboxAcquired,
    SandboxClient,
    SandboxDisposed,
    SandboxFileNotFound,
    SandboxIsolationBelowFloor,
    SandboxNotReadyInTime,
    SandboxObserver,
    ScopeDisposed,
    StoreFileRead,
    SyncSandboxClient,
    ToolCallEnded,
    current_call,
    notify,
    tool_call,
)
from sandbox_operator.client import acquire as acquire_mod
from sandbox_operator.client import disposal as disposal_mod
from sandbox_operator.client import egress as egress_mod
from sandbox_operator.client import observer as observer_mod
from sandbox_operator.client import outputs as outputs_mod
from sandbox_operator.client import purges as purges_mod
from sandbox_operator.client import sandbox as sandbox_mod
from sandbox_operator.client.dataplane import local_dataplane
from sandbox_operator.client.observer import EgressWatermark
from sandbox_operator.client.sync import _Loop
from sandbox_operator.contract import (
    SANDBOX_PLURAL,
    SANDBOX_SCOPE_PLURAL,
    Capability,
    SandboxKey,
    SandboxSpec,
)
from sandbox_operator.views import SandboxView

NS = "ns"
SECRET = "https://10.0.0.7:6443/secret-endpoint"  # a message that must never reach a record


# ---- fakes ------------------------------------------------------------------------------------


class Recorder(SandboxObserver):
    def __init__(self) -> None:
        self.events: list[Any] = []

    def sandbox_acquired(self, event: SandboxAcquired) -> None:
        self.events.append(event)

    def sandbox_disposed(self, event: SandboxDisposed) -> None:
        self.events.append(event)

    def scope_disposed(self, event: ScopeDisposed) -> None:
        self.events.append(event)

    def egress_observed(self, event: EgressObserved) -> None:
        self.events.append(event)

    def egress_stream_ended(self, event: EgressStreamEnded) -> None:
        self.events.append(event)

    def host_tool_called(self, event: HostToolCalled) -> None:
        self.events.append(event)

    def store_file_read(self, event: StoreFileRead) -> None:
        self.events.append(event)

    def outputs_collected(self, event: OutputsCollected) -> None:
        self.events.append(event)

    def tool_call_ended(self, event: ToolCallEnded) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


class Raising(SandboxObserver):
    """Every method raises (with a message that must not be logged) and returns junk."""

    def __init__(self) -> None:
        self.calls = 0

    def __getattribute__(self, name: str) -> Any:
        if name in type(self).__dict__ or name.startswith("_") or name == "calls":
            return object.__getattribute__(self, name)

        def boom(event: object) -> object:
            object.__setattr__(self, "calls", object.__getattribute__(self, "calls") + 1)
            raise RuntimeError(SECRET)

        return boom


class FakeCustom:
    """Enough of CustomObjectsApi for the client's reads, lists and deletes."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.deleted: list[str] = []
        self.fail_delete: BaseException | None = None

    async def get_namespaced_custom_object(
        self, group: str, version: str, ns: str, plural: str, name: str
    ) -> dict[str, Any]:
        try:
            return copy.deepcopy(self.objects[(plural, name)])
        except KeyError:
            raise ApiException(status=404, reason="Not Found") from None

    async def list_namespaced_custom_object(
        self, group: str, version: str, ns: str, plural: str
    ) -> dict[str, Any]:
        return {"items": [copy.deepcopy(o) for (p, _), o in self.objects.items() if p == plural]}

    async def delete_namespaced_custom_object(
        self, group: str, version: str, ns: str, plural: str, name: str, body: Any = None
    ) -> None:
        if self.fail_delete is not None:
            raise self.fail_delete
        if self.objects.pop((plural, name), None) is None:
            raise ApiException(status=404, reason="Not Found")
        self.deleted.append(name)


class FakeWatch:
    """The client's egress watch, fed by hand: ``push`` queues an event (None ends the request,
    an exception fails it); a (re)list answers the Sandboxes FakeCustom holds."""

    def __init__(self, custom: FakeCustom) -> None:
        self.custom = custom
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.lists = 0
        self.requests: list[str | None] = []

    async def list(self) -> tuple[list[Mapping[str, Any]], str | None]:
        self.lists += 1
        listing = await self.custom.list_namespaced_custom_object("", "", NS, SANDBOX_PLURAL)
        return listing["items"], f"list-{self.lists}"

    async def events(self, resource_version: str | None) -> Any:
        self.requests.append(resource_version)
        while True:
            item = await self.queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


def spec_for(tmp_path: Path, **fields: Any) -> SandboxSpec:
    (tmp_path / "work").mkdir(exist_ok=True)
    return SandboxSpec.model_validate(
        {
            "kind": "t",
            "image": "i",
            "workDir": str(tmp_path / "work"),
            "requires": [c.value for c in Capability],
            **fields,
        }
    )


def stamp(seconds: int) -> str:
    t = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)
    return t.isoformat().replace("+00:00", "Z")


def decision(i: int, verdict: str = "ALLOW") -> dict[str, Any]:
    reason = {"ALLOW": "Allowed", "DENY": "HostNotAllowed", "UNREACHABLE": "ConnectFailed"}
    return {
        "time": stamp(i),
        "verdict": verdict,
        "reason": reason[verdict],
        "method": "CONNECT",
        "host": f"h{i}.example.com",
        "port": 443,
    }


def egress(decisions: list[dict[str, Any]], *, total: int | None = None, since: int = 0) -> Any:
    allowed = total if total is not None else len(decisions)
    return {
        "allowed": allowed,
        "denied": 0,
        "unreachable": 0,
        "since": stamp(since),
        "updated": stamp(999),
        "recent": decisions[-10:],
    }


class Harness:
    def __init__(self, tmp_path: Path, observer: SandboxObserver | None) -> None:
        self.tmp_path = tmp_path
        cfg = k8s.Configuration()
        cfg.host = "http://127.0.0.1:9"
        self.client = SandboxClient(k8s.ApiClient(configuration=cfg), NS, observer=observer)
        self.custom = FakeCustom()
        self.client.custom = self.custom  # type: ignore[assignment]
        self.custom.objects[(SANDBOX_SCOPE_PLURAL, "conv")] = {
            "metadata": {"name": "conv", "namespace": NS},
            "spec": {"scope": "tenant", "threadId": "t1"},
        }
        self.wait: Any = None  # replaces Acquisitions.wait_ready when set

        async def wait_ready(
            name: str, scope_ref: str, body: dict[str, Any], last: dict[str, str]
        ) -> Mapping[str, Any]:
            if self.wait is not None:
                return await self.wait(name)  # type: ignore[no-any-return]
            obj = {
                "apiVersion": body["apiVersion"],
                "kind": body["kind"],
                "metadata": {**body["metadata"], "uid": f"uid-{name}"},
                "spec": body["spec"],
                "status": {
                    "backend": "runc",
                    "isolation": "container",
                    "effectiveFloor": "container",
                    "isolationScope": "conversation",
                    "servedBy": {"kind": "Pod", "name": f"{name}-pod", "namespace": NS},
                    "servedFrom": "cold",
                },
            }
            self.custom.objects[(SANDBOX_PLURAL, name)] = obj
            return SandboxView(copy.deepcopy(obj))

        self.client.acquisitions.wait_ready = wait_ready  # type: ignore[method-assign]
        self.watch = FakeWatch(self.custom)
        feed = self.client.egress_feed
        feed._list = self.watch.list  # type: ignore[method-assign]
        feed._events = self.watch.events  # type: ignore[method-assign]
        feed.first_backoff = 0.01
        self.client.planes.connect = lambda obj: local_dataplane()  # type: ignore[method-assign]

    def key(self, agent_dir: str = "agent", call_id: str = "") -> SandboxKey:
        return SandboxKey(scope="tenant", thread_id="t1", agent_dir=agent_dir, call_id=call_id)

    def set_egress(self, name: str, summary: Any) -> None:
        self.custom.objects[(SANDBOX_PLURAL, name)]["status"]["egress"] = summary

    def push(self, kind: str, name: str, rv: str = "7") -> None:
        """A watch event carrying the Sandbox as FakeCustom holds it now."""
        obj = copy.deepcopy(self.custom.objects[(SANDBOX_PLURAL, name)])
        obj["metadata"]["resourceVersion"] = rv
        self.watch.queue.put_nowait({"type": kind, "object": obj})

    async def close(self) -> None:
        await self.client.close()


@pytest.fixture
async def harness(tmp_path: Path) -> Any:
    h = Harness(tmp_path, Recorder())
    yield h
    await h.close()


def rec(h: Harness) -> Recorder:
    assert isinstance(h.client.observer, Recorder)
    return h.client.observer


def no_message_anywhere(events: list[Any]) -> None:
    for event in events:
        assert SECRET not in repr(event)
        assert "secret-endpoint" not in repr(event)


# ---- notify and the call context --------------------------------------------------------------


def test_notify_builds_nothing_without_observer() -> None:
    def build() -> Any:
        raise AssertionError("built for nobody")

    notify(None, "sandbox_acquired", build)


def test_notify_contains_and_logs_class_name_only(caplog: pytest.LogCaptureFixture) -> None:
    obs = Raising()
    key = SandboxKey(scope="s", thread_id="t", agent_dir="a")
    with caplog.at_level(logging.WARNING, logger="sandbox_operator.client.observer"):
        notify(
            obs,
            "sandbox_disposed",
            lambda: SandboxDisposed(key=key, call=None, sandbox="x", namespace=NS, failure=None),
        )

        def bad_build() -> Any:
            raise ValueError(SECRET)

        notify(Recorder(), "sandbox_disposed", bad_build)
    assert obs.calls == 1
    text = caplog.text
    assert "RuntimeError" in text and "ValueError" in text
    assert SECRET not in text


def test_notify_ignores_return_value() -> None:
    class Returns(SandboxObserver):
        def tool_call_ended(self, event: ToolCallEnded) -> None:
            return 42  # type: ignore[return-value]

    notify(
        Returns(),
        "tool_call_ended",
        lambda: ToolCallEnded(call="c", keys=(), failure=None, seconds=0),
    )


def test_events_are_frozen_and_failures_are_names() -> None:
    event = ToolCallEnded(call="c", keys=(), failure=None, seconds=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.call = "d"  # type: ignore[misc]
    assert observer_mod.failure_name(ValueError(SECRET)) == "ValueError"
    assert observer_mod.failure_name(None) is None
    # The column rules, as types.
    hints = {f.name: f.type for f in dataclasses.fields(EgressObserved)}
    assert hints["call"] == "None"
    assert hints["key"] == "SandboxKey"
    for cls in (HostToolCalled, StoreFileRead, OutputsCollected):
        assert {f.name: f.type for f in dataclasses.fields(cls)}["key"] == "SandboxKey | None"
    for keyed in (SandboxAcquired, SandboxDisposed):
        assert {f.name: f.type for f in dataclasses.fields(keyed)}["key"] == "SandboxKey"
    assert "key" not in {f.name for f in dataclasses.fields(ScopeDisposed)}
    assert {f.name: f.type for f in dataclasses.fields(ToolCallEnded)}["call"] == "str"
    # Effective state is posture: no key, no labels.
    names = {f.name for f in dataclasses.fields(EffectiveState)}
    assert not names & {"key", "labels", "scope", "thread_id", "agent_dir"}


async def test_call_context_sets_call_and_reports_end() -> None:
    obs = Recorder()
    k1 = SandboxKey(scope="s", thread_id="t", agent_dir="a")
    assert current_call() is None
    async with tool_call("c1", obs) as ctx:
        assert current_call() == "c1"
        assert observer_mod.record_key(k1) == "c1"
        observer_mod.record_key(k1)
    assert current_call() is None
    [ended] = obs.of(ToolCallEnded)
    assert ended.call == "c1" and ended.keys == (k1,) and ended.failure is None
    assert ctx.ended

    with pytest.raises(KeyError), tool_call("c2", obs):
        raise KeyError(SECRET)
    assert obs.of(ToolCallEnded)[-1].failure == "KeyError"
    no_message_anywhere(obs.events)


async def test_call_context_reports_cancellation() -> None:
    obs = Recorder()
    entered = asyncio.Event()

    async def body() -> None:
        async with tool_call("c1", obs):
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.ensure_future(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert obs.of(ToolCallEnded)[-1].failure == "CancelledError"


async def test_task_left_running_has_no_call_after_the_call_ended() -> None:
    seen: list[str | None] = []
    release = asyncio.Event()

    async def straggler() -> None:
        seen.append(current_call())
        await release.wait()
        seen.append(current_call())

    async with tool_call("c1"):
        task = asyncio.ensure_future(straggler())
        await asyncio.sleep(0)
    release.set()
    await task
    assert seen == ["c1", None]


def test_empty_call_id_refused() -> None:
    with pytest.raises(ValueError):
        tool_call("")


# ---- the client's events ----------------------------------------------------------------------


async def test_whole_sequence_joined_by_key_and_call(harness: Harness) -> None:
    h = harness
    obs = rec(h)
    spec = spec_for(
        h.tmp_path,
        egress="allowlist",
        egressAllow=["pypi.org"],
        declaredOutputs=[{"path": "out.txt", "mediaType": "text/plain"}],
    )
    sink_got: list[Artifact] = []

    class Sink:
        async def deliver(self, artifact: Artifact) -> LandedArtifact:
            sink_got.append(artifact)
            return LandedArtifact(artifact.name, artifact.media_type, artifact.size, "h", "d")

    key = h.key()
    name = naming.sandbox_name(key, spec.kind)
    async with h.client.tool_call("call-1"):
        sb = await h.client.acquire("conv", "agent", spec)
        await sb.write_file("out.txt", b"hello")
        assert await sb.read_file("out.txt") == b"hello"
        with pytest.raises(SandboxFileNotFound):
            await sb.read_file("missing.txt")
        collected = await sb.collect_outputs(Sink())
        assert len(collected.landed) == 1
        h.set_egress(name, egress([decision(1), decision(2, "DENY")]))
        await h.client.dispose(sb)
        h.custom.objects[(SANDBOX_PLURAL, "other")] = {
            "metadata": {"name": "other", "annotations": lbl.key_annotations(h.key("b"))},
            "spec": {"scopeRef": "conv"},
        }
        assert (await h.client.dispose_scope("conv")).disposed == 1

    kinds = [type(e).__name__ for e in obs.events]
    assert kinds == [
        "SandboxAcquired",
        "StoreFileRead",
        "StoreFileRead",
        "StoreFileRead",  # the collection's own read
        "OutputsCollected",
        "EgressObserved",
        "EgressObserved",
        "SandboxDisposed",
        "ScopeDisposed",
        "ToolCallEnded",
    ]
    for e in obs.events:
        if isinstance(e, EgressObserved):
            assert e.call is None and e.key == key
        elif isinstance(e, ScopeDisposed):
            assert (e.scope, e.thread_id, e.scope_ref, e.count) == ("tenant", "t1", "conv", 1)
            assert e.call == "call-1" and e.failure is None
        elif isinstance(e, ToolCallEnded):
            assert e.call == "call-1" and e.failure is None
            assert e.keys == (key,)
        else:
            assert e.key == key and e.call == "call-1"

    acquired = obs.of(SandboxAcquired)[0]
    assert acquired.refusal is None and acquired.sandbox == name
    assert acquired.state == sb.effective_state
    state = sb.effective_state
    assert state is not None
    assert state.backend == "runc" and state.isolation == "container"
    assert state.isolation_scope == "conversation" and state.served_by_kind == "Pod"
    assert state.egress == "allowlist" and state.egress_allow == ("pypi.org",)
    assert state.capabilities_required == tuple(c.value for c in Capability)
    assert state.host_tools == () and state.call == "call-1"

    reads = obs.of(StoreFileRead)
    assert [(r.path, r.bytes, r.failure) for r in reads] == [
        ("out.txt", 5, None),
        ("missing.txt", 0, "SandboxFileNotFound"),
        ("out.txt", 5, None),
    ]
    [outs] = obs.of(OutputsCollected)
    assert (outs.landed, outs.consumed, outs.absent, outs.bytes, outs.failure) == (1, 0, 0, 5, None)
    verdicts = [(e.verdict, e.host, e.missed_before) for e in obs.of(EgressObserved)]
    assert verdicts == [("ALLOW", "h1.example.com", 0), ("DENY", "h2.example.com", 0)]
    assert obs.of(SandboxDisposed)[0].failure is None


async def test_events_outside_a_call_carry_no_call(harness: Harness) -> None:
    h = harness
    obs = rec(h)
    sb = await h.client.acquire("conv", "agent", spec_for(h.tmp_path))
    await sb.write_file("a", b"x")
    await sb.read_file("a")
    await h.client.dispose(sb)
    assert obs.events
    assert all(e.call is None for e in obs.events)
    assert not obs.of(ToolCallEnded)


async def test_refused_acquire_recorded_by_class_name(harness: Harness) -> None:
    h = harness
    obs = rec(h)

    async def refuse(name: str) -> Any:
        raise SandboxIsolationBelowFloor(
            sandbox=name, namespace=NS, reason="IsolationBelowFloor", message=SECRET
        )

    h.wait = refuse
    with pytest.raises(SandboxIsolationBelowFloor):
        async with h.client.tool_call("c1"):
            await h.client.acquire("conv", "agent", spec_for(h.tmp_path))
    [acq] = obs.of(SandboxAcquired)
    assert acq.refusal == "SandboxIsolationBelowFloor" and acq.state is None
    assert acq.key == h.key() and acq.call == "c1"
    [ended] = obs.of(ToolCallEnded)
    assert ended.keys == (h.key(),) and ended.failure == "SandboxIsolationBelowFloor"
    no_message_anywhere(obs.events)


async def test_not_ready_in_time_and_cancelled_acquire_recorded(harness: Harness) -> None:
    h = harness
    obs = rec(h)

    async def hang(name: str) -> Any:
        await asyncio.sleep(3600)

    h.wait = hang
    with pytest.raises(SandboxNotReadyInTime):
        await h.client.acquire("conv", "agent", spec_for(h.tmp_path), timeout=0.05)
    assert obs.of(SandboxAcquired)[-1].refusal == "SandboxNotReadyInTime"

    task = asyncio.ensure_future(h.client.acquire("conv", "agent", spec_for(h.tmp_path)))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert obs.of(SandboxAcquired)[-1].refusal == "CancelledError"


async def test_failures_of_dispose_and_collect_recorded(harness: Harness) -> None:
    h = harness
    obs = rec(h)
    out = {"path": "nope.txt", "mediaType": "text/plain", "disposition": "consume"}
    sb = await h.client.acquire("conv", "agent", spec_for(h.tmp_path, declaredOutputs=[out]))
    with pytest.raises(OutputMissing):
        await sb.collect_outputs()
    assert obs.of(OutputsCollected)[-1].failure == "OutputMissing"
    h.custom.fail_delete = ApiException(status=500, reason=SECRET)
    with pytest.raises(ApiException):
        await h.client.dispose(sb)
    assert obs.of(SandboxDisposed)[-1].failure == "ApiException"
    with pytest.raises(ApiException):
        await h.client.dispose_scope("conv")
    assert obs.of(ScopeDisposed)[-1].failure == "ApiException"
    assert obs.of(ScopeDisposed)[-1].count == 0
    no_message_anywhere(obs.events)


async def test_raising_observer_changes_no_outcome(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    obs = Raising()
    h = Harness(tmp_path, obs)
    try:
        spec = spec_for(tmp_path, declaredOutputs=[{"path": "o", "mediaType": "text/plain"}])
        with caplog.at_level(logging.WARNING, logger="sandbox_operator.client.observer"):
            async with h.client.tool_call("c1"):
                sb = await h.client.acquire("conv", "agent", spec)
                assert isinstance(sb, Sandbox)
                await sb.write_file("o", b"data")
                assert await sb.read_file("o") == b"data"
                with pytest.raises(SandboxFileNotFound):
                    await sb.read_file("missing")
                got: list[Artifact] = []

                class Sink:
                    async def deliver(self, artifact: Artifact) -> LandedArtifact:
                        got.append(artifact)
                        return LandedArtifact(artifact.name, "text/plain", 4, "h", "d")

                assert len((await sb.collect_outputs(Sink())).landed) == 1
                h.set_egress(sb.name, egress([decision(1)]))
                assert await h.client.report_egress(sb) == 1
                await h.client.dispose(sb)
                assert (await h.client.dispose_scope("conv")).disposed == 0

            async def refuse(name: str) -> Any:
                raise SandboxIsolationBelowFloor(
                    sandbox=name, namespace=NS, reason="IsolationBelowFloor", message="m"
                )

            h.wait = refuse
            with pytest.raises(SandboxIsolationBelowFloor):
                await h.client.acquire("conv", "agent", spec)
    finally:
        await h.close()
    assert obs.calls >= 10
    assert "RuntimeError" in caplog.text
    assert SECRET not in caplog.text


async def test_nothing_built_without_an_observer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[str] = []

    def spy(name: str) -> Any:
        def build(*args: Any, **kwargs: Any) -> Any:
            built.append(name)
            raise AssertionError("built for nobody")

        return build

    modules = (acquire_mod, disposal_mod, purges_mod, sandbox_mod, outputs_mod, observer_mod)
    for mod in (*modules, egress_mod):
        for cls in (
            "SandboxAcquired",
            "SandboxDisposed",
            "ScopeDisposed",
            "EgressObserved",
            "EgressStreamEnded",
            "StoreFileRead",
            "OutputsCollected",
            "ToolCallEnded",
        ):
            if hasattr(mod, cls):
                monkeypatch.setattr(mod, cls, spy(cls))
    monkeypatch.setattr(acquire_mod, "effective_state", spy("EffectiveState"))
    h = Harness(tmp_path, None)
    try:
        out = {"path": "o", "mediaType": "text/plain", "disposition": "consume"}
        spec = spec_for(tmp_path, declaredOutputs=[out])
        async with h.client.tool_call("c1"):
            sb = await h.client.acquire("conv", "agent", spec)
            await sb.write_file("o", b"data")
            await sb.read_file("o")
            assert (await sb.collect_outputs()).consumed["o"].data == b"data"
            h.set_egress(sb.name, egress([decision(1)]))
            assert await h.client.report_egress(sb) == 0
            assert not h.client.egress_feed.watching and h.watch.lists == 0  # no watch either
            await h.client.dispose(sb)
            await h.client.dispose_scope("conv")
    finally:
        await h.close()
    assert built == []


async def test_dispose_by_name_learns_key_and_missing_is_silent(harness: Harness) -> None:
    h = harness
    obs = rec(h)
    sb = await h.client.acquire("conv", "agent", spec_for(h.tmp_path))
    await h.client.dispose(sb.name)
    assert obs.of(SandboxDisposed)[-1].key == h.key()
    before = len(obs.events)
    await h.client.dispose("gone-already")
    assert len(obs.events) == before


async def test_scope_disposed_falls_back_to_a_sandbox_key(harness: Harness) -> None:
    h = harness
    obs = rec(h)
    h.custom.objects.pop((SANDBOX_SCOPE_PLURAL, "conv"))
    h.custom.objects[(SANDBOX_PLURAL, "x")] = {
        "metadata": {"name": "x", "annotations": lbl.key_annotations(h.key())},
        "spec": {"scopeRef": "conv"},
    }
    assert (await h.client.dispose_scope("conv")).disposed == 1
    [ev] = obs.of(ScopeDisposed)
    assert (ev.scope, ev.thread_id, ev.count) == ("tenant", "t1", 1)
    assert (await h.client.dispose_scope("conv")).disposed == 0
    ev = obs.of(ScopeDisposed)[-1]
    assert (ev.scope, ev.thread_id, ev.scope_ref, ev.count) == (None, None, "conv", 0)


async def test_egress_reported_once_with_a_watermark(harness: Harness) -> None:
    h = harness
    obs = rec(h)
    async with h.client.tool_call("c1"):
        sb = await h.client.acquire("conv", "agent", spec_for(h.tmp_path))
        assert await h.client.report_egress(sb) == 0  # the proxy wrote nothing yet
        h.set_egress(sb.name, egress([decision(1), decision(2)]))
        assert await h.client.report_egress(sb) == 2
        assert await h.client.report_egress(sb) == 0
        ds = [decision(i) for i in range(1, 16)]  # 13 new; status shows the newest 10
        h.set_egress(sb.name, egress(ds))
        assert await h.client.report_egress(sb.name) == 10
    events = obs.of(EgressObserved)
    assert [e.host for e in events] == [f"h{i}.example.com" for i in (1, 2, *range(6, 16))]
    assert [e.missed_before for e in events] == [0, 0, 3] + [0] * 9
    assert all(e.call is None and e.key == h.key() for e in events)
    assert events[0].time == datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)


def numbered(
    seqs: list[int], *, since: int = 0, total: int | None = None, final: bool = False
) -> Any:
    """A summary as a proxy that numbers its records writes it: ``recent`` holds ``seqs``."""
    recent = [decision(i) | {"seq": i} for i in seqs]
    out = egress(recent, total=total if total is not None else max(seqs, default=0), since=since)
    return out | ({"final": True} if final else {})


def test_watermark_restarts_with_a_new_counting_window() -> None:
    @dataclasses.dataclass
    class R:
        name: str
        seq: int | None = None

    a, b, c = R("a"), R("b"), R("c")
    mark = EgressWatermark()
    t0, t1 = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    assert mark.advance(t0, 2, [a, b]) == [(0, a), (0, b)]
    assert mark.advance(t0, 2, [a, b]) == []
    assert mark.advance(t1, 1, [c]) == [(0, c)]  # the proxy restarted: counts restart
    assert mark.advance(t0, 5, [a, b]) == []  # a stale read of the old window
    assert (mark.delivered, mark.missed, mark.windows) == (3, 0, 2)


async def test_numbered_egress_is_delivered_in_order_once_with_exact_gaps(harness: Harness) -> None:
    """With ``seq`` on each record, the client delivers in number order, never twice, and
    ``missed_before`` is exactly the count of numbers it never saw; a stale state (an older read
    of the same window, or of a previous proxy's window) delivers nothing."""
    h = harness
    obs = rec(h)
    sb = await h.client.acquire("conv", "agent", spec_for(h.tmp_path))
    h.set_egress(sb.name, numbered([1, 2]))
    assert await h.client.report_egress(sb) == 2
    h.set_egress(sb.name, numbered(list(range(9, 19))))  # 6 made and gone between two reads
    assert await h.client.report_egress(sb) == 10
    stale = numbered([2, 1, 3])  # the same window, older (and shuffled): nothing new
    h.set_egress(sb.name, stale)
    assert await h.client.report_egress(sb) == 0
    h.set_egress(sb.name, numbered([1, 2], since=60))  # a new proxy process: numbers restart
    assert await h.client.report_egress(sb) == 2
    h.set_egress(sb.name, numbered(list(range(9, 19))))  # the old window again: stale
    assert await h.client.report_egress(sb) == 0
    events = obs.of(EgressObserved)
    assert [e.seq for e in events] == [1, 2, *range(9, 19), 1, 2]
    assert [e.missed_before for e in events] == [0, 0, 6] + [0] * 11
    assert [e.host for e in events][:3] == ["h1.example.com", "h2.example.com", "h9.example.com"]


async def until(predicate: Any, within: float = 2.0) -> None:
    """Yield to the loop until ``predicate()`` holds; fail after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not predicate():
        assert loop.time() - start < within, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_egress_is_pushed_by_one_watch_per_client_and_shares_the_watermark(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """With an observer, the Sandboxes a client acquired are followed by one watch of the
    namespace: a new status.egress reaches the observer without report_egress, in seq order;
    report_egress and dispose deliver nothing twice; Sandboxes it did not acquire are not
    reported; a watch that ends resumes from its resourceVersion, a 410 or a failure relists."""
    h = harness
    obs = rec(h)
    feed = h.client.egress_feed
    sb = await h.client.acquire("conv", "agent", spec_for(h.tmp_path))
    other = await h.client.acquire("conv", "other", spec_for(h.tmp_path))
    await until(lambda: h.watch.requests == ["list-1"])
    assert feed.watching and h.watch.lists == 1  # one watch for both
    assert set(feed.following) == {(sb.name, f"uid-{sb.name}"), (other.name, f"uid-{other.name}")}

    h.set_egress(sb.name, numbered([1, 2]))
    h.push("MODIFIED", sb.name)
    await until(lambda: len(obs.of(EgressObserved)) == 2)
    assert await h.client.report_egress(sb) == 0  # the watch delivered them already
    h.set_egress(sb.name, numbered([1, 2, 3, 4, 5]))
    assert await h.client.report_egress(sb) == 3  # a pull in between
    h.set_egress(sb.name, numbered(list(range(1, 8))))
    h.push("MODIFIED", sb.name, rv="8")
    await until(lambda: len(obs.of(EgressObserved)) == 7)

    # Not acquired by this client: the watch sees it, reports nothing.
    h.custom.objects[(SANDBOX_PLURAL, "stranger")] = {
        "metadata": {"name": "stranger", "uid": "uid-s", "annotations": {}},
        "status": {"egress": numbered([1])},
    }
    h.push("MODIFIED", "stranger", rv="9")
    h.watch.queue.put_nowait(None)  # the server ends the request: resumed where it was
    await until(lambda: len(h.watch.requests) == 2)
    assert h.watch.requests == ["list-1", "9"] and h.watch.lists == 1

    h.set_egress(sb.name, numbered(list(range(1, 10))))
    h.watch.queue.put_nowait(ApiException(status=410))  # too old: a fresh list delivers it
    await until(lambda: h.watch.lists == 2 and len(obs.of(EgressObserved)) == 9)
    h.set_egress(other.name, numbered([1]))
    with caplog.at_level(logging.WARNING, logger="sandbox_operator.client.observer"):
        h.watch.queue.put_nowait(ApiException(status=500, reason=SECRET))
        await until(lambda: h.watch.lists == 3 and len(obs.of(EgressObserved)) == 10)
    assert "ApiException 500" in caplog.text and SECRET not in caplog.text

    await h.client.dispose(sb)  # reads the Sandbox: nothing new, nothing twice
    events = obs.of(EgressObserved)
    assert [(e.sandbox, e.seq) for e in events] == [
        *((sb.name, i) for i in range(1, 10)),
        (other.name, 1),
    ]
    assert all(e.missed_before == 0 and e.call is None for e in events)
    assert all(e.key == h.key() for e in events if e.sandbox == sb.name)
    await h.client.close()
    assert not feed.watching


def ended(obs: Recorder, name: str) -> list[tuple[int, int, bool]]:
    return [
        (e.reported, e.missed, e.complete) for e in obs.of(EgressStreamEnded) if e.sandbox == name
    ]


async def test_a_followed_sandbox_deleted_ends_its_stream_complete_only_after_the_final_write(
    harness: Harness,
) -> None:
    """The watch's DELETED event delivers the Sandbox's last records, then one
    EgressStreamEnded: complete when that last state was the proxy's final write (in the one
    window seen), with the count of what was delivered and of what was missed."""
    h = harness
    obs = rec(h)
    done = await h.client.acquire("conv", "done", spec_for(h.tmp_path))
    cut = await h.client.acquire("conv", "cut", spec_for(h.tmp_path))
    restarted = await h.client.acquire("conv", "restarted", spec_for(h.tmp_path))
    quiet = await h.client.acquire("conv", "quiet", spec_for(h.tmp_path))  # no summary ever
    await until(lambda: h.watch.lists == 1)

    h.set_egress(done.name, numbered([1, 2]))
    h.push("MODIFIED", done.name)
    h.set_egress(done.name, numbered(list(range(5, 15)), final=True))  # 2 scrolled out
    h.push("DELETED", done.name)
    await until(lambda: bool(obs.of(EgressStreamEnded)))
    assert ended(obs, done.name) == [(12, 2, True)]
    seqs = [e.seq for e in obs.of(EgressObserved) if e.sandbox == done.name]
    assert seqs == [1, 2, *range(5, 15)]
    assert obs.events[-1] == obs.of(EgressStreamEnded)[0]  # after its last record

    h.set_egress(cut.name, numbered([1, 2, 3]))  # the proxy's last write was not final
    h.set_egress(restarted.name, numbered([1]))
    h.push("MODIFIED", restarted.name)
    h.set_egress(restarted.name, numbered([1], since=60, final=True))  # a new proxy closed it
    for name in (cut.name, restarted.name, quiet.name):
        h.push("DELETED", name)
    await until(lambda: len(obs.of(EgressStreamEnded)) == 3)
    assert ended(obs, cut.name) == [(3, 0, False)]
    assert ended(obs, restarted.name) == [(2, 0, False)]
    assert ended(obs, quiet.name) == []  # nothing to end: not an egress stream
    h.push("DELETED", done.name)  # seen again: nothing twice
    h.watch.queue.put_nowait(None)
    await until(lambda: len(h.watch.requests) == 2)
    assert len(obs.of(EgressStreamEnded)) == 3 and h.client.egress_feed.following == ()


async def test_dispose_with_wait_ends_the_stream_with_the_last_state_seen(
    harness: Harness,
) -> None:
    """dispose(wait=True) delivers what the Sandbox's last state (the proxy's final write, made
    while the delete waited on the finalizer) adds, and ends the stream, also without a watch
    event; a dispose without wait leaves the end to the watch; a followed Sandbox that a relist
    no longer finds ended while no watch was open."""
    h = harness
    obs = rec(h)
    sb = await h.client.acquire("conv", "agent", spec_for(h.tmp_path))
    h.set_egress(sb.name, numbered([1]))
    final_state = copy.deepcopy(h.custom.objects[(SANDBOX_PLURAL, sb.name)])
    final_state["status"]["egress"] = numbered([1, 2, 3], final=True)

    async def wait_gone(*args: Any, **kw: Any) -> Mapping[str, Any]:
        return SandboxView(final_state)

    h.client.watches.wait_gone = wait_gone  # type: ignore[method-assign]
    await h.client.dispose(sb, wait=True)
    assert [e.seq for e in obs.of(EgressObserved)] == [1, 2, 3]
    assert ended(obs, sb.name) == [(3, 0, True)]
    h.watch.queue.put_nowait({"type": "DELETED", "object": final_state})  # the watch, later
    await asyncio.sleep(0.02)
    assert len(obs.of(EgressStreamEnded)) == 1

    # The other way round: the watch's DELETED first, then the disposal's wait returns.
    first = await h.client.acquire("conv", "first", spec_for(h.tmp_path))
    h.set_egress(first.name, numbered([1]))
    last_state = copy.deepcopy(h.custom.objects[(SANDBOX_PLURAL, first.name)])
    last_state["status"]["egress"] = numbered([1, 2], final=True)
    h.watch.queue.put_nowait({"type": "DELETED", "object": last_state})
    await until(lambda: bool(ended(obs, first.name)))
    final_state = last_state
    await h.client.dispose(first, wait=True)  # nothing again: neither records nor the end
    assert [e.seq for e in obs.of(EgressObserved) if e.sandbox == first.name] == [1, 2]
    assert ended(obs, first.name) == [(2, 0, True)]

    other = await h.client.acquire("conv", "other", spec_for(h.tmp_path))
    h.set_egress(other.name, numbered([1, 2]))
    await h.client.dispose(other)  # no wait: delivered, not ended
    assert ended(obs, other.name) == []
    h.watch.queue.put_nowait(ApiException(status=410))  # relisted: it is not there any more
    await until(lambda: bool(ended(obs, other.name)))
    assert ended(obs, other.name) == [(2, 0, False)]


async def test_host_tools_sealed_and_named_in_effective_state(harness: Harness) -> None:
    h = harness

    class Registry:
        def __init__(self) -> None:
            self.sealed = False

        def aggregate(self) -> object:
            self.sealed = True
            return object()

        @property
        def names(self) -> tuple[str, ...]:
            return ("lookup", "notify_user")

    reg = Registry()
    sb = await h.client.acquire("conv", "agent", spec_for(h.tmp_path), host_tools=reg)
    assert reg.sealed
    assert sb.effective_state is not None
    assert sb.effective_state.host_tools == ("lookup", "notify_user")
    assert sb.effective_state.call is None


def test_sync_client_passes_observer_and_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    async def fake_from_kubeconfig(namespace: str, **kwargs: Any) -> Any:
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(SandboxClient, "from_kubeconfig", fake_from_kubeconfig)
    obs = Recorder()
    with pytest.raises(RuntimeError):
        SyncSandboxClient.from_kubeconfig(NS, observer=obs)
    assert seen["observer"] is obs

    loop = _Loop()
    try:

        async def build() -> Harness:
            return Harness(tmp_path, obs)

        h = loop.run(build())
        sync = SyncSandboxClient(h.client, loop)
        assert sync.observer is obs
        with sync.tool_call("sync-call"):
            sb = sync.acquire("conv", "agent", spec_for(tmp_path))
            sb.write_file("f", b"1")
            sb.read_file("f")
            sync.dispose(sb)
        assert sb.effective_state is not None and sb.effective_state.call == "sync-call"
        loop.run(h.close())
    finally:
        loop.stop()
    assert [type(e).__name__ for e in obs.events] == [
        "SandboxAcquired",
        "StoreFileRead",
        "SandboxDisposed",
        "ToolCallEnded",
    ]
    assert all(e.call == "sync-call" for e in obs.events)


async def test_spec_labels_reach_the_sandbox_spec_and_the_acquire_record_verbatim(
    harness: Harness,
) -> None:
    """#25 item 9: the spec's labels are the host's words, carried as given: into the applied
    Sandbox's spec and onto SandboxAcquired (a read-only copy), never into EffectiveState, the
    metadata labels or a refusal's record."""
    h = harness
    obs = rec(h)
    labels = {"tenant": "Contoso Ltd / EU", "cost centre": "  42  ", "ünïcode": ""}
    spec = spec_for(h.tmp_path, labels=labels)
    labels["tenant"] = "changed by the caller afterwards"
    sandbox = await h.client.acquire("conv", "agent", spec)
    want = {"tenant": "Contoso Ltd / EU", "cost centre": "  42  ", "ünïcode": ""}
    obj = h.custom.objects[(SANDBOX_PLURAL, sandbox.name)]
    assert obj["spec"]["labels"] == want
    assert not set(want) & set(obj["metadata"]["labels"])
    [acq] = obs.of(SandboxAcquired)
    assert dict(acq.labels) == want
    with pytest.raises(TypeError):
        acq.labels["tenant"] = "x"  # type: ignore[index]
    assert "Contoso" not in repr(acq.state)

    async def refuse(name: str) -> Any:
        raise SandboxIsolationBelowFloor(sandbox=name, namespace=NS, message="no")

    h.wait = refuse
    with pytest.raises(SandboxIsolationBelowFloor):
        await h.client.acquire("conv", "other", spec)
    assert dict(obs.of(SandboxAcquired)[-1].labels) == want


async def test_a_spec_without_labels_applies_no_labels_field(harness: Harness) -> None:
    """A Sandbox created before spec.labels existed has none, and a spec field may be neither
    added nor removed after creation: re-acquiring it must not write an empty map."""
    h = harness
    sandbox = await h.client.acquire("conv", "agent", spec_for(h.tmp_path))
    assert "labels" not in h.custom.objects[(SANDBOX_PLURAL, sandbox.name)]["spec"]
    assert dict(rec(h).of(SandboxAcquired)[0].labels) == {}


async def test_an_identity_refused_the_namespace_watch_stops_watching_and_still_gets_pulls(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """An agent bound to its conversation reads its Sandboxes by name only: the namespace watch
    answers 403 for good. The feed says so once and stops (no retry loop, no restart at the next
    acquire); report_egress still delivers, once."""
    h = harness
    obs = rec(h)
    feed = h.client.egress_feed
    with caplog.at_level(logging.WARNING, logger="sandbox_operator.client.observer"):
        sb = await h.client.acquire("conv", "agent", spec_for(h.tmp_path))
        await until(lambda: h.watch.requests == ["list-1"])
        h.watch.queue.put_nowait(ApiException(status=403, reason="Forbidden"))
        await until(lambda: not feed.watching)
    assert feed.refused and caplog.text.count("not allowed to watch") == 1
    await h.client.acquire("conv", "other", spec_for(h.tmp_path))
    await asyncio.sleep(0.05)
    assert not feed.watching and h.watch.lists == 1  # not started again
    h.set_egress(sb.name, numbered([1, 2]))
    assert await h.client.report_egress(sb) == 2
    assert [e.seq for e in obs.of(EgressObserved)] == [1, 2]
