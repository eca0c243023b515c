"""The Sandbox/SandboxScope reconcilers over fake collaborators (no cluster): the flow of
conditions, the status written only on change, KeyUnclean, terminal reasons and purges.

The reconcilers read the in-memory views; here ``sync`` plays the watches (it puts what the
fake API server holds into the views before each pass), and a pass returns the delay until its
next deadline instead of raising for kopf to retry."""

from __future__ import annotations

import copy
from typing import Any, TypeVar

from sandbox_operator import labels as lbl
from sandbox_operator.backends.base import (
    BackendObject,
    ObservedPhase,
    ServedBy,
)
from sandbox_operator.reconcile import sandbox as sandbox_reconciler
from sandbox_operator.reconcile import scope as scope_reconciler
from sandbox_operator.reconcile.runtime import FINALIZER, Runtime
from tests.fixtures.reconcile import (
    NS,
    SPEC,
    FakeDriver,
    FakeKube,
    cond,
    finalize_sandbox,
    reconcile_sandbox,
    reconcile_scope,
    runtime,
    sync,
)


async def test_admit_create_ready_and_write_only_on_change(world):
    rt, kube, driver = world
    kube.add("sandboxes", "a", SPEC)
    await reconcile_sandbox(rt, NS, "a")
    assert cond(kube, "a", "Admitted")["status"] == "True"
    assert cond(kube, "a", "Ready")["reason"] == "Creating"
    assert driver.creates == 1
    st = kube.objs[("sandboxes", "a")]["status"]
    assert st["backend"] == "gvisor" and st["effectiveFloor"] == "hardened_container"
    assert st["observedGeneration"] == 1
    labels = kube.objs[("sandboxes", "a")]["metadata"]["labels"]
    assert labels[lbl.SANDBOX_LABEL] == "a"
    writes = kube.status_writes
    await reconcile_sandbox(rt, NS, "a")
    assert kube.status_writes == writes  # nothing changed: nothing written
    assert driver.creates == 1
    driver.pods["a"]["phase"] = ObservedPhase.READY
    await reconcile_sandbox(rt, NS, "a")
    ready = cond(kube, "a", "Ready")
    assert ready["status"] == "True" and ready["reason"] == "Ready"
    assert not [e for e in kube.events if e[0] == "a"]  # the conditions say it all
    # died after ready -> Failed (terminal, disposed)
    driver.pods["a"]["phase"] = ObservedPhase.FAILED
    await reconcile_sandbox(rt, NS, "a")
    assert cond(kube, "a", "Ready")["reason"] == "Failed"
    assert cond(kube, "a", "Disposed")["status"] == "True"
    assert "a" not in driver.pods
    assert [e for e in kube.events if e[0] == "a"] == [("a", "Warning", "Failed")]
    await reconcile_sandbox(rt, NS, "a")
    assert "a" not in driver.pods  # terminal: never recreated


async def test_a_pass_writes_its_status_at_most_once(world):
    """Gather -> decide -> one action -> one status write: whatever a pass does (admit, create,
    report Ready, fail and dispose, let go at deletion), it patches the status at most once, and
    an unwatched driver's admission is written before its create, in a pass of its own."""
    rt, kube, driver = world
    kube.add("sandboxes", "a", SPEC)
    per_pass: list[int] = []

    async def one_pass() -> float | None:
        before = kube.status_writes
        sync(rt, kube)
        delay = await sandbox_reconciler.reconcile_sandbox(rt, NS, "a")
        per_pass.append(kube.status_writes - before)
        return delay

    assert await one_pass() == 0.0  # admitted, and asked to be passed again at once
    assert cond(kube, "a", "Admitted")["status"] == "True" and driver.creates == 0
    await one_pass()
    assert driver.creates == 1 and cond(kube, "a", "Ready")["reason"] == "Creating"
    driver.pods["a"]["phase"] = ObservedPhase.READY
    await one_pass()
    assert cond(kube, "a", "Ready")["status"] == "True"
    driver.pods["a"]["phase"] = ObservedPhase.FAILED
    await one_pass()
    assert cond(kube, "a", "Ready")["reason"] == "Failed"
    assert cond(kube, "a", "Disposed")["status"] == "True" and "a" not in driver.pods
    await kube.delete_sandbox(NS, "a")
    await one_pass()
    assert ("sandboxes", "a") not in kube.objs
    assert per_pass == [1, 1, 1, 1, 0]


async def test_refusal_creates_nothing(world):
    """A refusal is one status write: no finalizer and no key labels (nothing was made for it,
    and it holds no key), so no metadata patch either."""
    rt, kube, driver = world
    kube.add("sandboxes", "b", {**SPEC, "minIsolation": "microvm"})
    calls = count_api_calls(kube)
    await reconcile_sandbox(rt, NS, "b")
    assert calls.get("patch_status") == 1 and "patch_metadata" not in calls, calls
    assert FINALIZER not in (kube.objs[("sandboxes", "b")]["metadata"].get("finalizers") or [])
    assert cond(kube, "b", "Admitted")["reason"] == "IsolationBelowFloor"
    assert cond(kube, "b", "Ready")["reason"] == "IsolationBelowFloor"
    assert driver.pods == {}
    assert kube.events.count(("b", "Warning", "IsolationBelowFloor")) == 1


async def test_unavailable_backend_is_refused(world):
    rt, kube, driver = world
    driver.available = False
    await rt.refresh_availability(force=True)
    kube.add("sandboxes", "c", SPEC)
    await reconcile_sandbox(rt, NS, "c")
    assert cond(kube, "c", "Admitted")["reason"] == "BackendUnavailable"
    assert driver.pods == {}


async def test_scope_not_found_then_found(world):
    rt, kube, driver = world
    kube.add("sandboxes", "d", {**SPEC, "scopeRef": "later"})
    await reconcile_sandbox(rt, NS, "d")
    assert cond(kube, "d", "Admitted")["reason"] == "ScopeNotFound"
    kube.add("sandboxscopes", "later", {"scope": "s", "threadId": "t2"})
    await reconcile_sandbox(rt, NS, "d")
    assert cond(kube, "d", "Admitted")["status"] == "True"
    assert "d" in driver.pods


