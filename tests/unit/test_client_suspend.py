"""Suspend and resume from the client: the typed refusal without storage, the patch and the wait,
resume by spec and by activity, acquire resuming whatever suspended the sandbox, the handle
moving to the new pod, refusals on resume, and the sync twins. A fake API server plays the
operator (conditions, observedGeneration, suspendedBy/suspendedAt) and watches."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from sandbox_operator import labels as lbl
from sandbox_operator import naming
from sandbox_operator.client import (
    DataPlaneError,
    ExecResult,
    Sandbox,
    SandboxClient,
    SandboxGone,
    SandboxIsolationBelowFloor,
    SandboxNotReadyInTime,
    SandboxNotSuspendable,
    SandboxNotSuspendedInTime,
    SandboxSpecRejected,
    SandboxSuspended,
    SyncSandboxClient,
    is_suspended,
)
from sandbox_operator.client.sync import _Loop
from sandbox_operator.contract import (
    SANDBOX_PLURAL,
    SANDBOX_SCOPE_PLURAL,
    SandboxKey,
    SandboxSpec,
)

NS = "ns"
STORAGE = {"size": "1Gi"}


def now_stamp(offset: float = 0.0) -> str:
    t = datetime.now(UTC) + timedelta(seconds=offset)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def cond(type_: str, status: str, reason: str, gen: int, message: str = "") -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": gen,
    }


# ---- a fake API server and operator ------------------------------------------------------------


class RawAnswer:
    """An aiohttp response as the generated client hands it over with ``_preload_content=False``."""

    def __init__(self, status: int, reason: str, data: bytes) -> None:
        self.status, self.reason, self.data = status, reason, data
        self.headers: dict[str, str] = {}
        self.released = False

    async def read(self) -> bytes:
        return self.data

    def release(self) -> None:
        self.released = True


class FakeServer:
    """Enough of CustomObjectsApi: get, server-side apply, merge patch (with the CRD's CEL rule
    on ``suspended``), delete; every change wakes the watchers and the operator."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.patches: list[tuple[str, str, dict[str, Any]]] = []  # (content type, name, body)
        self.rv = 0
        self._changed = asyncio.Event()

    def changed(self) -> None:
        self.rv += 1
        old, self._changed = self._changed, asyncio.Event()
        old.set()

    def put(self, plural: str, name: str, obj: dict[str, Any]) -> None:
        self.changed()
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        self.objects[(plural, name)] = obj

    async def get_namespaced_custom_object(
        self, group: str, version: str, ns: str, plural: str, name: str
    ) -> dict[str, Any]:
        try:
            return copy.deepcopy(self.objects[(plural, name)])
        except KeyError:
            raise ApiException(status=404, reason="Not Found") from None

    async def delete_namespaced_custom_object(
        self, group: str, version: str, ns: str, plural: str, name: str
    ) -> None:
        if self.objects.pop((plural, name), None) is None:
            raise ApiException(status=404, reason="Not Found")
        self.changed()

    async def patch_namespaced_custom_object(
        self,
        group: str,
        version: str,
        ns: str,
        plural: str,
        name: str,
        body: dict[str, Any],
        *,
        field_manager: str = "",
        _content_type: str = "",
        _preload_content: bool = True,
    ) -> Any:
        if not _preload_content:  # the raw answer, as aiohttp gives it
            created = (plural, name) not in self.objects
            try:
                obj = await self.patch_namespaced_custom_object(
                    group, version, ns, plural, name, body,
                    field_manager=field_manager, _content_type=_content_type,
                )  # fmt: skip
            except ApiException as exc:
                return RawAnswer(exc.status, exc.reason, (exc.body or "").encode())
            return RawAnswer(201 if created else 200, "OK", json.dumps(obj).encode())
        self.patches.append((_content_type, name, copy.deepcopy(body)))
        current = self.objects.get((plural, name))
        if _content_type == "application/apply-patch+yaml":
            if current is None:
                obj = copy.deepcopy(body)
                obj["metadata"]["generation"] = 1
                obj["metadata"]["uid"] = f"uid-{name}"
                obj["spec"].setdefault("suspended", False)
            else:
                obj = copy.deepcopy(current)
                spec = {**body["spec"], "suspended": current["spec"].get("suspended", False)}
                if spec != current["spec"]:
                    obj["metadata"]["generation"] += 1
                obj["spec"] = spec
            self.put(plural, name, obj)
            return copy.deepcopy(obj)
        if current is None:
            raise ApiException(status=404, reason="Not Found")
        obj = copy.deepcopy(current)
        meta = body.get("metadata") or {}
        if "annotations" in meta:
            obj["metadata"].setdefault("annotations", {}).update(meta["annotations"])
        if "spec" in body:
            spec = {**obj["spec"], **body["spec"]}
            if spec.get("suspended") and not spec.get("storage"):
                exc = ApiException(status=422, reason="Unprocessable Entity")
                exc.body = json.dumps(
                    {
                        "message": "Sandbox.sandbox-operator.dev is invalid: spec.suspended: "
                        "Invalid value: suspended needs storage"
                    }
                )
                raise exc
            if spec != obj["spec"]:
                obj["metadata"]["generation"] += 1
            obj["spec"] = spec
        self.put(plural, name, obj)
        return copy.deepcopy(obj)

    async def next_event(
        self, plural: str, name: str, resource_version: str | None
    ) -> tuple[str, dict[str, Any]] | None:
        while True:
            obj = self.objects.get((plural, name))
            if obj is None:
                return "DELETED", {"metadata": {"name": name}}
            if obj["metadata"].get("resourceVersion") != resource_version:
                return "MODIFIED", copy.deepcopy(obj)
            await self._changed.wait()


