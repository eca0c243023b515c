"""What the router knows of Sandboxes and their pods: an in-memory view fed by watches, never by a
read per request.

Its own module because a request's fate is decided from it alone (no such Sandbox, no such
port, suspended, starting, or the pod's address) and waiters are woken from it when a watch event
changes a Sandbox. Only what routing needs is kept of each object, so memory stays flat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from sandbox_operator import kubeobj
from sandbox_operator import labels as lbl
from sandbox_operator.contract import SANDBOX_KIND, ConditionReason, ConditionStatus, ConditionType
from sandbox_operator.contract.ports import SandboxPort
from sandbox_operator.views import ConditionView, ObjectView, PodView, SandboxView

Key = tuple[str, str]


class State(Enum):
    READY = "ready"
    SUSPENDED = "suspended"
    STARTING = "starting"
    REFUSED = "refused"  # a resume admission refused: Admitted=False while suspended
    ENDED = "ended"  # Failed, Expired, disposed: nothing will serve it again


@dataclass(frozen=True)
class SandboxEntry:
    """What routing needs of one Sandbox."""

    uid: str
    ports: tuple[SandboxPort, ...]
    state: State
    #: The Ready (or, refused, the Admitted) condition's reason and message.
    reason: str
    message: str
    suspended_by: str | None
    #: ``status.suspendedAt`` (parsed once per object version).
    suspended_at: datetime | None
    spec_suspended: bool
    pod: str | None

    def port(self, named: str) -> SandboxPort | None:
        """The declared port the path names (by name, or by number)."""
        for p in self.ports:
            if p.name == named or str(p.port) == named:
                return p
        return None


@dataclass(frozen=True)
class PodEntry:
    ip: str | None
    ready: bool
    sandbox: str | None
    owner_uid: str | None


_ENDED_REASONS = frozenset(
    {ConditionReason.FAILED, ConditionReason.EXPIRED, ConditionReason.DISPOSED}
)
_NO_CONDITION = ConditionView(None)


def sandbox_entry(obj: SandboxView) -> SandboxEntry:
    status = obj.status
    ports: list[SandboxPort] = []
    for raw in obj.ports:
        try:
            ports.append(SandboxPort.model_validate(raw))
        except ValueError:
            continue  # the CRD validated it; an unreadable one is never routed to
    ready = status.conditions.find(ConditionType.READY) or _NO_CONDITION
    admitted = status.conditions.find(ConditionType.ADMITTED) or _NO_CONDITION
    reason = ready.reason
    suspended = bool(status.suspended_by) or reason == ConditionReason.SUSPENDED
    if ready.is_true:
        state = State.READY
    elif suspended and admitted.status == ConditionStatus.FALSE:
        state = State.REFUSED
        reason = admitted.reason or reason
    elif suspended or obj.suspended:
        state = State.SUSPENDED
    elif reason in _ENDED_REASONS or obj.metadata.deleting:
        state = State.ENDED
    else:
        state = State.STARTING
    served = status.served_by
    message = ready.message if state is not State.REFUSED else admitted.message
    return SandboxEntry(
        uid=obj.metadata.uid,
        ports=tuple(ports),
        state=state,
        reason=reason,
        message=message,
        suspended_by=status.suspended_by or None,
        suspended_at=status.suspended_at,
        spec_suspended=obj.suspended,
        pod=served.name or None if served.kind == kubeobj.POD_KIND else None,
    )


def pod_entry(obj: PodView) -> PodEntry:
    meta = obj.metadata
    status = obj.status
    owners = [o for o in meta.owner_references if o.kind == SANDBOX_KIND]
    return PodEntry(
        ip=status.pod_ip or None,
        ready=status.conditions.is_true("Ready") and status.phase == "Running",
        sandbox=meta.labels.get(lbl.SANDBOX_LABEL),
        owner_uid=owners[0].uid if owners else None,
    )


class View:
    """Sandboxes and sandbox pods by (namespace, name), as the watches last said."""

    def __init__(self) -> None:
        self._sandboxes: dict[Key, SandboxEntry] = {}
        self._pods: dict[Key, PodEntry] = {}
        self._changed: dict[Key, asyncio.Event] = {}

    def apply_sandbox(self, event: str, obj: SandboxView) -> None:
        key = _key(obj)
        if event == "DELETED":
            self._sandboxes.pop(key, None)
        else:
            self._sandboxes[key] = sandbox_entry(obj)
        self._notify(key)

    def apply_pod(self, event: str, obj: PodView) -> None:
        key = _key(obj)
        if event == "DELETED":
            entry = self._pods.pop(key, None)
        else:
            entry = self._pods[key] = pod_entry(obj)
        if entry is not None and entry.sandbox:
            self._notify((key[0], entry.sandbox))

    def replace_sandboxes(self, namespace: str | None, objs: Iterable[SandboxView]) -> None:
        """A fresh list (a watch restarted): the namespace's Sandboxes (all, for None) are
        these and no others."""
        fresh = {_key(o): sandbox_entry(o) for o in objs}
        stale = [k for k in self._sandboxes if namespace in (None, k[0]) and k not in fresh]
        for key in stale:
            del self._sandboxes[key]
        self._sandboxes.update(fresh)
        for key in (*stale, *fresh):
            self._notify(key)

    def replace_pods(self, namespace: str | None, objs: Iterable[PodView]) -> None:
        """As :meth:`replace_sandboxes`, for the sandbox pods."""
        fresh = {_key(o): pod_entry(o) for o in objs}
        for key in [k for k in self._pods if namespace in (None, k[0]) and k not in fresh]:
            del self._pods[key]
        self._pods.update(fresh)
        for (ns, _), entry in fresh.items():
            if entry.sandbox:
                self._notify((ns, entry.sandbox))

    def sandbox(self, namespace: str, name: str) -> SandboxEntry | None:
        return self._sandboxes.get((namespace, name))

    def address(self, namespace: str, name: str) -> str | None:
        """The address of the pod serving a Ready Sandbox: only a pod the Sandbox's status names,
        labelled for it and owned by it (labels alone prove nothing), Running and Ready."""
        entry = self._sandboxes.get((namespace, name))
        if entry is None or entry.state is not State.READY or entry.pod is None:
            return None
        pod = self._pods.get((namespace, entry.pod))
        if pod is None or not pod.ready or pod.sandbox != name or pod.owner_uid != entry.uid:
            return None
        return pod.ip

    async def changed(self, namespace: str, name: str) -> None:
        """Return at the next event that touches this Sandbox or its pod."""
        key = (namespace, name)
        event = self._changed.get(key)
        if event is None:
            event = self._changed[key] = asyncio.Event()
        await event.wait()

    def poke(self, namespace: str, name: str) -> None:
        """Wake this Sandbox's waiters to look again (something beside the watches changed)."""
        self._notify((namespace, name))

    def _notify(self, key: Key) -> None:
        event = self._changed.pop(key, None)
        if event is not None:
            event.set()


def _key(obj: ObjectView) -> Key:
    return obj.key