async def test_a_scope_the_views_have_not_seen_yet_is_read_before_scope_not_found(world):
    """The scope's watch event can arrive after the Sandbox's (a client creates a scope and at
    once a Sandbox naming it): a scope the views lack is read once before ScopeNotFound, which
    a waiting client takes as terminal."""
    rt, kube, driver = world
    sync(rt, kube)
    kube.add("sandboxscopes", "fresh", {"scope": "s", "threadId": "t3"})
    kube.add("sandboxes", "e", {**SPEC, "scopeRef": "fresh"})
    rt.views.put_sandbox(copy.deepcopy(kube.objs[("sandboxes", "e")]))
    assert rt.views.scopes.get(NS, "fresh") is None  # the scope's event has not arrived
    # An unwatched driver: the admission is this pass's one write, the create the next pass's.
    assert await sandbox_reconciler.reconcile_sandbox(rt, NS, "e") == 0.0
    assert cond(kube, "e", "Admitted")["status"] == "True"
    assert "e" not in driver.pods
    await sandbox_reconciler.reconcile_sandbox(rt, NS, "e")
    assert "e" in driver.pods
    # A scope that really is missing is still ScopeNotFound.
    kube.add("sandboxes", "f", {**SPEC, "scopeRef": "nowhere"})
    rt.views.put_sandbox(copy.deepcopy(kube.objs[("sandboxes", "f")]))
    await sandbox_reconciler.reconcile_sandbox(rt, NS, "f")
    assert cond(kube, "f", "Admitted")["reason"] == "ScopeNotFound"


async def test_failed_disposal_keeps_finalizer_and_makes_key_unclean(world):
    rt, kube, driver = world
    kube.add("sandboxes", "e1", SPEC)
    await reconcile_sandbox(rt, NS, "e1")
    driver.fail_dispose = True
    retry = await finalize_sandbox(rt, NS, "e1")
    assert retry == rt.config.operator.disposal_retry_seconds  # retried later
    assert FINALIZER in kube.objs[("sandboxes", "e1")]["metadata"]["finalizers"]  # kept
    disposed = cond(kube, "e1", "Disposed")
    assert disposed["reason"] == "DisposalFailed" and "timeout" in disposed["message"]
    kube.add("sandboxes", "e2", SPEC)  # same key, another name
    await reconcile_sandbox(rt, NS, "e2")
    assert cond(kube, "e2", "Admitted")["reason"] == "KeyUnclean"
    assert "e2" not in driver.pods
    driver.fail_dispose = False
    await finalize_sandbox(rt, NS, "e1")
    assert ("sandboxes", "e1") not in kube.objs  # disposed: the finalizer let it go
    await reconcile_sandbox(rt, NS, "e2")
    assert cond(kube, "e2", "Admitted")["status"] == "True"
    assert "e2" in driver.pods


async def test_another_kind_under_the_key_is_another_sandbox(world):
    """A sandbox's identity is (key, kind): an earlier sandbox of another kind under the same key,
    live or failing to dispose, never holds this one back, while one of the same kind does."""
    rt, kube, driver = world
    kube.add("sandboxes", "py", {**SPEC, "kind": "python"})
    await reconcile_sandbox(rt, NS, "py")
    assert "py" in driver.pods  # live, with its pod labelled with its key and kind
    assert driver.pods["py"]["labels"][lbl.KIND_LABEL] == "python"
    assert kube.objs[("sandboxes", "py")]["metadata"]["labels"][lbl.KIND_LABEL] == "python"
    kube.add("sandboxes", "sh", SPEC)  # same key, kind shell
    await reconcile_sandbox(rt, NS, "sh")
    assert cond(kube, "sh", "Admitted")["status"] == "True"
    assert "sh" in driver.pods
    driver.fail_dispose = True
    await finalize_sandbox(rt, NS, "py")
    assert cond(kube, "py", "Disposed")["reason"] == "DisposalFailed"
    kube.add("sandboxes", "sh2", {**SPEC, "agentDir": "agents/b"})
    kube.add("sandboxes", "py2", {**SPEC, "kind": "python"})  # py's identity again
    kube.add("sandboxes", "sh3", SPEC)  # sh's identity: sh is live, its pod is sh's own
    for name in ("sh2", "py2", "sh3"):
        await reconcile_sandbox(rt, NS, name)
    assert cond(kube, "sh2", "Admitted")["status"] == "True"
    assert cond(kube, "py2", "Admitted")["reason"] == "KeyUnclean"
    assert cond(kube, "sh3", "Admitted")["reason"] == "KeyUnclean"  # sh's pod is not its own
    assert "py2" not in driver.pods and "sh3" not in driver.pods


async def test_scope_counts_and_purge_lists_by_labels(world):
    rt, kube, driver = world
    for i in range(5):
        kube.add("sandboxes", f"p{i}", {**SPEC, "agentDir": f"agents/{i}"})
        await reconcile_sandbox(rt, NS, f"p{i}")
    await reconcile_scope(rt, NS, "conv")
    assert kube.objs[("sandboxscopes", "conv")]["status"]["sandboxCount"] == 5
    # a leftover pod whose Sandbox object is gone is found by its labels
    leftover = dict(driver.pods["p0"], owner="gone")
    driver.pods["orphan"] = leftover
    rt.config = rt.config.model_copy(
        update={"operator": rt.config.operator.model_copy(update={"dispose_timeout_seconds": 0.1})}
    )
    scope = kube.objs[("sandboxscopes", "conv")]
    assert FINALIZER in scope["metadata"]["finalizers"]
    scope["metadata"]["deletionTimestamp"] = "2099-01-01T00:00:00Z"
    assert await reconcile_scope(rt, NS, "conv") is not None  # requested; waits for members
    assert all(kube.objs[("sandboxes", f"p{i}")]["metadata"].get("deletionTimestamp")
               for i in range(5))  # fmt: skip
    assert "orphan" not in driver.pods  # the leftover went at once
    for i in range(5):  # each member's deletion event: its finalizer disposes and lets go
        await finalize_sandbox(rt, NS, f"p{i}")
    assert await reconcile_scope(rt, NS, "conv") is None
    assert driver.pods == {}
    gone = kube.gone[("sandboxscopes", "conv")]  # recorded, then let go
    assert gone["metadata"]["finalizers"] == []
    purge = gone["status"]["lastPurge"]
    assert purge["disposed"] == 5 and not purge.get("undisposed")
    disposed = next(c for c in gone["status"]["conditions"] if c["type"] == "Disposed")
    assert disposed["reason"] == "Purged"
    assert ("conv", "Normal", "Purged") in kube.events


