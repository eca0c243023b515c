"""Typed errors of the client: one type per thing a caller branches on.

The whole tree; every class is written out (nothing is generated, nothing is looked up by name)::

    SandboxClientError
    ├── SandboxAcquireError             reason, message, sandbox, namespace
    │   ├── SandboxRefused              refusal_reason, refusal_type (the contract's class)
    │   │   ├── SandboxIsolationBelowFloor
    │   │   ├── SandboxCapabilityNotSupported
    │   │   ├── SandboxOsFamilyNotSupported
    │   │   ├── SandboxTransferLimitsNotPermitted
    │   │   ├── SandboxEgressNotEnforced
    │   │   ├── SandboxIsolationScopeNotEnforced
    │   │   ├── SandboxCallIdRequired
    │   │   ├── SandboxCapabilityDenied
    │   │   ├── SandboxResourcesExceedCeiling
    │   │   ├── SandboxBackendUnavailable
    │   │   ├── SandboxNoBackendCanServe
    │   │   └── SandboxStorageNotSupported
    │   ├── SandboxStartupFailed, SandboxStartupTimeout, SandboxFailed
    │   ├── SandboxKeyUnclean, SandboxScopeNotFound, SandboxScopeConflict
    │   ├── SandboxGone                 Expired, Disposing, Disposed, Purged, ... or deleted
    │   ├── SandboxSuspended
    │   ├── SandboxSpecConflict, SandboxSpecRejected    (the API server's answer to an apply)
    │   └── SandboxNotReadyInTime       (the client's own deadline)
    ├── SandboxNotSuspendable (ValueError), SandboxNotSuspendedInTime (TimeoutError)
    ├── SandboxNotResettable (ValueError)
    ├── SandboxEgressEditRefused (ValueError)    reason, message
    ├── SandboxForbidden (PermissionError), SandboxScopeNotReady
    ├── CapabilityNotRequired (PermissionError), PathRefused (ValueError)
    ├── SandboxFileNotFound (FileNotFoundError)
    ├── TransferCapExceeded, TransferIntegrityError
    ├── ExecSetupError, ExecTimeout (TimeoutError), ExecQueuedTimeout (TimeoutError)
    ├── OutputBudgetExceeded, DataPlaneError (ExecStreamLost, ExecStreamUnsupported)
    ├── SandboxUnclean                  (a handle whose sandbox may run what nobody owns)
    ├── OutputMissing, OutputNotRegular, OutputSizeUnknown
    ├── ArtifactNameInvalid (ValueError), ArtifactNameCollision, SinkRequired (ValueError)
    ├── CallTimeOutputsNotAllowed (ValueError)
    ├── LandingNotConfined, LandingExists (FileExistsError)
    └── HostToolError ...               (client/hosttools/errors.py)

    ExecCancelled (asyncio.CancelledError)   an exec the caller cancelled, and what its kill reached

Which acquire error a Sandbox's condition reason raises is one table, :data:`CONDITION_ERRORS`,
keyed by the contract's :class:`ConditionReason` (None: the Sandbox is still on its way).
:data:`REFUSAL_ERRORS`, :data:`PENDING_REASONS`, :func:`acquire_error_for` and
:func:`refusal_error_for` are read from it, and :func:`check_condition_errors` (run at import)
holds it against the contract: every condition reason has a decision, and every refusal class
names the contract's refusal type for the same :class:`RefusalReason` (``REFUSAL_TYPES``). A
reason added to the contract without a decision here fails at import, not at a caller's acquire.

The root and ``scrub`` live in :mod:`~sandbox_operator.client.errorbase`, the acquire errors and
the table in :mod:`~sandbox_operator.client.acquire_errors` (re-exported here through its
``__all__``, which lists them in the tree's order); this module defines the rest and is where
every name is imported from.

Messages carry the reason and the operator's condition message with anything that looks like an
endpoint or a credential scrubbed; fields, never messages, are what callers branch on. Errors
that only carry fields are dataclasses (``eq=False, repr=False``: compared by identity, shown as
an exception) whose :meth:`SandboxClientError._message` makes the message once, after ``__init__``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sandbox_operator.client.acquire_errors import *  # noqa: F403 (the acquire tree)
from sandbox_operator.client.errorbase import SandboxClientError as SandboxClientError
from sandbox_operator.client.errorbase import scrub as scrub

# --------------------------------------------------------------------------------------------
# Suspend and RBAC


@dataclass(eq=False, repr=False, kw_only=True)
class SandboxEgressEditRefused(SandboxClientError, ValueError):
    """An edit of the Sandbox's egress (``egressAllow``, ``egressRules``) was refused: by the
    API server (``reason`` ``Invalid``: the CRD's rules, the message naming the field, e.g.
    ``spec.egressAllow[1]``) or by the operator (``reason`` from ``status.egressEditRefused``:
    ``EgressNotEnforced``, ``EgressEditNotSupported``). The egress in force before stays so."""

    sandbox: str
    namespace: str
    reason: str
    message: str = ""

    def __post_init__(self) -> None:
        self.message = scrub(self.message)
        super().__post_init__()

    def _message(self) -> str:
        return (
            f"egress edit of sandbox {self.namespace}/{self.sandbox} refused ({self.reason}): "
            f"{self.message}"
        )


@dataclass(eq=False, repr=False, kw_only=True)
class SandboxNotResettable(SandboxClientError, ValueError):
    """The Sandbox cannot be reset: it declares ``spec.storage`` (a reset would have to empty a
    work volume that is meant to be kept), or its backend cannot replace its compute
    (``status.resetRefused``). ``sandbox`` and ``namespace`` name it; the sandbox serves on as
    it was."""

    sandbox: str
    namespace: str
    message: str = ""

    def __post_init__(self) -> None:
        self.message = scrub(self.message) or "it declares spec.storage (its volume is kept)"
        super().__post_init__()

    def _message(self) -> str:
        return f"sandbox {self.namespace}/{self.sandbox} cannot be reset: {self.message}"


@dataclass(eq=False, repr=False, kw_only=True)
class SandboxNotSuspendable(SandboxClientError, ValueError):
    """The Sandbox cannot be suspended: it declares no ``spec.storage``, so suspending would lose
    its work directory (dispose it instead). ``sandbox`` and ``namespace`` name it."""

    sandbox: str
    namespace: str
    message: str = ""

    def __post_init__(self) -> None:
        self.message = scrub(self.message) or "it declares no spec.storage (nothing would be kept)"
        super().__post_init__()

    def _message(self) -> str:
        return f"sandbox {self.namespace}/{self.sandbox} cannot be suspended: {self.message}"


@dataclass(eq=False, repr=False, kw_only=True)
class SandboxNotSuspendedInTime(SandboxClientError, TimeoutError):
    """A ``suspend(wait=True)`` whose deadline passed before the operator reported the Sandbox
    ``Suspended``; ``last_reason`` is the last Ready reason seen. The spec still says suspended:
    the operator suspends it when it gets there."""

    sandbox: str
    namespace: str
    timeout: float
    last_reason: str = ""

    def _message(self) -> str:
        return (
            f"sandbox {self.namespace}/{self.sandbox}: not Suspended within {self.timeout:g}s "
            f"(last reason: {self.last_reason or 'none'})"
        )


@dataclass(eq=False, repr=False, kw_only=True)
class SandboxForbidden(SandboxClientError, PermissionError):
    """The client's identity may not do this in the namespace (RBAC said 403). ``action`` names
    what was attempted, e.g. ``get sandboxscopes``."""

    namespace: str
    action: str

    def _message(self) -> str:
        return f"not allowed to {self.action} in namespace {self.namespace!r}"


@dataclass(eq=False, repr=False, kw_only=True)
class SandboxScopeNotReady(SandboxClientError):
    """A SandboxScope created for bound agents (``create_scope(agent_service_accounts=...)``)
    that the operator did not report Ready: ``reason`` is its Ready reason (``AccessNotGranted``:
    the agents' Role could not be written; ``ScopeConflict``: another SandboxScope holds the
    conversation), ``""`` when ``timeout`` seconds passed first."""

    scope_ref: str
    namespace: str
    reason: str
    message: str = ""
    timeout: float = 0.0

    def __post_init__(self) -> None:
        self.message = scrub(self.message)
        super().__post_init__()

    def _message(self) -> str:
        why = f"{self.reason}: {self.message}" if self.reason else f"not Ready in {self.timeout:g}s"
        return f"SandboxScope {self.namespace}/{self.scope_ref}: {why}"


# --------------------------------------------------------------------------------------------
# Handle errors


@dataclass(eq=False, repr=False, kw_only=True)
class CapabilityNotRequired(SandboxClientError, PermissionError):
    """A ``Sandbox`` method was called whose capability the spec did not require."""

    method: str
    capability: str

    def _message(self) -> str:
        return (
            f"Sandbox.{self.method} needs capability {self.capability!r}, which this sandbox's "
            "spec does not require; add it to spec.requires"
        )


@dataclass(eq=False, repr=False, kw_only=True)
class PathRefused(SandboxClientError, ValueError):
    """A path was refused by confinement. ``rule`` is one of :data:`PATH_RULES`."""

    path: str
    rule: str
    detail: str = ""

    def _message(self) -> str:
        msg = f"path {self.path!r} refused: {self.rule}"
        return msg + (f" ({self.detail})" if self.detail else "")


#: Every confinement rule a ``PathRefused`` may name.
PATH_RULES: tuple[str, ...] = (
    "empty",
    "backslash",
    "nul",
    "control_character",
    "parent_traversal",
    "dot_segment",
    "empty_segment",
    "absolute_outside_work_dir",
    "work_dir_itself",
    "symlinked_work_dir",
    "symlinked_parent",
    "parent_not_directory",
    "symlink_destination",
    "destination_is_directory",
    "not_a_directory",
    "not_a_regular_file",
    "exists",
)


@dataclass(eq=False, repr=False)
class SandboxFileNotFound(SandboxClientError, FileNotFoundError):
    """The path (or one of its parents) does not exist in the sandbox."""

    path: str

    def _message(self) -> str:
        return f"no such file in the sandbox: {self.path!r}"


@dataclass(eq=False, repr=False, kw_only=True)
class TransferCapExceeded(SandboxClientError):
    """A transfer would exceed a cap; nothing was transferred.

    ``direction`` is ``filesIn`` or ``filesOut`` (or ``read`` for a caller's ``max_bytes``);
    ``cap`` is ``max_bytes_per_file``, ``max_total_bytes`` or ``max_files``; ``limit`` the cap's
    value; ``actual`` what was asked; ``path`` the file that breached it (may be empty for count).
    """

    direction: str
    cap: str
    limit: int
    actual: int
    path: str = ""

    def _message(self) -> str:
        where = f" at {self.path!r}" if self.path else ""
        return f"{self.direction}.{self.cap} is {self.limit}; {self.actual} refused{where}"


@dataclass(eq=False, repr=False, kw_only=True)
class TransferIntegrityError(SandboxClientError):
    """The bytes that arrived do not match what the sandbox said it would send."""

    path: str
    expected: int
    received: int

    def _message(self) -> str:
        return f"{self.path!r}: expected {self.expected} bytes, received {self.received}"


@dataclass(eq=False, repr=False, kw_only=True)
class ExecSetupError(SandboxClientError):
    """The command could not be started as asked (``what``: ``cwd`` missing, bad ``env`` ...)."""

    what: str
    detail: str = ""

    def __post_init__(self) -> None:
        self.detail = scrub(self.detail)
        super().__post_init__()

    def _message(self) -> str:
        return f"exec could not start: {self.what}" + (f" ({self.detail})" if self.detail else "")


def kill_outcome(delivered: bool, reach: str) -> str:
    """What a command's kill reached, in words (the exec errors' messages)."""
    if delivered:
        return f"its {reach} was sent SIGKILL"
    if reach == "gone":
        return "its process group had already ended"
    return "it could not be signalled, so it may still be running"


@dataclass(eq=False, repr=False, kw_only=True)
class ExecTimeout(SandboxClientError, TimeoutError):
    """The command ran past its timeout; its process group was signalled.

    ``stdout``/``stderr`` hold the output received before the deadline; ``kill_delivered`` says
    whether the kill signal was accepted by the sandbox (not that everything died);
    ``kill_reach`` is ``group`` (the whole process group), ``session`` (every process of a
    terminal session, :meth:`~sandbox_operator.client.Sandbox.exec_stream` with ``tty``),
    ``process``, ``gone`` (not delivered because the group had already ended: nothing was left
    in it) or ``nothing``."""

    argv: tuple[str, ...]
    timeout: float
    stdout: bytes
    stderr: bytes
    kill_delivered: bool
    kill_reach: str

    def _message(self) -> str:
        tail = kill_outcome(self.kill_delivered, self.kill_reach)
        return f"command timed out after {self.timeout:g}s and {tail}"


@dataclass(eq=False, repr=False, kw_only=True)
class ExecQueuedTimeout(SandboxClientError, TimeoutError):
    """The command's ``timeout`` ran out before the command started: nothing ran.

    An exec's ``timeout`` is counted from the call, so the time a handle spends waiting for its
    sandbox (``waited_for``: ``resume``, a suspended Sandbox brought back on first use, or
    another caller's resume in flight) is spent from it. Its own type, apart from
    :class:`ExecTimeout`, because the caller's next move differs: a command that overran is made
    smaller, one that never started is retried unchanged. ``waited`` is the seconds spent."""

    argv: tuple[str, ...]
    timeout: float
    waited: float
    waited_for: str

    def _message(self) -> str:
        return (
            f"the command's {self.timeout:g}s ran out after {self.waited:.1f}s waiting for "
            f"the sandbox ({self.waited_for}); it never started"
        )


class ExecCancelled(asyncio.CancelledError):
    """The caller cancelled an exec: its process group was sent SIGKILL before the cancellation
    went on. A :class:`asyncio.CancelledError` (task cancellation stays cancellation; no
    ``except Exception`` swallows it), not a :class:`SandboxClientError`.

    ``kill_delivered`` says whether the kill was accepted by the sandbox; ``kill_reach`` is
    ``group``, ``process``, ``gone`` or ``nothing`` (the command had not announced itself, or the
    kill failed), as for :class:`ExecTimeout`. Anything short of ``group`` leaves the sandbox
    unclean: its handle refuses further use (:class:`SandboxUnclean`) and, when a client
    acquired it, the Sandbox is disposed."""

    def __init__(self, *, argv: tuple[str, ...], kill_delivered: bool, kill_reach: str) -> None:
        self.argv = argv
        self.kill_delivered = kill_delivered
        self.kill_reach = kill_reach
        what = kill_outcome(kill_delivered, kill_reach)
        super().__init__(f"exec cancelled by the caller: {what}")


@dataclass(eq=False, repr=False, kw_only=True)
class SandboxUnclean(SandboxClientError):
    """The sandbox may still run something a caller no longer owns (an exec cancelled, timed out,
    over its output budget or cut off from its stream whose kill did not reach its process
    group, a host-tool run that could not be stopped; :mod:`~sandbox_operator.client.unclean`):
    the handle refuses every further use, and the Sandbox is disposed (a client-acquired handle),
    so the conversation's next acquire gets a new one once the disposal lands. ``sandbox`` names
    it; ``reason`` says what left it so."""

    sandbox: str
    reason: str

    def _message(self) -> str:
        name = self.sandbox or "the sandbox"
        return f"{name} is unclean ({self.reason}): it is disposed, never used again"


@dataclass(eq=False, repr=False, kw_only=True)
class OutputBudgetExceeded(SandboxClientError):
    """The command produced more output than the budget allows; nothing is returned (output is
    never truncated).

    ``ended`` says the command had already ended when its output was judged (nothing was left
    to kill). Otherwise its process group was sent SIGKILL: ``kill_delivered`` and
    ``kill_reach`` say what that reached, as for :class:`ExecTimeout`; anything short of
    ``group`` leaves the sandbox unclean (:class:`SandboxUnclean`)."""

    budget: int
    received: int
    kill_delivered: bool
    kill_reach: str = "nothing"
    ended: bool = False

    def _message(self) -> str:
        tail = (
            "the command had ended"
            if self.ended
            else kill_outcome(self.kill_delivered, self.kill_reach)
        )
        return (
            f"command output exceeded the budget of {self.budget} bytes (received "
            f"{self.received}); its output was discarded and {tail}"
        )


@dataclass(eq=False, repr=False)
class DataPlaneError(SandboxClientError):
    """The data plane failed (transport error, unexpected answer). ``detail`` is scrubbed."""

    detail: str

    def __post_init__(self) -> None:
        self.detail = scrub(self.detail)
        super().__post_init__()

    def _message(self) -> str:
        return self.detail


@dataclass(eq=False, repr=False, kw_only=True)
class ExecStreamLost(DataPlaneError):
    """The connection to a running command was lost before its end (the exec stream dropped):
    the command runs on in the sandbox unless its process group is killed, so the data plane
    sent SIGKILL to it over a new connection first. ``kill_delivered`` and ``kill_reach`` say
    what that reached, as for :class:`ExecTimeout`; anything short of ``group`` leaves the
    sandbox unclean (:class:`SandboxUnclean`). A :class:`DataPlaneError`: a caller handling a
    transport failure handles this one."""

    argv: tuple[str, ...]
    kill_delivered: bool
    kill_reach: str

    def _message(self) -> str:
        tail = kill_outcome(self.kill_delivered, self.kill_reach)
        return f"the exec stream was lost before the command ended ({self.detail}); {tail}"


@dataclass(eq=False, repr=False, kw_only=True)
class ExecStreamUnsupported(DataPlaneError):
    """What a streaming exec was asked for cannot be done by this data plane or this API server:
    ``what`` is ``stream`` (the data plane only runs buffered commands), ``close_stdin`` (the
    API server speaks the ``v4.channel.k8s.io`` exec protocol, which has no way to end stdin
    alone) or ``resize`` (not a terminal). Nothing was started by the refused call."""

    what: str

    def _message(self) -> str:
        return f"streaming exec cannot {self.what}: {self.detail}"


# --------------------------------------------------------------------------------------------
# Collecting outputs


@dataclass(eq=False, repr=False, kw_only=True)
class OutputMissing(SandboxClientError):
    """A required declared output is not there."""

    path: str
    name: str

    def _message(self) -> str:
        return f"required output {self.name!r} ({self.path!r}) is missing"


@dataclass(eq=False, repr=False, kw_only=True)
class OutputNotRegular(SandboxClientError):
    """A declared output is a symlink, directory or something else than a regular file."""

    path: str
    kind: str

    def _message(self) -> str:
        return f"declared output {self.path!r} is a {self.kind}, not a regular file"


@dataclass(eq=False, repr=False, kw_only=True)
class OutputSizeUnknown(SandboxClientError):
    """The data plane could not say how large an output is."""

    path: str

    def _message(self) -> str:
        return f"size of declared output {self.path!r} is unknown"


@dataclass(eq=False, repr=False, kw_only=True)
class ArtifactNameInvalid(SandboxClientError, ValueError):
    """A landing name is not a safe relative name (``rule`` as for :class:`PathRefused`)."""

    name: str
    rule: str

    def _message(self) -> str:
        return f"artifact name {self.name!r} refused: {self.rule}"


@dataclass(eq=False, repr=False, kw_only=True)
class ArtifactNameCollision(SandboxClientError):
    """Two landing names are one file at the destination (identical, or differing by case or
    Unicode normalization form)."""

    first: str
    second: str

    def _message(self) -> str:
        return f"artifact names {self.first!r} and {self.second!r} collide"


@dataclass(eq=False, repr=False, kw_only=True)
class CallTimeOutputsNotAllowed(SandboxClientError, ValueError):
    """Outputs named at the call were passed for a spec that does not set
    ``outputsNamedAtCallTime``. The flag is what tells everything judging the spec beforehand
    (a host wiring a sink, a reviewer reading what the workload may carry out) that it lands
    more than its ``declaredOutputs`` say; collecting without it would carry artifacts past
    every such check. ``kind`` is the workload kind, ``count`` how many were passed."""

    kind: str
    count: int

    def _message(self) -> str:
        return (
            f"kind {self.kind!r} passed {self.count} output(s) named at the call and its spec "
            "does not set outputsNamedAtCallTime"
        )


class SinkRequired(SandboxClientError, ValueError):
    """Outputs with ``disposition: land`` were declared but no sink was given."""

    def __init__(self) -> None:
        super().__init__("declared outputs land at a sink, and no sink was given")


@dataclass(eq=False, repr=False, kw_only=True)
class LandingNotConfined(SandboxClientError):
    """A sink destination resolves outside the sink's root (or through a symlink)."""

    name: str

    def _message(self) -> str:
        return f"landing {self.name!r} would leave the sink's root"


@dataclass(eq=False, repr=False, kw_only=True)
class LandingExists(SandboxClientError, FileExistsError):
    """A sink destination already exists and the sink does not replace."""

    name: str

    def _message(self) -> str:
        return f"landing {self.name!r} already exists"
