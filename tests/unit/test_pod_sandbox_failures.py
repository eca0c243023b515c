"""The kubelet's FailedCreatePodSandBox events, from the operator's watch: what is kept per pod,
and a runtime-class driver that reads it instead of listing a starting pod's Events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sandbox_operator import naming
from sandbox_operator.backends.base import ObservedPhase, SandboxRef
from sandbox_operator.backends.runtimeclass import build_pod
from sandbox_operator.backends.runtimeclass.pod_sandbox_failures import PodSandboxFailures
from sandbox_operator.reconcile.views import Views
from sandbox_operator.views import EventView
from tests.fixtures.runtimeclass import NAME, NS, UID, FakeApi, driver, request

CONTAINERD = (
    "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox "
    'runtime: no runtime for "kata" is configured'
)


def event(pod: str, uid: str, message: str = CONTAINERD, **extra: Any) -> EventView:
    return EventView(
        {
            "metadata": {"name": f"{pod}.1", "namespace": NS},
            "involvedObject": {"kind": "Pod", "name": pod, "namespace": NS, "uid": uid},
            "reason": "FailedCreatePodSandBox",
            "message": message,
            **extra,
        }
    )


def test_a_missing_handler_is_kept_by_pod_uid_and_reported_once() -> None:
    failures = PodSandboxFailures(limit=2)
    assert failures.record(event("p1", "u1")) == (NS, "p1")
    assert failures.missing_handler("u1") == "kata"
    assert failures.record(event("p1", "u1")) is None  # a repeat (count + 1): nothing new
    # Other sandbox failures (CNI, a slow runtime) are not a missing handler.
    assert failures.record(event("p2", "u2", "failed to setup network: timed out")) is None
    assert failures.missing_handler("u2") is None
    assert failures.record(event("p3", "", CONTAINERD)) is None  # no uid: nothing to key on
    assert (
        failures.record(
            EventView({**event("n", "u4"), "involvedObject": {"kind": "Node", "uid": "u4"}})
        )
        is None
    )
    # Bounded: the oldest pods are let go first.
    failures.record(event("p5", "u5"))
    failures.record(event("p6", "u6"))
    assert failures.missing_handler("u1") is None
    assert failures.missing_handler("u6") == "kata"


def _starting_pod() -> dict[str, Any]:
    pod = build_pod(request(storage=None), backend_config())
    created = (datetime.now(UTC) - timedelta(seconds=30)).isoformat().replace("+00:00", "Z")
    pod["metadata"].update(uid="pod-uid", creationTimestamp=created)
    pod["metadata"]["ownerReferences"] = [{"kind": "Sandbox", "name": NAME, "uid": UID}]
    pod["spec"]["nodeName"] = "n1"
    pod["status"] = {
        "phase": "Pending",
        "containerStatuses": [
            {"name": "sandbox", "state": {"waiting": {"reason": "ContainerCreating"}}}
        ],
    }
    return pod


def backend_config() -> Any:
    from tests.fixtures.backends import gvisor_backend

    return gvisor_backend()


async def test_the_driver_reads_the_watch_and_never_lists_a_pods_events() -> None:
    """(#26 item 2) A pod bound 30 s ago whose containers do not exist yet: with the operator's
    watch, the driver asks it (no Event list: FakeApi has no list of events, and records every
    call), reports Starting with no recheck timer while the watch says nothing, and
    RuntimeHandlerMissing once it does."""
    fake, views = FakeApi(), Views()
    d = driver(fake, views=views)
    failures = PodSandboxFailures()
    d.use_pod_sandbox_failures(failures)
    pod = _starting_pod()
    views.pods.upsert(pod)
    ref = SandboxRef(NS, NAME, UID)
    seen = await d.observe(ref)
    assert seen.phase is ObservedPhase.STARTING and seen.recheck_at is None, seen
    assert failures.record(event(naming.pod_name(NAME), "pod-uid")) == (
        NS,
        naming.pod_name(NAME),
    )
    seen = await d.observe(ref)
    assert seen.phase is ObservedPhase.STARTUP_FAILED
    assert seen.detail_reason == "RuntimeHandlerMissing", seen
    assert "no handler 'kata'" in seen.message, seen
    assert not [c for c in fake.calls if "vent" in c[1]], fake.calls