class FlakyDriver(FakeDriver):
    """ensure() fails with the given exception while ``failing`` is set; records what the
    Sandbox's status said at the moment ensure was called."""

    def __init__(self, name: str, kube: FakeKube, exc: Exception) -> None:
        super().__init__(name)
        self.kube = kube
        self.exc = exc
        self.failing = True
        self.seen_at_ensure: list[dict[str, Any]] = []

    async def ensure(self, request):
        obj = self.kube.objs[("sandboxes", request.sandbox.name)]
        self.seen_at_ensure.append(copy.deepcopy(obj.get("status") or {}))
        if self.failing:
            raise self.exc
        return await super().ensure(request)


D = TypeVar("D", bound=FakeDriver)


async def served_by(driver: D) -> tuple[Runtime, FakeKube, D]:
    """A runtime whose only backend is ``driver``, with Sandbox "a" admitted and created on it."""
    rt, kube, _ = runtime()
    rt.drivers["gvisor"] = driver  # type: ignore[assignment]
    kube.add("sandboxscopes", "conv", {"scope": "s", "threadId": "t"})
    kube.add("sandboxes", "a", SPEC)
    await reconcile_sandbox(rt, NS, "a")
    return rt, kube, driver


def flaky_world(exc: Exception) -> tuple[Runtime, FakeKube, FlakyDriver]:
    rt, kube, _ = runtime()
    driver = FlakyDriver("gvisor", kube, exc)
    rt.drivers["gvisor"] = driver  # type: ignore[assignment]
    kube.add("sandboxscopes", "conv", {"scope": "s", "threadId": "t"})
    return rt, kube, driver


async def test_transient_ensure_error_leaves_creating_and_retries():
    from sandbox_operator.backends.base import TransientError

    err = TransientError("AzureSandboxes_Create failed (HTTP 503)", retry_after=7.0)
    rt, kube, driver = flaky_world(err)
    kube.add("sandboxes", "a", {**SPEC, "lifetime": {"startupTimeoutSeconds": 30}})
    assert await reconcile_sandbox(rt, NS, "a") == 7.0  # retried after the service's hint
    # admission (and with it the startup clock) was recorded before ensure was called
    at_ensure = driver.seen_at_ensure[0]
    assert [c["reason"] for c in at_ensure["conditions"] if c["type"] == "Admitted"] == ["Admitted"]
    assert at_ensure["backend"] == "gvisor"
    assert cond(kube, "a", "Admitted")["status"] == "True"
    ready = cond(kube, "a", "Ready")
    assert ready["status"] == "False" and ready["reason"] == "Creating"
    assert "HTTP 503" in ready["message"]
    # the next pass retries and succeeds
    driver.failing = False
    await reconcile_sandbox(rt, NS, "a")
    assert driver.creates == 1
    assert "failed" not in cond(kube, "a", "Ready")["message"]


async def test_unknown_ensure_error_is_reported_by_type_only():
    rt, kube, _ = flaky_world(RuntimeError("https://secret.example/api?token=abc"))
    kube.add("sandboxes", "a", SPEC)
    assert await reconcile_sandbox(rt, NS, "a") == 5.0
    msg = cond(kube, "a", "Ready")["message"]
    assert "RuntimeError" in msg and "secret" not in msg and "token" not in msg


async def test_ensure_failing_until_the_deadline_ends_in_startup_timeout():
    from sandbox_operator.backends.base import TransientError

    rt, kube, driver = flaky_world(TransientError("AzureSandboxes_Create failed (HTTP 500)"))
    kube.add("sandboxes", "a", {**SPEC, "lifetime": {"startupTimeoutSeconds": 5}})
    # retried no later than the startup deadline
    assert (await reconcile_sandbox(rt, NS, "a") or 99) <= 5.1
    # move the recorded admission into the past: the deadline has passed
    for c in kube.objs[("sandboxes", "a")]["status"]["conditions"]:
        c["lastTransitionTime"] = "2000-01-01T00:00:00Z"
    calls = len(driver.seen_at_ensure)
    await reconcile_sandbox(rt, NS, "a")
    ready = cond(kube, "a", "Ready")
    assert ready["reason"] == "StartupTimeout"
    assert len(driver.seen_at_ensure) == calls  # not created again once past the deadline
    await reconcile_sandbox(rt, NS, "a")  # terminal: no more attempts
    assert len(driver.seen_at_ensure) == calls


async def test_permanent_ensure_error_is_startup_failed():
    from sandbox_operator.backends.base import StartupError

    rt, kube, _ = flaky_world(StartupError("StartupFailed", "the service refused the sandbox"))
    kube.add("sandboxes", "a", SPEC)
    await reconcile_sandbox(rt, NS, "a")
    ready = cond(kube, "a", "Ready")
    assert ready["reason"] == "StartupFailed" and "refused" in ready["message"]
    assert cond(kube, "a", "Admitted")["status"] == "True"


def test_ensure_retry_delay_backs_off_and_honours_retry_after():
    from sandbox_operator.reconcile.sandbox import ensure_retry_delay

    assert [ensure_retry_delay(r) for r in range(6)] == [5, 10, 20, 40, 60, 60]
    assert ensure_retry_delay(0, 30.0) == 30.0
    assert ensure_retry_delay(0, 600.0) == 60.0


