"""What the API's objects say about a runtime-class sandbox, as pure functions over their JSON:
a pod's phase (:func:`classify_pod`), a node lacking the runtime handler, a work volume that is
not the sandbox's own, and any owned object as a :class:`BackendObject`."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime

from sandbox_operator import labels as lbl
from sandbox_operator.backends.base import (
    BackendObject,
    Observation,
    ObservedPhase,
    ServedBy,
)
from sandbox_operator.backends.runtimeclass.pods import CONTAINER_NAME
from sandbox_operator.contract import SANDBOX_KIND
from sandbox_operator.views import (
    ContainerStatusView,
    EventView,
    ObjectView,
    PodStatusView,
    PodView,
    WaitingStateView,
)

#: Waiting reasons that mean the container will not start without someone changing something.
FATAL_WAITING_REASONS = frozenset(
    {
        "ErrImageNeverPull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImagePull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "StartError",
        "CrashLoopBackOff",
    }
)

PULL_REASONS = frozenset({"ErrImageNeverPull", "ImagePullBackOff", "ErrImagePull"})

#: Why a ready pod under a managed egress proxy is not usable yet (Ready stays False with it).
EGRESS_PENDING = "waiting for the egress proxy to admit the sandbox"

#: What container runtimes answer (in the kubelet's FailedCreatePodSandBox events) when the node
#: has no handler for a RuntimeClass: containerd, then CRI-O. The kubelet retries such a pod
#: forever, so without reading them the sandbox would only ever end as StartupTimeout.
MISSING_HANDLER_PATTERNS = (
    re.compile(r'no runtime for "([^"]*)" is configured'),
    re.compile(r"failed to find runtime handler (\S+)"),
)
#: How long a pod may wait for its pod sandbox before the kubelet's events are read (the normal
#: path never pays for the list call).
SANDBOX_EVENTS_AFTER_SECONDS = 3.0
#: While a pod still waits for its pod sandbox after that, how often its events are read again.
SANDBOX_EVENTS_EVERY_SECONDS = 5.0
RUNTIME_HANDLER_MISSING = "RuntimeHandlerMissing"


def classify_pod(pod: PodView | None) -> Observation:
    """What a pod's status says about its sandbox (pure; ``pod`` is the API's JSON shape).

    In order: gone, being deleted, ended (the pod's phase), what the sandbox container's state
    says (cannot start, exited, ready), else still starting."""
    if pod is None:
        return Observation(ObservedPhase.ABSENT)
    view = pod
    meta = view.metadata
    served = ServedBy(kind="Pod", name=meta.name, namespace=meta.namespace)
    created = meta.created
    if meta.deleting:
        return Observation(
            ObservedPhase.DISPOSING, served, "Terminating", "pod is being deleted", created
        )
    status = view.status
    phase = status.phase
    statuses = status.container_statuses
    container = next((c for c in statuses if c.name == CONTAINER_NAME), None)
    if phase in ("Failed", "Succeeded"):
        observed = _pod_ended(phase, status, container)
    else:
        observed = _container_verdict(container, status) or _starting(phase, status, container)
    return replace(observed, served_by=served, created_at=created)


def _pod_ended(
    phase: str, status: PodStatusView, container: ContainerStatusView | None
) -> Observation:
    """A pod that ended (``Failed`` or ``Succeeded``): why, in the container's words first."""
    term = container.terminated if container is not None else ContainerStatusView(None).terminated
    why = term.reason or status.reason or phase
    code = term.exit_code
    msg = f"pod {phase.lower()}: {why}" + (f" (exit code {code})" if code is not None else "")
    if status.message:
        msg += f": {status.message}"
    return Observation(ObservedPhase.FAILED, detail_reason=str(why), message=msg)


def _container_verdict(
    container: ContainerStatusView | None, status: PodStatusView
) -> Observation | None:
    """What the sandbox container's state settles (cannot start, exited, ready), or None while
    it settles nothing."""
    if container is None:
        return None
    waiting = container.waiting
    if waiting and container.waiting_reason in FATAL_WAITING_REASONS:
        return _cannot_start(container, waiting)
    terminated = container.terminated
    if terminated:
        reason = terminated.reason or "Terminated"
        msg = f"container exited: {reason} (exit code {terminated.exit_code})"
        return Observation(ObservedPhase.FAILED, detail_reason=reason, message=msg)
    if container.running and container.ready:
        ready = status.conditions.find("Ready")
        return Observation(
            ObservedPhase.READY,
            detail_reason="Running",
            message="pod is running",
            ready_at=None if ready is None else ready.since,
        )
    return None


def _cannot_start(container: ContainerStatusView, waiting: WaitingStateView) -> Observation:
    """A container waiting for a reason that will not pass by itself (FATAL_WAITING_REASONS)."""
    reason = waiting.reason
    msg = f"container cannot start: {reason}"
    if reason in PULL_REASONS:
        # The kubelet's pull message names registry endpoints and resolvers: keep it out.
        msg += f" (image {container.image or 'unknown'} is not available to the node)"
    elif waiting.message:
        msg += f": {waiting.message[:300]}"
    return Observation(ObservedPhase.STARTUP_FAILED, detail_reason=reason, message=msg)


def _starting(
    phase: str, status: PodStatusView, container: ContainerStatusView | None
) -> Observation:
    """Unschedulable or still creating: not (yet) fatal; the startup timeout bounds it."""
    detail = ""
    for cond in status.conditions:
        if cond.type == "PodScheduled" and cond.status == "False":
            detail = f"not scheduled: {cond.reason} {cond.message}".strip()
    if not detail and container is not None and container.waiting:
        detail = container.waiting_reason
    return Observation(
        ObservedPhase.STARTING, detail_reason=detail or phase, message=detail or f"pod is {phase}"
    )


def missing_handler(events: Iterable[EventView]) -> str | None:
    """The runtime handler a node lacks, as its container runtime told the kubelet, if so."""
    for event in events:
        if event.reason != "FailedCreatePodSandBox":
            continue
        for pattern in MISSING_HANDLER_PATTERNS:
            found = pattern.search(event.message)
            if found:
                return found.group(1).strip("\"'")
    return None


def awaits_pod_sandbox(pod: PodView, now: datetime) -> bool:
    """A pod bound to a node for a while whose containers the kubelet has not created yet."""
    view = pod
    if view.status.phase != "Pending" or not view.node_name:
        return False
    waiting = [c.waiting_reason for c in view.status.container_statuses]
    if any(reason not in ("", "ContainerCreating") for reason in waiting):
        return False
    created = view.metadata.created
    return created is not None and (now - created).total_seconds() >= SANDBOX_EVENTS_AFTER_SECONDS


def foreign_claim(claim: ObjectView, uid: str) -> str:
    """Why a sandbox (Sandbox ``uid``) may not start on the work volume ``claim`` found under
    its name, or "": the claim belongs to another Sandbox, or is being deleted."""
    meta = claim.metadata
    name = meta.name
    owners = [o.uid for o in meta.owner_references]
    if uid and uid not in owners:
        return (
            f"PersistentVolumeClaim {name} exists but belongs to another Sandbox (a previous one "
            "with this name that was not disposed yet)"
        )
    if meta.deleting:
        return f"PersistentVolumeClaim {name} is being deleted (a previous sandbox's work volume)"
    return ""


def backend_object(kind: str, obj: ObjectView) -> BackendObject:
    """What disposal and listing know of one of this backend's objects (a view's or an API
    answer's)."""
    meta = obj.metadata
    labels = dict(meta.labels)
    owner = next((o.uid for o in meta.owner_references if o.kind == SANDBOX_KIND), "")
    return BackendObject(
        kind=kind,
        name=meta.name,
        namespace=meta.namespace,
        sandbox_name=labels.get(lbl.SANDBOX_LABEL, ""),
        owner_uid=owner,
        deleting=meta.deleting,
        labels=labels,
    )
