"""The driver protocol every backend implements for the operator.

The operator decides *whether* a sandbox may run and *where* (that is policy); a driver only makes
the backend's objects exist, reports what it sees, and takes them away again. Drivers hold no state
the operator's correctness depends on: everything they need is derived from the request (names are
deterministic, objects carry key labels), so any replica, or a restarted one, can call any method
for any sandbox.

Nothing in this module is specific to pods: a runtime-class driver creates pods and
NetworkPolicies, a remote driver creates sessions in a hosted service.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol, TypeGuard, TypeVar, runtime_checkable

from sandbox_operator.contract import (
    DisposalCode,
    DisposalFailure,
    IsolationScope,
    SandboxKey,
    SandboxSpec,
)
from sandbox_operator.contract.resources import ServedBy
from sandbox_operator.views import ObjectView

__all__ = ["ServedBy"]  # the contract's, re-exported: drivers return it (one ServedBy)

#: The view a watched kind's objects are handed out as.
V = TypeVar("V", bound=ObjectView)


class ObservedPhase(StrEnum):
    """What a driver sees of one sandbox's backend objects."""

    ABSENT = "Absent"  # nothing exists (never created, or already disposed)
    STARTING = "Starting"  # created, not ready yet, nothing has failed so far
    READY = "Ready"  # usable: the workload can be exec'd into
    STARTUP_FAILED = "StartupFailed"  # cannot become ready (image missing, crashed while starting)
    FAILED = "Failed"  # was running and stopped (the operator tells "before" from "after ready")
    DISPOSING = "Disposing"  # deletion requested, objects still present
    SUSPENDED = "Suspended"  # compute stopped (or stopping), storage kept: a remote "Stopped"


@dataclass(frozen=True)
class SandboxRef:
    """Which sandbox a call is about: enough for any replica to find its objects."""

    namespace: str
    name: str  # the Sandbox resource's name
    uid: str = ""  # the Sandbox resource's uid (owner of what the driver creates), if known
    # What the Sandbox's status recorded as serving it (``status.servedBy``), if anything. Lets
    # dispose tell "gone" from "no longer found where it should be listed" (``unlisted``).
    served_by: ServedBy | None = None
    # When the namespace's egress proxy admitted the sandbox (``status.egress.admitted``, written
    # by the proxy), if it has. A driver that runs the proxy reports the sandbox usable only then.
    egress_admitted: datetime | None = None