class RecordingDriver(FakeDriver):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.disposed: list[Any] = []

    async def dispose(self, sandbox):
        self.disposed.append(sandbox)
        await super().dispose(sandbox)


async def test_dispose_gets_what_the_status_recorded_as_serving():
    rt, kube, driver = await served_by(RecordingDriver("gvisor"))
    driver.pods["a"]["phase"] = ObservedPhase.READY
    await reconcile_sandbox(rt, NS, "a")
    assert kube.objs[("sandboxes", "a")]["status"]["servedBy"]["name"] == "a"
    # the serving object drops out of sight: Failed, disposed with the recorded servedBy
    del driver.pods["a"]
    await reconcile_sandbox(rt, NS, "a")
    assert cond(kube, "a", "Ready")["reason"] == "Failed"
    assert driver.disposed[-1].served_by == ServedBy("Pod", "a", NS)
    await finalize_sandbox(rt, NS, "a")
    assert driver.disposed[-1].name == "a"
    assert ("sandboxes", "a") not in kube.objs


async def test_a_ready_sandbox_whose_pod_the_views_lack_is_read_not_failed():
    """After a peering pause kopf lists every kind again, the Sandboxes before the pods: a
    standby taking over can see a Ready Sandbox before its pod. The pod is read once from the
    API server and put into the view; the Sandbox is neither failed nor disposed."""
    rt, kube, driver = await served_by(RecordingDriver("gvisor"))
    driver.pods["a"]["phase"] = ObservedPhase.READY
    await reconcile_sandbox(rt, NS, "a")
    assert cond(kube, "a", "Ready")["status"] == "True"
    # Out of the driver's sight (its views), still on the API server.
    kube.objs[("pods", "a")] = {
        "metadata": {"name": "a", "namespace": NS, "uid": "pod-uid", "resourceVersion": "7"},
        "status": {"phase": "Running"},
    }
    held = driver.pods.pop("a")
    delay = await reconcile_sandbox(rt, NS, "a")
    assert cond(kube, "a", "Ready")["status"] == "True"
    assert not driver.disposed
    assert rt.views.pods.get(NS, "a") is not None  # put into the view
    assert delay is not None and delay < 1  # and looked at again at once
    # Once the view holds it, it is not read again: the view's word stands.
    driver.pods["a"] = held
    del kube.objs[("pods", "a")]
    await reconcile_sandbox(rt, NS, "a")
    assert cond(kube, "a", "Ready")["status"] == "True"


# ---- Ready waits for the egress proxy's admission --------------------------------------------


class ProxiedDriver(FakeDriver):
    """Like the runtime-class driver under a managed egress proxy: a ready pod is usable only
    once the Sandbox's status says the proxy admitted it (SandboxRef.egress_admitted)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.refs: list[Any] = []

    async def observe(self, sandbox):
        self.refs.append(sandbox)
        obs = await super().observe(sandbox)
        if obs.phase is ObservedPhase.READY and sandbox.egress_admitted is None:
            from dataclasses import replace

            from sandbox_operator.backends.runtimeclass import EGRESS_PENDING

            return replace(obs, pending=EGRESS_PENDING)
        return obs


def proxied_world() -> tuple[Runtime, FakeKube, ProxiedDriver]:
    rt, kube, _ = runtime()
    driver = ProxiedDriver("gvisor")
    rt.drivers["gvisor"] = driver  # type: ignore[index]
    kube.add("sandboxscopes", "conv", {"scope": "s", "threadId": "t"})
    return rt, kube, driver


def admit(kube: FakeKube, name: str, when: str | None = "2099-01-01T00:00:01.250Z") -> None:
    """What the proxy's merge patch of status.egress does."""
    egress = {"allowed": 0, "denied": 0, "unreachable": 0, "since": "2099-01-01T00:00:00Z",
              "updated": "2099-01-01T00:00:01Z", "recent": []}  # fmt: skip
    if when is not None:
        egress["admitted"] = when
    kube.objs[("sandboxes", name)].setdefault("status", {})["egress"] = egress


async def test_ready_waits_until_the_egress_proxy_admits_the_sandbox():
    rt, kube, driver = proxied_world()
    kube.add("sandboxes", "a", SPEC)
    await reconcile_sandbox(rt, NS, "a")
    driver.pods["a"]["phase"] = ObservedPhase.READY
    await reconcile_sandbox(rt, NS, "a")
    ready = cond(kube, "a", "Ready")
    assert ready["status"] == "False" and ready["reason"] == "Creating"
    assert "waiting for the egress proxy to admit the sandbox" in ready["message"]
    assert ("a", "Normal", "Ready") not in kube.events
    admit(kube, "a")
    await reconcile_sandbox(rt, NS, "a")
    assert driver.refs[-1].egress_admitted is not None  # the status reached the driver
    assert driver.refs[-1].egress_admitted.isoformat() == "2099-01-01T00:00:01.250000+00:00"
    ready = cond(kube, "a", "Ready")
    assert ready["status"] == "True" and ready["reason"] == "Ready"
    # Once Ready, a summary without `admitted` (a proxy restarting, an older proxy) does not
    # take Ready back: the restarted proxy re-admits by itself.
    admit(kube, "a", None)
    await reconcile_sandbox(rt, NS, "a")
    await reconcile_sandbox(rt, NS, "a")
    assert cond(kube, "a", "Ready")["status"] == "True"


async def test_a_proxy_that_never_admits_ends_in_startup_timeout_naming_it():
    rt, kube, driver = proxied_world()
    kube.add("sandboxes", "a", {**SPEC, "lifetime": {"startupTimeoutSeconds": 5}})
    await reconcile_sandbox(rt, NS, "a")
    driver.pods["a"]["phase"] = ObservedPhase.READY
    await reconcile_sandbox(rt, NS, "a")
    assert cond(kube, "a", "Ready")["reason"] == "Creating"
    for c in kube.objs[("sandboxes", "a")]["status"]["conditions"]:
        c["lastTransitionTime"] = "2000-01-01T00:00:00Z"  # the startup clock ran out
    await reconcile_sandbox(rt, NS, "a")
    ready = cond(kube, "a", "Ready")
    assert ready["reason"] == "StartupTimeout", ready
    assert "egress proxy" in ready["message"], ready
    assert "a" not in driver.pods  # disposed