class FakeOperator:
    """Reconciles Sandboxes like the operator's suspend/resume does, one step per change."""

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.pods: set[str] = set()
        self.pod_count = 0
        self.refuse_resume: str | None = None  # a refusal reason for the next resumes
        self.paused = False
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.ensure_future(self.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def run(self) -> None:
        while True:
            event = self.server._changed
            await asyncio.sleep(0.01)
            if not self.paused:
                for (plural, name), obj in list(self.server.objects.items()):
                    if plural == SANDBOX_PLURAL:
                        new = self.reconcile(copy.deepcopy(obj))
                        if new is not None:
                            self.server.put(plural, name, new)
            if event is self.server._changed:
                await event.wait()

    def new_pod(self, name: str) -> dict[str, Any]:
        self.pod_count += 1
        pod = f"{name}-pod-{self.pod_count}"
        self.pods.add(pod)
        return {"kind": "Pod", "name": pod, "namespace": NS}

    def suspend(self, obj: dict[str, Any], by: str) -> None:
        status = obj.setdefault("status", {})
        served = status.pop("servedBy", None)
        if served:
            self.pods.discard(served["name"])
        gen = obj["metadata"]["generation"]
        status.update(
            suspendedBy=by,
            suspendedAt=now_stamp(),
            suspendCount=status.get("suspendCount", 0) + 1,
            observedGeneration=gen,
            conditions=[
                cond("Admitted", "True", "Admitted", gen),
                cond("Ready", "False", "Suspended", gen),
            ],
        )

    def serve(self, obj: dict[str, Any], resumed: bool) -> None:
        status = obj["status"]
        gen = obj["metadata"]["generation"]
        if resumed and self.refuse_resume:
            status["observedGeneration"] = gen
            status["conditions"] = [
                cond("Admitted", "False", self.refuse_resume, gen, "floor raised to vm"),
                cond("Ready", "False", "Suspended", gen),
            ]
            return
        status["servedBy"] = self.new_pod(obj["metadata"]["name"])
        if resumed:
            status.pop("suspendedBy", None)
            status["resumedAt"] = now_stamp()
            status["resumeCount"] = status.get("resumeCount", 0) + 1
        status["observedGeneration"] = gen
        status["conditions"] = [
            cond("Admitted", "True", "Admitted", gen),
            cond("Ready", "True", "Ready", gen),
        ]

    def reconcile(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        before = copy.deepcopy(obj)
        status = obj.setdefault("status", {})
        spec = obj["spec"]
        by = status.get("suspendedBy")
        gen = obj["metadata"]["generation"]
        if not status.get("conditions"):
            self.serve(obj, resumed=False)
        elif spec.get("suspended"):
            if by is None:
                self.suspend(obj, "spec")
            elif by == "idle" or status.get("observedGeneration") != gen:
                status["suspendedBy"] = "spec"
                status["observedGeneration"] = gen
                for c in status["conditions"]:
                    c["observedGeneration"] = gen
        elif by == "spec":
            self.serve(obj, resumed=True)
        elif by == "idle":
            ann = obj["metadata"].get("annotations") or {}
            activity = ann.get(lbl.LAST_ACTIVITY_ANNOTATION)
            if activity and parse(activity) > parse(status["suspendedAt"]):
                self.serve(obj, resumed=True)
        elif status.get("observedGeneration") != gen:
            status["observedGeneration"] = gen
        return obj if obj != before else None

    def idle_suspend(self, name: str) -> None:
        obj = copy.deepcopy(self.server.objects[(SANDBOX_PLURAL, name)])
        self.suspend(obj, "idle")
        self.server.put(SANDBOX_PLURAL, name, obj)


class FakePlane:
    """A data plane bound to one pod: fails like a pod exec once the pod is gone."""

    def __init__(self, operator: FakeOperator, pod: str) -> None:
        self.operator = operator
        self.pod = pod
        self.closed = False

    def _check(self) -> None:
        if self.closed or self.pod not in self.operator.pods:
            raise DataPlaneError("exec refused by the API server (HTTP 404)")

    async def exec(self, *args: Any, **kwargs: Any) -> ExecResult:
        self._check()
        return ExecResult(0, self.pod.encode(), b"")

    async def write_file(self, *args: Any, **kwargs: Any) -> None:
        self._check()

    async def read_file(self, *args: Any, **kwargs: Any) -> bytes:
        self._check()
        return self.pod.encode()

    async def stat(self, *args: Any, **kwargs: Any) -> Any:
        self._check()

    async def list_dir(self, *args: Any, **kwargs: Any) -> list[Any]:
        self._check()
        return []

    async def remove(self, *args: Any, **kwargs: Any) -> bool:
        self._check()
        return True

    async def close(self) -> None:
        self.closed = True


class Harness:
    def __init__(self) -> None:
        cfg = k8s.Configuration()
        cfg.host = "http://127.0.0.1:9"
        self.client = SandboxClient(k8s.ApiClient(configuration=cfg), NS, default_timeout=5)
        self.server = FakeServer()
        self.operator = FakeOperator(self.server)
        self.client.custom = self.server  # type: ignore[assignment]
        self.client.watches.next_event = self.server.next_event  # type: ignore[method-assign]
        self.planes: list[FakePlane] = []

        def dataplane(obj: Any) -> FakePlane:
            plane = FakePlane(self.operator, obj["status"]["servedBy"]["name"])
            self.planes.append(plane)
            return plane

        self.client.planes.connect = dataplane  # type: ignore[method-assign]
        self.server.objects[(SANDBOX_SCOPE_PLURAL, "conv")] = {
            "metadata": {"name": "conv", "namespace": NS, "resourceVersion": "0"},
            "spec": {"scope": "tenant", "threadId": "t1"},
        }
        self.operator.start()

    def name(self, agent_dir: str = "agent") -> str:
        key = SandboxKey(scope="tenant", thread_id="t1", agent_dir=agent_dir)
        return naming.sandbox_name(key, "t")

    def obj(self, name: str) -> dict[str, Any]:
        return self.server.objects[(SANDBOX_PLURAL, name)]

    def spec_patches(self, name: str) -> list[dict[str, Any]]:
        return [
            body["spec"]
            for kind, n, body in self.server.patches
            if n == name and kind == "application/merge-patch+json" and "spec" in body
        ]

    def touches(self, name: str) -> list[str]:
        return [
            body["metadata"]["annotations"][lbl.LAST_ACTIVITY_ANNOTATION]
            for kind, n, body in self.server.patches
            if n == name and kind == "application/merge-patch+json" and "metadata" in body
        ]

    async def acquire(self, agent_dir: str = "agent", **fields: Any) -> Sandbox:
        return await self.client.acquire("conv", agent_dir, spec(**fields), timeout=5)

    async def close(self) -> None:
        await self.operator.stop()
        await self.client.close()


def spec(**fields: Any) -> SandboxSpec:
    data: dict[str, Any] = {"kind": "t", "image": "i", "requires": ["exec"], "storage": STORAGE}
    data.update(fields)
    return SandboxSpec.model_validate({k: v for k, v in data.items() if v is not None})


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    harness = Harness()
    yield harness
    await harness.close()


# ---- suspend -----------------------------------------------------------------------------------


async def test_suspend_without_storage_refused_before_any_patch(h: Harness) -> None:
    sb = await h.acquire(storage=None)
    with pytest.raises(SandboxNotSuspendable) as info:
        await sb.suspend()
    assert isinstance(info.value, ValueError)
    assert info.value.sandbox == sb.name and info.value.namespace == NS
    assert h.spec_patches(sb.name) == []
    assert (await sb.exec(["true"])).ok  # still served


async def test_server_refusal_of_suspended_without_storage_is_typed(h: Harness) -> None:
    sb = await h.acquire(storage=None)
    with pytest.raises(SandboxNotSuspendable):
        await h.client.objects.patch_suspended(sb.name, True)


async def test_suspend_patches_and_waits_for_suspended(h: Harness) -> None:
    sb = await h.acquire()
    first_pod = h.obj(sb.name)["status"]["servedBy"]["name"]
    await sb.suspend()
    assert h.spec_patches(sb.name) == [{"suspended": True}]
    obj = h.obj(sb.name)
    assert obj["status"]["suspendedBy"] == "spec"
    assert first_pod not in h.operator.pods
    assert is_suspended(obj)
    assert h.planes[0].closed  # the handle let go of the old pod


async def test_suspend_again_does_not_patch(h: Harness) -> None:
    sb = await h.acquire()
    await h.client.suspend(sb.name)
    await h.client.suspend(sb.name)
    assert h.spec_patches(sb.name) == [{"suspended": True}]


async def test_suspend_without_wait_returns_at_once(h: Harness) -> None:
    sb = await h.acquire()
    h.operator.paused = True
    await h.client.suspend(sb, wait=False)
    assert h.obj(sb.name)["spec"]["suspended"] is True
    assert "suspendedBy" not in h.obj(sb.name)["status"]


async def test_suspend_times_out_typed(h: Harness) -> None:
    sb = await h.acquire()
    h.operator.paused = True
    with pytest.raises(SandboxNotSuspendedInTime) as info:
        await h.client.suspend(sb.name, timeout=0.3)
    assert isinstance(info.value, TimeoutError)
    assert info.value.last_reason == "Admitted"  # stale Ready: the spec changed


async def test_suspend_of_a_deleted_sandbox_is_gone(h: Harness) -> None:
    with pytest.raises(SandboxGone):
        await h.client.suspend("no-such-sandbox")


async def test_suspend_wait_raises_when_deleted_meanwhile(h: Harness) -> None:
    sb = await h.acquire()
    h.operator.paused = True
    task = asyncio.ensure_future(h.client.suspend(sb.name))
    await asyncio.sleep(0.05)
    await h.server.delete_namespaced_custom_object("", "", NS, SANDBOX_PLURAL, sb.name)
    with pytest.raises(SandboxGone):
        await task


# ---- resume ------------------------------------------------------------------------------------


async def test_resume_by_spec_moves_the_handle_to_the_new_pod(h: Harness) -> None:
    sb = await h.acquire()
    assert (await sb.exec(["hostname"])).stdout == b"%s-pod-1" % sb.name.encode()
    await sb.suspend()
    await sb.resume()
    assert h.spec_patches(sb.name) == [{"suspended": True}, {"suspended": False}]
    status = h.obj(sb.name)["status"]
    assert status["resumeCount"] == 1 and "suspendedBy" not in status
    assert (await sb.exec(["hostname"])).stdout == b"%s-pod-2" % sb.name.encode()
    state = sb.effective_state
    assert state is not None and state.served_by_kind == "Pod"


async def test_use_after_suspend_resumes_transparently(h: Harness) -> None:
    sb = await h.acquire()
    await sb.suspend()
    result = await sb.exec(["hostname"])
    assert result.stdout.endswith(b"-pod-2")
    assert h.obj(sb.name)["spec"]["suspended"] is False


async def test_resume_of_an_idle_suspended_sandbox_touches_after_suspended_at(
    h: Harness,
) -> None:
    sb = await h.acquire()
    h.operator.idle_suspend(sb.name)
    suspended_at = parse(h.obj(sb.name)["status"]["suspendedAt"])
    await h.client.resume(sb)
    assert h.spec_patches(sb.name) == []  # spec.suspended was never true
    touches = h.touches(sb.name)
    assert touches and parse(touches[-1]) > suspended_at
    assert (await sb.exec(["x"])).stdout.endswith(b"-pod-2")


async def test_handle_use_on_an_externally_suspended_sandbox(h: Harness) -> None:
    sb = await h.acquire()
    h.operator.idle_suspend(sb.name)
    with pytest.raises(SandboxSuspended) as info:
        await sb.exec(["x"])
    assert info.value.reason == "Suspended"
    # The next use resumes it.
    assert (await sb.exec(["x"])).stdout.endswith(b"-pod-2")


async def test_data_plane_failure_on_a_running_sandbox_is_not_suspension(h: Harness) -> None:
    sb = await h.acquire()
    h.operator.pods.clear()  # pod gone, but the Sandbox says nothing about suspension
    with pytest.raises(DataPlaneError):
        await sb.exec(["x"])


async def test_resume_refused_raises_the_refusal_and_stays_suspended(h: Harness) -> None:
    sb = await h.acquire()
    await sb.suspend()
    h.operator.refuse_resume = "IsolationBelowFloor"
    with pytest.raises(SandboxIsolationBelowFloor) as info:
        await sb.resume()
    assert info.value.reason == "IsolationBelowFloor"
    assert h.obj(sb.name)["status"]["suspendedBy"] == "spec"
    h.operator.refuse_resume = None


async def test_resume_of_a_running_sandbox_changes_nothing(h: Harness) -> None:
    sb = await h.acquire()
    await sb.resume()
    assert h.spec_patches(sb.name) == [] and h.touches(sb.name) == []
    assert len(h.planes) == 1 and not h.planes[0].closed


async def test_resume_without_wait_then_use_waits(h: Harness) -> None:
    sb = await h.acquire()
    await h.client.suspend(sb.name)  # by name: the handle does not know yet
    await sb.resume(wait=False)
    assert h.obj(sb.name)["spec"]["suspended"] is False
    assert (await sb.exec(["x"])).stdout.endswith(b"-pod-2")


async def test_resume_times_out_typed(h: Harness) -> None:
    sb = await h.acquire()
    await sb.suspend()
    h.operator.paused = True
    with pytest.raises(SandboxNotReadyInTime) as info:
        await sb.resume(timeout=0.3)
    assert info.value.last_reason == "Admitted"  # the spec changed; the operator is away


async def test_resume_wait_ends_suspended_again(h: Harness) -> None:
    sb = await h.acquire()
    await sb.suspend()
    h.operator.paused = True
    task = asyncio.ensure_future(h.client.resume(sb.name))
    await asyncio.sleep(0.05)
    await h.server.patch_namespaced_custom_object(
        "",
        "",
        NS,
        SANDBOX_PLURAL,
        sb.name,
        {"spec": {"suspended": True}},
        _content_type="application/merge-patch+json",
    )
    h.operator.paused = False
    h.server.changed()
    with pytest.raises(SandboxSuspended):
        await task


# ---- acquire -----------------------------------------------------------------------------------


async def test_acquire_never_owns_suspended(h: Harness) -> None:
    sb = await h.acquire()
    applies = [b for kind, n, b in h.server.patches if kind.startswith("application/apply")]
    assert applies and all("suspended" not in b["spec"] for b in applies)
    assert h.obj(sb.name)["spec"]["suspended"] is False


async def test_only_the_acquire_that_created_the_sandbox_says_so(h: Harness) -> None:
    first = await h.acquire()
    again = await h.acquire()
    assert first.created is True and again.created is False
    assert again.resource is not None
    assert again.resource["metadata"]["uid"] == first.resource["metadata"]["uid"]  # type: ignore[index]


@pytest.mark.parametrize("how", ["spec", "idle"])
async def test_acquire_resumes_a_suspended_sandbox(h: Harness, how: str) -> None:
    sb = await h.acquire()
    if how == "spec":
        await h.client.suspend(sb.name)
    else:
        h.operator.idle_suspend(sb.name)
    again = await h.acquire()
    assert again.name == sb.name
    assert (await again.exec(["x"])).stdout.endswith(b"-pod-2")
    status = h.obj(sb.name)["status"]
    assert status["resumeCount"] == 1 and "suspendedBy" not in status
    if how == "idle":
        assert h.spec_patches(sb.name) == []


async def test_acquire_of_a_suspended_sandbox_whose_resume_is_refused(h: Harness) -> None:
    sb = await h.acquire()
    await h.client.suspend(sb.name)
    h.operator.refuse_resume = "IsolationBelowFloor"
    with pytest.raises(SandboxIsolationBelowFloor):
        await h.acquire()
    assert h.obj(sb.name)["spec"]["suspended"] is False
    assert h.obj(sb.name)["status"]["suspendedBy"] == "spec"


async def test_acquire_suspended_during_wait_raises_suspended(h: Harness) -> None:
    h.operator.paused = True
    task = asyncio.ensure_future(h.acquire())
    await asyncio.sleep(0.05)
    name = h.name()
    obj = copy.deepcopy(h.obj(name))
    obj["spec"]["suspended"] = True
    obj["metadata"]["generation"] += 1
    h.operator.suspend(obj, "spec")
    h.server.put(SANDBOX_PLURAL, name, obj)
    with pytest.raises(SandboxSuspended):
        await task


async def test_spec_rejected_on_resume_is_typed(h: Harness) -> None:
    sb = await h.acquire()

    async def reject(*args: Any, **kwargs: Any) -> Any:
        exc = ApiException(status=422, reason="Unprocessable Entity")
        exc.body = json.dumps({"message": "spec: Invalid value: something else"})
        raise exc

    h.server.patch_namespaced_custom_object = reject  # type: ignore[method-assign]
    with pytest.raises(SandboxSpecRejected):
        await h.client.objects.patch_suspended(sb.name, False)


# ---- sync twins --------------------------------------------------------------------------------


def test_sync_suspend_and_resume() -> None:
    loop = _Loop()
    try:

        async def build() -> Harness:
            return Harness()

        harness = loop.run(build())
        client = SyncSandboxClient(harness.client, loop)
        sb = client.acquire("conv", "agent", spec(), timeout=5)
        sb.suspend()
        assert harness.obj(sb.name)["status"]["suspendedBy"] == "spec"
        sb.resume()
        assert sb.exec(["x"]).stdout.endswith(b"-pod-2")
        client.suspend(sb)
        client.resume(sb.name)
        assert sb.exec(["x"]).stdout.endswith(b"-pod-3")
        loop.run(harness.close())
    finally:
        loop.stop()


# ---- evaluation and errors ---------------------------------------------------------------------


def sbx(*conds: dict[str, Any], gen: int = 1, observed: int = 1, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"generation": gen},
        "spec": spec,
        "status": {"observedGeneration": observed, "conditions": list(conds)},
    }


SUSPENDED_NOW = cond("Ready", "False", "Suspended", 1)
READY_NOW = cond("Ready", "True", "Ready", 1)
REFUSED = cond("Admitted", "False", "IsolationBelowFloor", 1)


@pytest.mark.parametrize(
    ("obj", "goal", "want"),
    [
        (sbx(SUSPENDED_NOW), "ready", "terminal"),  # a plain wait ends suspended
        (sbx(SUSPENDED_NOW), "resumed", "pending"),  # on its way back
        (sbx(SUSPENDED_NOW, suspended=True), "resumed", "terminal"),  # suspended again
        (sbx(SUSPENDED_NOW, REFUSED), "resumed", "terminal"),  # resume refused
        (sbx(SUSPENDED_NOW), "suspended", "ready"),
        (sbx(SUSPENDED_NOW, gen=2), "suspended", "pending"),  # for an older spec
        (sbx(READY_NOW, suspended=True), "suspended", "pending"),
        (sbx(cond("Disposed", "True", "Expired", 1)), "suspended", "terminal"),
    ],
)
def test_evaluate_for_goal(obj: dict[str, Any], goal: Any, want: str) -> None:
    from sandbox_operator.client.status import evaluate_for as _evaluate_for

    assert _evaluate_for(obj, goal)[0] == want


def test_is_suspended() -> None:
    assert is_suspended(sbx(READY_NOW, suspended=True))
    assert is_suspended(sbx(SUSPENDED_NOW))
    assert is_suspended({"spec": {}, "status": {"suspendedBy": "idle"}})
    assert not is_suspended(sbx(READY_NOW, suspended=False))
    assert not is_suspended({})


def test_errors() -> None:
    from sandbox_operator.client import (
        SandboxClientError,
        SandboxRefused,
        SandboxStorageNotSupported,
        acquire_error_for,
    )

    assert acquire_error_for("Suspended") is SandboxSuspended
    assert acquire_error_for("StorageNotSupported") is SandboxStorageNotSupported
    assert issubclass(SandboxStorageNotSupported, SandboxRefused)
    exc = SandboxNotSuspendable(sandbox="s", namespace="n")
    assert isinstance(exc, SandboxClientError) and isinstance(exc, ValueError)
    assert "storage" in str(exc)
    timeout = SandboxNotSuspendedInTime(sandbox="s", namespace="n", timeout=2, last_reason="X")
    assert isinstance(timeout, TimeoutError) and "X" in str(timeout)


# ---- an agent bound to its conversation (#25 item 2) ---------------------------------------------


def _forbid_watches(h: Harness, refusals: int | None) -> list[str]:
    """The next ``refusals`` watches of a Sandbox (all, when None) answer 403, as the API server
    does to an agent until the operator has added the Sandbox's name to its conversation's Role."""
    from kubernetes_asyncio.client.exceptions import ApiException

    refused: list[str] = []
    watch = h.server.next_event

    async def next_event(plural: str, name: str, rv: str | None) -> Any:
        if plural == SANDBOX_PLURAL and (refusals is None or len(refused) < refusals):
            refused.append(name)
            raise ApiException(status=403, reason="Forbidden")
        return await watch(plural, name, rv)

    h.client.watches.next_event = next_event  # type: ignore[method-assign]
    return refused


async def test_an_acquire_waits_for_the_read_grant_of_the_sandbox_it_created(h: Harness) -> None:
    refused = _forbid_watches(h, 3)
    sb = await h.acquire(storage=None)
    assert len(refused) == 3 and set(refused) == {sb.name}
    assert (await sb.exec(["true"])).ok


async def test_a_read_grant_that_never_comes_is_sandbox_forbidden(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox_operator.client import watching
    from sandbox_operator.client.errors import SandboxForbidden

    monkeypatch.setattr(watching, "READ_GRANT_WAIT_SECONDS", 0.3)
    _forbid_watches(h, None)
    with pytest.raises(SandboxForbidden) as info:
        await h.acquire(storage=None)
    assert info.value.action == "watch sandboxes" and info.value.namespace == NS


async def test_a_scope_for_bound_agents_is_ready_or_says_why_not(h: Harness) -> None:
    """create_scope(agent_service_accounts=...) returns once the operator reports the scope's
    current generation Ready (its agents' Role written), and raises its reason otherwise."""
    from sandbox_operator.client import SandboxScopeNotReady

    def scope(status: str, reason: str, observed: int = 1) -> dict[str, Any]:
        return {
            "metadata": {"name": "conv", "generation": 1, "resourceVersion": "1"},
            "status": {
                "observedGeneration": observed,
                "conditions": [{"type": "Ready", "status": status, "reason": reason}],
            },
        }

    await h.client.scopes.wait_ready("conv", scope("True", "Ready"))
    with pytest.raises(SandboxScopeNotReady) as info:
        await h.client.scopes.wait_ready("conv", scope("False", "AccessNotGranted"))
    assert info.value.reason == "AccessNotGranted" and info.value.scope_ref == "conv"
    with pytest.raises(TimeoutError):  # an older generation's Ready says nothing yet
        async with asyncio.timeout(0.2):
            await h.client.scopes.wait_ready("conv", scope("True", "Ready", observed=0))