@dataclass(frozen=True)
class PoolRef:
    """A SandboxWarmPool, as the owner of the pods it keeps (and of the namespace's egress proxy
    while its allowlist pods wait to be claimed)."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class EnsureRequest:
    """Everything a driver needs to create (or find) the objects that serve a sandbox."""

    sandbox: SandboxRef
    key: SandboxKey
    spec: SandboxSpec
    isolation_scope: IsolationScope
    labels: Mapping[str, str]
    annotations: Mapping[str, str]


@dataclass(frozen=True)
class Observation:
    phase: ObservedPhase
    served_by: ServedBy | None = None
    detail_reason: str = ""  # the backend's own word, e.g. "ImagePullBackOff"
    message: str = ""  # for people; never carries credentials or endpoints
    created_at: datetime | None = None  # when the serving object was created (startup clock)
    ready_at: datetime | None = None
    # READY objects that are not usable yet (e.g. the egress proxy has not admitted the sandbox):
    # what is still awaited. The operator keeps a sandbox that was never Ready starting (bounded
    # by the startup timeout); one that was Ready stays Ready.
    pending: str = ""
    # When the driver wants another look even if nothing changes in the watched objects (e.g. a
    # pod waiting for its pod sandbox, whose kubelet events are read only after a while). The
    # operator schedules a pass then; None: the watches (and deadlines) suffice.
    recheck_at: datetime | None = None
    # Where the serving object came from (``status.servedFrom``): "cold" (made for this sandbox)
    # or "SandboxWarmPool/<name>" (claimed from a warm pool). None: the driver does not say
    # (then "cold" is reported once something serves it).
    served_from: str | None = None


@dataclass(frozen=True)
class BackendObject:
    """One object found by a label listing (for scope purges and key-cleanliness checks)."""

    kind: str
    name: str
    namespace: str
    sandbox_name: str = ""  # value of the sandbox label, if present
    owner_uid: str = ""  # uid of the Sandbox that owns it, if recorded
    deleting: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str = ""  # why not, for the BackendUnavailable refusal message


class StartupError(Exception):
    """The backend refused to create the sandbox's objects (e.g. the API server rejected the pod).

    ``reason`` is a condition reason the operator writes as is (normally ``StartupFailed``).
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class TransientError(Exception):
    """Creating the sandbox's objects failed in a way a later attempt may not (a 5xx, a 429, the
    service unreachable). The operator keeps the Sandbox ``Creating`` with ``message`` and retries
    with backoff until the startup deadline. ``message`` says what failed (operation, status,
    service code) and never carries an endpoint or a credential; ``retry_after`` is the service's
    hint in seconds, if it gave one.
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class DisposalError(Exception):
    """Disposal did not land; ``failure`` says how (code, detail, backend)."""

    def __init__(self, failure: DisposalFailure) -> None:
        super().__init__(f"{failure.backend}: {failure.code}: {failure.detail}")
        self.failure = failure

    @property
    def code(self) -> DisposalCode:
        return self.failure.code


@runtime_checkable
class BackendDriver(Protocol):
    """An asynchronous backend driver. Every method is idempotent."""

    @property
    def name(self) -> str:
        """The backend's configured name."""
        ...

    async def check_available(self) -> Availability:
        """Probe at start (and periodically) whether the backend can serve at all."""
        ...

    async def ensure(self, request: EnsureRequest) -> ServedBy:
        """Create the objects that serve the sandbox, or find the ones already there.

        Raises :class:`StartupError` when the backend refuses them outright (permanent),
        :class:`TransientError` when a later attempt may succeed. Any other exception is treated
        as transient too, reported by its type name only.
        """
        ...

    async def observe(self, sandbox: SandboxRef) -> Observation:
        """Report what exists for the sandbox and how far it got."""
        ...

    async def dispose(self, sandbox: SandboxRef) -> None:
        """Remove everything that serves the sandbox and wait until it is gone.

        Nothing left is success. Raises :class:`DisposalError` when disposal does not land.
        ``sandbox.served_by`` (what the status recorded) is removed too even when a label listing
        no longer shows it; when that cannot be done the code is ``unlisted``.
        """
        ...

    async def list_by_scope(
        self, namespace: str, scope: str, thread_id: str
    ) -> list[BackendObject]:
        """Everything of one conversation, found by its labels alone."""
        ...

    async def list_by_key(self, namespace: str, key: SandboxKey) -> list[BackendObject]:
        """Everything of one sandbox key, found by its labels alone."""
        ...

    async def dispose_object(self, obj: BackendObject) -> None:
        """Remove one listed object and wait until it is gone (raises :class:`DisposalError`)."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class Suspendable(BackendDriver, Protocol):
    """A driver that can stop a sandbox's compute and start it again on the storage it kept
    (``spec.storage``; ``spec.suspended`` and ``lifetime.idleAction: suspend``).

    What suspension keeps is the backend's to say in its ``persistentStorage`` declaration and
    docs: a runtime-class pod's work volume (a PersistentVolumeClaim), its NetworkPolicy and its
    identity; never processes or memory."""

    @property
    def suspends(self) -> bool: ...

    async def suspend(self, sandbox: SandboxRef) -> list[BackendObject]:
        """Stop the compute that serves the sandbox; keep its storage, NetworkPolicy and
        identity. Returns what is still going away (empty: suspended). Idempotent; raises
        :class:`TransientError` when a later attempt may succeed."""
        ...

    async def resume(self, request: EnsureRequest) -> ServedBy:
        """Start the compute again on the kept storage. Raises :class:`StartupError` or
        :class:`TransientError` as :meth:`BackendDriver.ensure` does."""
        ...


def suspends(driver: object) -> TypeGuard[Suspendable]:
    """Whether ``driver`` can suspend and resume sandboxes."""
    return isinstance(driver, Suspendable) and driver.suspends


@runtime_checkable
class Resettable(BackendDriver, Protocol):
    """A driver that can replace the compute serving a sandbox by a never-used one
    (``spec.resets``): the old one is deleted with all it ran, and the operator claims or
    creates the new one as for a new Sandbox. A driver without it leaves ``spec.resets``
    refused (``status.resetRefused``)."""

    @property
    def resets(self) -> bool: ...

    async def retire(self, sandbox: SandboxRef) -> list[BackendObject]:
        """Delete the compute serving the sandbox as a disposal would (nothing of it is kept);
        keep what the next one needs (its NetworkPolicy, identity). Returns what is still there
        in the replacement's way (empty: what replaces it may be made now; what still stops in
        the background shares nothing with it). Raises :class:`TransientError` when a later
        attempt may succeed."""
        ...


def resets(driver: object) -> TypeGuard[Resettable]:
    """Whether ``driver`` can reset sandboxes."""
    return isinstance(driver, Resettable) and driver.resets


@runtime_checkable
class EgressEditable(Protocol):
    """A driver whose egress hop enforces what a Sandbox's status admits and follows it while
    the sandbox runs, so an egress edit (``spec.egressAllow``, ``spec.egressRules``) the operator
    accepts reaches it without a new pod. A driver without it leaves such an edit refused
    (``status.egressEditRefused``), its sandboxes keeping the egress they started with."""

    @property
    def follows_egress_edits(self) -> bool: ...


def follows_egress_edits(driver: object) -> bool:
    """Whether ``driver`` enforces egress edits on live sandboxes."""
    return isinstance(driver, EgressEditable) and driver.follows_egress_edits


@runtime_checkable
class WatchedDisposal(Protocol):
    """A driver whose objects the operator watches: disposal is requested without waiting,
    and the watch event of each deletion brings the operator back to confirm it landed (a
    runtime-class driver given the operator's views). Other drivers dispose by ``dispose``."""

    @property
    def watches_disposal(self) -> bool: ...

    async def request_disposal(
        self, sandbox: SandboxRef, *, requested: bool = False
    ) -> list[BackendObject]:
        """Request deletion of what serves the sandbox (unless ``requested`` already, by a
        collection delete); return what still exists."""
        ...

    async def request_conversation_disposal(
        self, namespace: str, scope: str, thread_id: str
    ) -> None:
        """Request deletion of every object of one conversation, in a bounded number of calls."""
        ...


class WatchedObjects(Protocol[V]):
    """One kind of object as the operator's watch holds it (``reconcile.views.Store``), handed to
    a driver (``use_views``), each object a view (``PodView``, ``ObjectView``) over a fresh copy.
    Declared here so backends/ depend on the shape they use, not on the reconciler that owns the
    watch (AGENTS.md, "Import rules")."""

    def __iter__(self) -> Iterator[V]: ...

    def get(self, namespace: str, name: str) -> V | None: ...

    def upsert(self, obj: Mapping[str, Any]) -> V: ...

    def remove(self, namespace: str, name: str, uid: str | None = None) -> None: ...

    def select(self, namespace: str, label: str, value: str) -> list[V]: ...

    def select_names(self, namespace: str, label: str, value: str) -> list[str]: ...


class DriverSettings(Protocol):
    """The operator settings a driver reads (``config.OperatorSettings`` is one): a protocol, so
    backends/ do not import the operator's configuration, which imports them."""

    @property
    def dispose_timeout_seconds(self) -> float: ...