async def test_a_deleted_sandbox_wakes_its_scope_count_debounced_but_a_purging_scope_at_once():
    """A cleanup of many Sandboxes costs their scope one count write per debounce window, not one
    per Sandbox; a scope being deleted waits for its last member, so it is woken at once."""
    from types import SimpleNamespace

    from sandbox_operator.reconcile import handlers
    from sandbox_operator.reconcile.scope import COUNT_DEBOUNCE_SECONDS

    rt, kube, _ = runtime()
    queued: list[tuple[str, float]] = []
    rt.enqueue_scope = lambda ns, name, delay=0.0, **_: queued.append((name, delay))  # type: ignore[method-assign]
    memo = SimpleNamespace(runtime=rt)
    kube.add("sandboxscopes", "conv", {"scope": "s", "threadId": "t"})
    rt.views.scopes.upsert(kube.objs[("sandboxscopes", "conv")])
    body = {
        "metadata": {"namespace": NS, "name": "a", "uid": "u1", "resourceVersion": "5"},
        "spec": {**SPEC, "scopeRef": "conv"},
    }
    await handlers.sandbox_event(type="DELETED", body=body, memo=memo)
    assert queued == [("conv", COUNT_DEBOUNCE_SECONDS)]
    scope = kube.objs[("sandboxscopes", "conv")]
    scope["metadata"]["deletionTimestamp"] = "2099-01-01T00:00:00Z"
    scope["metadata"]["resourceVersion"] += "1"  # a change is a new version
    rt.views.scopes.upsert(scope)
    await handlers.sandbox_event(type="DELETED", body=body, memo=memo)
    assert queued[1] == ("conv", 0.0)


def _pod_of_a() -> dict[str, Any]:
    """A Running pod owned by Sandbox ``a``, as a watch event carries it."""
    return {
        "metadata": {
            "namespace": NS, "name": "sbx-a", "uid": "p1", "resourceVersion": "6",
            "ownerReferences": [{"kind": "Sandbox", "name": "a", "uid": "u1"}],
        },
        "status": {"phase": "Running"},
    }  # fmt: skip


async def test_every_sandbox_event_wakes_its_pass_and_a_pod_event_its_owner():
    """The proxy's status.egress.admitted write is a Sandbox event: it wakes the pass at once
    (no filter to get wrong), and so does any event of the pod a Sandbox owns."""
    from types import SimpleNamespace

    from sandbox_operator.reconcile import handlers

    rt, _, _ = runtime()
    woken: list[tuple[str, str]] = []
    rt.enqueue_sandbox = lambda ns, name, delay=0.0, urgent=False: woken.append((ns, name))  # type: ignore[method-assign]
    rt.enqueue_scope = lambda ns, name, delay=0.0: None  # type: ignore[method-assign]
    memo = SimpleNamespace(runtime=rt)
    body = {
        "metadata": {"namespace": NS, "name": "a", "uid": "u1", "resourceVersion": "5"},
        "spec": SPEC,
        "status": {"egress": {"admitted": "2099-01-01T00:00:01Z"}},
    }
    await handlers.sandbox_view(body=body, memo=memo)
    await handlers.sandbox_event(type="MODIFIED", body=body, memo=memo)
    assert woken == [(NS, "a")]
    assert rt.views.sandboxes.get(NS, "a")["status"]["egress"]["admitted"]
    pod = _pod_of_a()
    await handlers.pod_view(body=pod, memo=memo)
    await handlers.pod_event(type="DELETED", body=pod, memo=memo)
    assert woken == [(NS, "a"), (NS, "a")]
    assert rt.views.pods.get(NS, "sbx-a") is None


def test_the_view_indexers_leave_kopfs_registry_and_nothing_else_does():
    """Once kopf has listed every kind, the index handlers are dropped from its registry: an
    event then runs one kopf handler (its event handler) instead of two."""
    import kopf

    from sandbox_operator.reconcile import handlers

    registry = kopf.get_default_registry()
    indexing = {h.fn for h in registry._indexing.get_all_handlers()}
    watching = [h.fn for h in registry._watching.get_all_handlers()]
    if handlers.sandbox_view in indexing:  # no earlier test of this process dropped them yet
        assert indexing >= set(handlers.VIEW_INDEXERS)
    fresh = kopf.OperatorRegistry()
    for fn in handlers.VIEW_INDEXERS:
        kopf.index("", "v1", "pods", registry=fresh)(fn)
    kopf.on.event("", "v1", "pods", registry=fresh)(handlers.pod_event)
    assert handlers.drop_view_indexers(fresh, handlers.VIEW_INDEXERS)
    assert fresh._indexing.get_all_handlers() == []
    assert [h.fn for h in fresh._watching.get_all_handlers()] == [handlers.pod_event]
    assert [h.fn for h in registry._watching.get_all_handlers()] == watching
    assert not handlers.drop_view_indexers(object(), handlers.VIEW_INDEXERS)


async def test_after_the_listing_the_event_handlers_feed_the_views():
    """With the index handlers gone, each event handler puts its object into the views (and a
    deletion still takes it out); while they run (kopf's listing), it leaves that to them."""
    from types import SimpleNamespace

    from sandbox_operator.reconcile import handlers

    rt, _, _ = runtime()
    rt.enqueue_sandbox = lambda ns, name, delay=0.0, urgent=False: None  # type: ignore[method-assign]
    rt.enqueue_scope = lambda ns, name, delay=0.0: None  # type: ignore[method-assign]
    memo = SimpleNamespace(runtime=rt)
    sbx = {
        "metadata": {"namespace": NS, "name": "a", "uid": "u1", "resourceVersion": "5"},
        "spec": SPEC,
    }
    pod = _pod_of_a()
    rt.views_from_events = False  # a kopf that keeps its handlers elsewhere: index handlers put
    await handlers.sandbox_event(type="MODIFIED", body=sbx, memo=memo)
    assert rt.views.sandboxes.get(NS, "a") is None
    rt.views_from_events = True
    await handlers.sandbox_event(type="MODIFIED", body=sbx, memo=memo)
    await handlers.pod_event(type="MODIFIED", body=pod, memo=memo)
    assert rt.views.sandboxes.get(NS, "a")["metadata"]["resourceVersion"] == "5"
    assert rt.views.pods.get(NS, "sbx-a")["status"]["phase"] == "Running"
    await handlers.pod_event(type="DELETED", body=pod, memo=memo)
    await handlers.sandbox_event(type="DELETED", body=sbx, memo=memo)
    assert rt.views.pods.get(NS, "sbx-a") is None and rt.views.sandboxes.get(NS, "a") is None


async def test_starting_progress_is_debounced_but_new_reasons_are_written_at_once(world):
    rt, kube, driver = world
    kube.add("sandboxes", "a", SPEC)
    await reconcile_sandbox(rt, NS, "a")  # admitted, created
    driver.pods["a"]["phase"] = ObservedPhase.STARTING
    writes = kube.status_writes
    # The pod's detail changes right after the last write: not written yet, looked at again soon.
    driver.message = "ContainerCreating"
    delay = await reconcile_sandbox(rt, NS, "a")
    assert kube.status_writes == writes and delay is not None and delay <= 10.1
    # Still not written a few seconds later: a pod that is Ready within MESSAGE_DEBOUNCE_SECONDS
    # costs two status writes in all (Admitted, Ready).
    rt.status_written[(NS, "a")] -= 5
    await reconcile_sandbox(rt, NS, "a")
    assert kube.status_writes == writes
    # Later, the same change is written.
    rt.status_written[(NS, "a")] -= 6
    await reconcile_sandbox(rt, NS, "a")
    assert kube.status_writes == writes + 1
    assert "ContainerCreating" in cond(kube, "a", "Ready")["message"]
    # A new reason (Ready) never waits.
    driver.pods["a"]["phase"] = ObservedPhase.READY
    await reconcile_sandbox(rt, NS, "a")
    assert cond(kube, "a", "Ready")["reason"] == "Ready"
    # No Event on the way: admitted, created and Ready are in the conditions (an Event each
    # would be one more write per Sandbox).
    assert [e for e in kube.events if e[0] == "a"] == []


class WatchedFake(FakeDriver):
    """A driver whose disposal the operator watches (like the runtime-class driver)."""

    watches_disposal = True

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.deletes: list[str] = []

    async def request_disposal(self, sandbox, *, requested=False):
        pod = self.pods.get(sandbox.name)
        if pod is None:
            return []
        if not requested:
            self.deletes.append(sandbox.name)
        return [BackendObject("Pod", sandbox.name, NS, sandbox.name, pod["owner"], deleting=True)]

    async def request_conversation_disposal(self, ns, scope, thread_id):
        pass


async def test_a_purged_sandbox_waits_for_the_collection_delete_and_asks_again_only_after():
    rt, kube, driver = await served_by(WatchedFake("gvisor"))
    rt.purging.add((NS, "a"))  # its scope's purge deleted its objects by collection
    writes = kube.status_writes
    assert await finalize_sandbox(rt, NS, "a") is not None  # waits for the deletion event
    assert driver.deletes == [] and kube.status_writes == writes  # no call of its own
    # Past the disposal timeout: asked for one by one, and DisposalFailed (retried later).
    rt.disposal_started[(NS, "a")] -= 3600
    await finalize_sandbox(rt, NS, "a")
    assert driver.deletes == ["a"]
    assert cond(kube, "a", "Disposed")["reason"] == "DisposalFailed"
    del driver.pods["a"]  # the pod's deletion event
    await finalize_sandbox(rt, NS, "a")
    assert ("sandboxes", "a") not in kube.objs


async def test_an_ordinary_disposal_writes_no_status_and_a_slow_one_says_disposing():
    """A pod's termination grace (5 s by default) plus the kubelet's teardown is an ordinary
    disposal: the finalizer's removal is its only write. Past DISPOSING_REPORT_AFTER_SECONDS the
    status says Disposing."""
    from sandbox_operator.reconcile.disposal import DISPOSING_REPORT_AFTER_SECONDS

    rt, kube, driver = await served_by(WatchedFake("gvisor"))
    kube.objs[("sandboxes", "a")]["metadata"]["deletionTimestamp"] = "2099-01-01T00:00:00Z"
    writes = kube.status_writes
    await finalize_sandbox(rt, NS, "a")
    assert driver.deletes == ["a"]
    rt.disposal_started[(NS, "a")] -= 7  # the pod is still terminating 7 s later
    await finalize_sandbox(rt, NS, "a")
    assert kube.status_writes == writes
    rt.disposal_started[(NS, "a")] -= DISPOSING_REPORT_AFTER_SECONDS
    await finalize_sandbox(rt, NS, "a")
    assert cond(kube, "a", "Ready")["reason"] == "Disposing"
    del driver.pods["a"]  # the pod's deletion event
    await finalize_sandbox(rt, NS, "a")
    assert ("sandboxes", "a") not in kube.objs


class GoneWithTheAnswer(WatchedFake):
    """A watched driver whose deletes are answered as done (a pod deleted with no grace period
    is gone from the API server with the answer, as the runtime-class driver's is)."""

    async def request_disposal(self, sandbox, *, requested=False):
        if sandbox.name in self.pods and not requested:
            self.deletes.append(sandbox.name)
            del self.pods[sandbox.name]
        return []


async def test_a_deletion_answered_as_done_releases_the_sandbox_in_the_same_pass():
    """(#36 item 3) Nothing the API server answered as gone is waited for: one pass deletes the
    pod and removes the finalizer (no status write, no Event, no second pass), and the time it
    took is observed in sandbox_operator_deletion_to_release_seconds."""
    from prometheus_client import REGISTRY

    def released() -> float:
        value = REGISTRY.get_sample_value(
            "sandbox_operator_deletion_to_release_seconds_count", {"backend": "gvisor"}
        )
        return value or 0.0

    rt, kube, driver = await served_by(GoneWithTheAnswer("gvisor"))
    kube.objs[("sandboxes", "a")]["metadata"]["deletionTimestamp"] = "2099-01-01T00:00:00Z"
    writes, events, before = kube.status_writes, list(kube.events), released()
    assert await finalize_sandbox(rt, NS, "a") is None
    assert driver.deletes == ["a"]
    assert ("sandboxes", "a") not in kube.objs  # let go
    assert kube.status_writes == writes and kube.events == events
    assert released() == before + 1
    assert (NS, "a") not in rt.deletion_seen
    # Out of the views with the answer: a pass queued meanwhile (the pod's deletion event) finds
    # nothing to release again (a patch answered 404 per Sandbox).
    assert rt.views.sandboxes.get(NS, "a") is None


async def test_a_disposed_sandbox_the_egress_proxy_admitted_waits_for_its_final_write():
    """(#25 item 8) Once its pod is gone, a Sandbox the proxy admitted keeps its finalizer until
    status.egress.final is there (its watch event brings the pass), at most
    EGRESS_FINAL_WAIT_SECONDS; one the proxy never admitted goes at once."""
    from sandbox_operator.reconcile.disposal import EGRESS_FINAL_WAIT_SECONDS

    rt, kube, driver = await served_by(WatchedFake("gvisor"))
    admit(kube, "a")
    await finalize_sandbox(rt, NS, "a")
    assert driver.deletes == ["a"]
    del driver.pods["a"]  # the pod's deletion event
    writes = kube.status_writes
    hold = await finalize_sandbox(rt, NS, "a")
    assert ("sandboxes", "a") in kube.objs  # disposed, but held for the proxy's last word
    assert (
        hold is not None and EGRESS_FINAL_WAIT_SECONDS - 1 < hold <= EGRESS_FINAL_WAIT_SECONDS + 1
    )
    assert kube.status_writes == writes  # holding writes nothing
    await finalize_sandbox(rt, NS, "a")  # another event, not the final write: still held
    assert ("sandboxes", "a") in kube.objs
    kube.objs[("sandboxes", "a")]["status"]["egress"]["final"] = True  # the proxy's write
    await finalize_sandbox(rt, NS, "a")
    assert ("sandboxes", "a") not in kube.objs and (NS, "a") not in rt.egress_final_started

    # A proxy that never writes it: the Sandbox goes at the deadline.
    kube.add("sandboxes", "b", {**SPEC, "agentDir": "agents/b"})
    await reconcile_sandbox(rt, NS, "b")
    admit(kube, "b")
    await finalize_sandbox(rt, NS, "b")
    del driver.pods["b"]
    await finalize_sandbox(rt, NS, "b")
    assert ("sandboxes", "b") in kube.objs
    rt.egress_final_started[(NS, "b")] -= EGRESS_FINAL_WAIT_SECONDS
    await finalize_sandbox(rt, NS, "b")
    assert ("sandboxes", "b") not in kube.objs

    # Never admitted by a proxy (no status.egress.admitted): no wait at all.
    kube.add("sandboxes", "c", {**SPEC, "agentDir": "agents/c"})
    await reconcile_sandbox(rt, NS, "c")
    admit(kube, "c", None)
    await finalize_sandbox(rt, NS, "c")
    del driver.pods["c"]
    await finalize_sandbox(rt, NS, "c")
    assert ("sandboxes", "c") not in kube.objs


def count_api_calls(kube: FakeKube) -> dict[str, int]:
    """Wrap the fake API server's calls on this instance; the answer counts them by name."""
    calls: dict[str, int] = {}
    for name in ("get_sandbox", "get_scope", "get_pod", "list_sandboxes", "patch_status",
                 "patch_metadata", "delete_sandbox", "delete_sandboxes"):  # fmt: skip
        original = getattr(kube, name)

        async def counted(*args: Any, _name: str = name, _fn: Any = original, **kw: Any) -> Any:
            calls[_name] = calls.get(_name, 0) + 1
            return await _fn(*args, **kw)

        setattr(kube, name, counted)
    return calls


async def test_a_sandbox_gone_behind_the_views_is_dropped_at_its_first_404(world):
    """(#28 item 5) Sandboxes deleted while the operator saw no events (a restart, a watch that
    lags) are still in the views; the first pass that meets a 404 drops them and forgets them,
    so a resync (or a scope event) never passes over them again. Before, every such pass cost a
    GET of the scope and a PATCH, both answered 404, for ever."""
    rt, kube, driver = world
    kube.add("sandboxes", "never-scoped", {**SPEC, "scopeRef": "gone-scope"})
    kube.add("sandboxes", "fresh", SPEC)
    kube.add("sandboxes", "served", {**SPEC, "agentDir": "agents/served"})
    await reconcile_sandbox(rt, NS, "served")
    assert "served" in driver.pods
    await kube.delete_sandbox(NS, "served")  # held by the finalizer: deletionTimestamp set
    sync(rt, kube)
    for name in ("never-scoped", "fresh", "served"):  # gone; no DELETED event seen
        del kube.objs[("sandboxes", name)]
    calls = count_api_calls(kube)
    for name in ("never-scoped", "fresh", "served"):
        assert await sandbox_reconciler.reconcile_sandbox(rt, NS, name) is None
        assert rt.views.sandboxes.get(NS, name) is None, name
    met = sum(calls.values())
    # Each met its 404 once: the one never scoped at its refusal's status write, the others at
    # the metadata patch an admitted Sandbox makes before anything is created.
    assert calls.get("patch_metadata") == 2 and calls.get("patch_status") == 1, calls
    for name in ("never-scoped", "fresh", "served"):  # the resync passes over them again
        assert await sandbox_reconciler.reconcile_sandbox(rt, NS, name) is None
    assert sum(calls.values()) == met, calls


def _rules(role: dict[str, Any]) -> dict[str, tuple[list[str], list[str]]]:
    return {r["resources"][0]: (r["resourceNames"], r["verbs"]) for r in role["rules"]}


async def test_a_bound_scope_grants_its_agents_its_sandboxes_by_name_writing_only_what_is_new(
    world,
):
    """(#25 item 2) A SandboxScope listing agentServiceAccounts gets a Role (get/list/watch/use on
    itself, reads of its Sandboxes and connect on their ports by name) and a RoleBinding to those
    ServiceAccounts, owned by the scope; rewritten only when a Sandbox it does not name yet
    appears (a cleanup writes nothing); a scope that binds no agent gets none."""
    rt, kube, _ = world
    scope = kube.objs[("sandboxscopes", "conv")]
    scope["spec"]["agentServiceAccounts"] = ["agent-a"]
    kube.add("sandboxes", "a", SPEC)
    await reconcile_sandbox(rt, NS, "a")
    assert scope_reconciler.access_pending(rt, NS, "conv", "a")  # its pass should run at once
    await reconcile_scope(rt, NS, "conv")
    role, binding = kube.rbac
    assert role["kind"] == "Role" and binding["kind"] == "RoleBinding"
    assert role["metadata"]["name"] == binding["metadata"]["name"] == "sandbox-conversation-conv"
    assert _rules(role) == {
        "sandboxscopes": (["conv"], ["get", "list", "watch", "use"]),
        "sandboxes": (["a"], ["get", "list", "watch"]),
        "sandboxes/ports": (["a"], ["connect"]),  # the ports router's question (docs/ports.md)
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "agent-a", "namespace": NS}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    for obj in (role, binding):
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("SandboxScope", scope["metadata"]["uid"])
    assert not scope_reconciler.access_pending(rt, NS, "conv", "a")
    await reconcile_scope(rt, NS, "conv")
    assert len(kube.rbac) == 2  # nothing new: nothing written
    kube.add("sandboxes", "b", {**SPEC, "agentDir": "agents/b"})
    await reconcile_sandbox(rt, NS, "b")
    assert scope_reconciler.access_pending(rt, NS, "conv", "b")
    await reconcile_scope(rt, NS, "conv")
    assert _rules(kube.rbac[-2])["sandboxes"][0] == ["a", "b"]
    del kube.objs[("sandboxes", "a")]
    await reconcile_scope(rt, NS, "conv")
    assert len(kube.rbac) == 4  # a Sandbox gone costs no write
    scope["spec"]["agentServiceAccounts"] = ["agent-a", "agent-b"]
    await reconcile_scope(rt, NS, "conv")
    assert [s["name"] for s in kube.rbac[-1]["subjects"]] == ["agent-a", "agent-b"]
    assert _rules(kube.rbac[-2])["sandboxes"][0] == ["b"]  # written anew: exactly the members
    kube.add("sandboxscopes", "other", {"scope": "s", "threadId": "other"})
    kube.add("sandboxes", "c", {**SPEC, "scopeRef": "other", "agentDir": "agents/c"})
    await reconcile_sandbox(rt, NS, "c")
    assert not scope_reconciler.access_pending(rt, NS, "other", "c")
    await reconcile_scope(rt, NS, "other")
    assert len(kube.rbac) == 6  # a scope without agents: no Role


async def test_a_refused_grant_is_a_warning_event_and_retried(world):
    rt, kube, _ = world
    kube.objs[("sandboxscopes", "conv")]["spec"]["agentServiceAccounts"] = ["agent-a"]
    kube.rbac_refused = True
    retry = await reconcile_scope(rt, NS, "conv")
    assert retry == rt.config.operator.disposal_retry_seconds
    assert ("conv", "Warning", "AccessNotGranted") in kube.events
    ready = cond(kube, "conv", "Ready", "sandboxscopes")
    assert (ready["status"], ready["reason"]) == ("False", "AccessNotGranted")
    assert "sandbox-conversation-conv" in ready["message"]
    kube.rbac_refused = False
    assert await reconcile_scope(rt, NS, "conv") is None
    assert cond(kube, "conv", "Ready", "sandboxscopes")["status"] == "True"
    assert [o["kind"] for o in kube.rbac] == ["Role", "RoleBinding"]


def test_access_names_fit_the_api_server() -> None:
    from sandbox_operator.reconcile import access

    assert access.access_name("conv") == "sandbox-conversation-conv"
    long = access.access_name("a" * 253)
    assert len(long) <= 253 and long != access.access_name("a" * 252 + "b")


async def test_the_heap_is_trimmed_once_after_work_and_never_while_idle(monkeypatch):
    """Memory a burst used goes back to the system within seconds of its end (one trim after
    passes ran and none is queued or running), and an idle operator spends nothing on trims."""
    import asyncio
    from types import SimpleNamespace

    from sandbox_operator.reconcile import handlers
    from sandbox_operator.reconcile.workqueue import WorkQueue

    trims: list[int] = []
    monkeypatch.setattr(handlers, "TRIM_SECONDS", 0.01)
    monkeypatch.setattr(handlers, "_trim_memory", lambda: trims.append(queue.passes))
    release = asyncio.Event()

    async def one_pass(key: str) -> None:
        await release.wait()

    queue: WorkQueue[str] = WorkQueue(one_pass, workers=1, name="t")
    rt = SimpleNamespace(sandbox_queue=queue)
    queue.start()
    task = asyncio.create_task(handlers._trim_when_quiet(rt))  # type: ignore[arg-type]
    try:
        await asyncio.sleep(0.1)
        assert trims == []  # idle from the start: nothing to give back
        queue.add("a")
        await asyncio.sleep(0.1)
        assert trims == []  # a pass is running
        release.set()
        await asyncio.sleep(0.1)
        assert trims == [1]  # once, after it
        await asyncio.sleep(0.1)
        assert trims == [1]
    finally:
        task.cancel()
        await queue.stop()
