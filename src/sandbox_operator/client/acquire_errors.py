"""Acquire errors: what ``acquire`` (or a wait for readiness) raises instead of a Ready sandbox.

One class per thing a caller branches on, each written out, and one table,
:data:`CONDITION_ERRORS`, keyed by the contract's :class:`ConditionReason`, that says which class
a Sandbox's condition reason raises (None: the Sandbox is still on its way). :data:`REFUSAL_ERRORS`,
:data:`PENDING_REASONS`, :func:`acquire_error_for` and :func:`refusal_error_for` are read from
that table, and :func:`check_condition_errors` (run at import) holds it against the contract: every
condition reason has a decision, and every refusal class names, as ``refusal_type``, the
contract's refusal class for the same :class:`RefusalReason` (``REFUSAL_TYPES``). A reason added
to the contract without a decision here fails at import, not at a caller's first acquire.

Import these from :mod:`sandbox_operator.client.errors` (or the package), which draws the tree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from sandbox_operator.client.errorbase import SandboxClientError, scrub
from sandbox_operator.contract import errors as contract
from sandbox_operator.contract.conditions import ConditionReason, refusal_condition_reason
from sandbox_operator.contract.errors import RefusalReason, SandboxRefusal

#: Re-exported by :mod:`sandbox_operator.client.errors`; in the tree's order, not sorted.
__all__ = [  # noqa: RUF022
    "SandboxAcquireError",
    "SandboxNotReadyInTime",
    "SandboxRefused",
    "SandboxIsolationBelowFloor",
    "SandboxCapabilityNotSupported",
    "SandboxOsFamilyNotSupported",
    "SandboxTransferLimitsNotPermitted",
    "SandboxEgressNotEnforced",
    "SandboxIsolationScopeNotEnforced",
    "SandboxCallIdRequired",
    "SandboxResourcesExceedCeiling",
    "SandboxCapabilityDenied",
    "SandboxBackendUnavailable",
    "SandboxNoBackendCanServe",
    "SandboxStorageNotSupported",
    "SandboxStartupFailed",
    "SandboxStartupTimeout",
    "SandboxFailed",
    "SandboxKeyUnclean",
    "SandboxScopeNotFound",
    "SandboxScopeConflict",
    "SandboxGone",
    "SandboxSuspended",
    "SandboxSpecConflict",
    "SandboxSpecRejected",
    "CONDITION_ERRORS",
    "NOT_SANDBOX_REASONS",
    "PENDING_REASONS",
    "REFUSAL_ERRORS",
    "acquire_error_for",
    "check_condition_errors",
    "refusal_error_for",
]


class SandboxAcquireError(SandboxClientError):
    """An acquire (or a wait for readiness) that did not produce a Ready sandbox.

    ``reason`` is the machine-readable condition reason (or ``NotReadyInTime`` for the client's own
    deadline); ``message`` is the operator's condition message, scrubbed; ``sandbox`` and
    ``namespace`` name the Sandbox resource.
    """

    reason_value: ClassVar[str] = ""

    def __init__(
        self, *, sandbox: str, namespace: str, reason: str = "", message: str = ""
    ) -> None:
        self.reason = reason or self.reason_value
        self.message = scrub(message)
        self.sandbox = sandbox
        self.namespace = namespace
        text = f"sandbox {namespace}/{sandbox}: {self.reason}"
        if self.message:
            text += f": {self.message}"
        super().__init__(text)


class SandboxNotReadyInTime(SandboxAcquireError):
    """The client's own deadline passed before the Sandbox reported Ready or a terminal reason.

    ``last_reason`` is the last non-terminal reason seen (e.g. ``Creating``)."""

    reason_value = "NotReadyInTime"

    def __init__(
        self, *, sandbox: str, namespace: str, timeout: float, last_reason: str = ""
    ) -> None:
        self.timeout = timeout
        self.last_reason = last_reason
        super().__init__(
            sandbox=sandbox,
            namespace=namespace,
            message=f"not Ready within {timeout:g}s (last reason: {last_reason or 'none'})",
        )


# --------------------------------------------------------------------------------------------
# Refusals: one class per RefusalReason, each naming the contract's refusal type


class SandboxRefused(SandboxAcquireError):
    """The operator refused to admit the spec.

    ``refusal_reason`` is the contract's enum value and ``refusal_type`` the contract's refusal
    class (:mod:`sandbox_operator.contract.errors`) the operator raised; ``reason`` is the same
    reason as text (``reason_value`` follows ``refusal_reason`` in every subclass). The
    contract's fields do not cross the wire: ``message`` carries its prose.
    """

    refusal_reason: ClassVar[RefusalReason]
    refusal_type: ClassVar[type[SandboxRefusal]]

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls.reason_value = cls.refusal_reason.value


class SandboxIsolationBelowFloor(SandboxRefused):
    """The backend's isolation is below the effective floor (or is not a known rung)."""

    refusal_reason = RefusalReason.ISOLATION_BELOW_FLOOR
    refusal_type = contract.IsolationBelowFloor


class SandboxCapabilityNotSupported(SandboxRefused):
    """The backend lacks a capability the spec requires."""

    refusal_reason = RefusalReason.CAPABILITY_NOT_SUPPORTED
    refusal_type = contract.CapabilityNotSupported


class SandboxOsFamilyNotSupported(SandboxRefused):
    """The spec asks for an OS family the backend does not declare."""

    refusal_reason = RefusalReason.OS_FAMILY_NOT_SUPPORTED
    refusal_type = contract.OsFamilyNotSupported


class SandboxTransferLimitsNotPermitted(SandboxRefused):
    """The spec's transfer limits exceed the backend's ceilings (refused, never clamped)."""

    refusal_reason = RefusalReason.TRANSFER_LIMITS_NOT_PERMITTED
    refusal_type = contract.TransferLimitsNotPermitted


class SandboxEgressNotEnforced(SandboxRefused):
    """The backend does not enforce the spec's egress mode, or the host forbids unrestricted."""

    refusal_reason = RefusalReason.EGRESS_NOT_ENFORCED
    refusal_type = contract.EgressNotEnforced


class SandboxIsolationScopeNotEnforced(SandboxRefused):
    """The backend cannot serve the effective isolation scope."""

    refusal_reason = RefusalReason.ISOLATION_SCOPE_NOT_ENFORCED
    refusal_type = contract.IsolationScopeNotEnforced


class SandboxCallIdRequired(SandboxRefused):
    """The effective isolation scope is ``call`` and the request names no call."""

    refusal_reason = RefusalReason.CALL_ID_REQUIRED
    refusal_type = contract.CallIdRequired


class SandboxCapabilityDenied(SandboxRefused):
    """The spec requires a capability the host denies outright (hostPolicy.deniedCapabilities)."""

    refusal_reason = RefusalReason.CAPABILITY_DENIED
    refusal_type = contract.CapabilityDenied


class SandboxResourcesExceedCeiling(SandboxRefused):
    """The spec asks for more CPU or memory than the host policy allows."""

    refusal_reason = RefusalReason.RESOURCES_EXCEED_CEILING
    refusal_type = contract.ResourcesExceedCeiling


class SandboxBackendUnavailable(SandboxRefused):
    """The backend passed every check but cannot serve right now."""

    refusal_reason = RefusalReason.BACKEND_UNAVAILABLE
    refusal_type = contract.BackendUnavailable


class SandboxNoBackendCanServe(SandboxRefused):
    """Per-spec selection found no backend that passes; the message lists each one's refusal."""

    refusal_reason = RefusalReason.NO_BACKEND_CAN_SERVE
    refusal_type = contract.NoBackendCanServe


class SandboxStorageNotSupported(SandboxRefused):
    """The spec asks for ``storage`` and the backend keeps no work volume across suspend."""

    refusal_reason = RefusalReason.STORAGE_NOT_SUPPORTED
    refusal_type = contract.StorageNotSupported


# --------------------------------------------------------------------------------------------
# The other terminal reasons


class SandboxStartupFailed(SandboxAcquireError):
    """The backend could not start the sandbox (e.g. the image cannot be pulled)."""

    reason_value = "StartupFailed"


class SandboxStartupTimeout(SandboxAcquireError):
    """The operator gave up waiting for the sandbox to start
    (``lifetime.startupTimeoutSeconds``)."""

    reason_value = "StartupTimeout"


class SandboxFailed(SandboxAcquireError):
    """The sandbox was running and failed (also: a terminal reason this client does not know)."""

    reason_value = "Failed"


class SandboxKeyUnclean(SandboxAcquireError):
    """The key is refused until a previous sandbox under it is disposed."""

    reason_value = "KeyUnclean"


class SandboxScopeNotFound(SandboxAcquireError):
    """The ``scopeRef`` names no SandboxScope in the namespace."""

    reason_value = "ScopeNotFound"


class SandboxScopeConflict(SandboxAcquireError):
    """The ``scopeRef`` names a SandboxScope whose scope and threadId an older SandboxScope in
    the namespace already holds (one conversation, one SandboxScope); the message names it."""

    reason_value = "ScopeConflict"


class SandboxGone(SandboxAcquireError):
    """The Sandbox (or its SandboxScope) was deleted, expired or is being disposed while waited on.

    ``reason`` says which: ``Deleted``, ``ScopeDeleted``, ``Expired``, ``Disposing``,
    ``Disposed``, ``Purged`` ..."""

    reason_value = "Deleted"


class SandboxSuspended(SandboxAcquireError):
    """The Sandbox is suspended (its compute stopped, its work volume kept) and was not resumed:
    ``resume()`` it, or ``acquire`` it (which resumes)."""

    reason_value = "Suspended"


class SandboxSpecConflict(SandboxAcquireError):
    """A Sandbox with this key exists with a different spec (server-side apply conflict)."""

    reason_value = "SpecConflict"


class SandboxSpecRejected(SandboxAcquireError):
    """The API server rejected the Sandbox (schema validation, an immutable field changed)."""

    reason_value = "SpecRejected"


# --------------------------------------------------------------------------------------------
# The one table: condition reason -> acquire error


#: What a Sandbox whose Ready condition carries a reason raises from ``acquire``: the class, or
#: None while the Sandbox is still on its way. Every ConditionReason but
#: :data:`NOT_SANDBOX_REASONS` has a row (checked at import).
CONDITION_ERRORS: Mapping[ConditionReason, type[SandboxAcquireError] | None] = {
    # Refusals (Admitted=False).
    ConditionReason.ISOLATION_BELOW_FLOOR: SandboxIsolationBelowFloor,
    ConditionReason.CAPABILITY_NOT_SUPPORTED: SandboxCapabilityNotSupported,
    ConditionReason.OS_FAMILY_NOT_SUPPORTED: SandboxOsFamilyNotSupported,
    ConditionReason.TRANSFER_LIMITS_NOT_PERMITTED: SandboxTransferLimitsNotPermitted,
    ConditionReason.EGRESS_NOT_ENFORCED: SandboxEgressNotEnforced,
    ConditionReason.ISOLATION_SCOPE_NOT_ENFORCED: SandboxIsolationScopeNotEnforced,
    ConditionReason.CALL_ID_REQUIRED: SandboxCallIdRequired,
    ConditionReason.CAPABILITY_DENIED: SandboxCapabilityDenied,
    ConditionReason.RESOURCES_EXCEED_CEILING: SandboxResourcesExceedCeiling,
    ConditionReason.BACKEND_UNAVAILABLE: SandboxBackendUnavailable,
    ConditionReason.NO_BACKEND_CAN_SERVE: SandboxNoBackendCanServe,
    ConditionReason.STORAGE_NOT_SUPPORTED: SandboxStorageNotSupported,
    # Admission and lifecycle.
    ConditionReason.SCOPE_NOT_FOUND: SandboxScopeNotFound,
    ConditionReason.SCOPE_CONFLICT: SandboxScopeConflict,
    ConditionReason.ADMITTED: None,
    ConditionReason.PENDING: None,
    ConditionReason.CREATING: None,
    ConditionReason.READY: None,
    ConditionReason.STARTUP_FAILED: SandboxStartupFailed,
    ConditionReason.STARTUP_TIMEOUT: SandboxStartupTimeout,
    ConditionReason.FAILED: SandboxFailed,
    ConditionReason.EXPIRED: SandboxGone,
    ConditionReason.SUSPENDED: SandboxSuspended,
    # Disposal and purges.
    ConditionReason.DISPOSING: SandboxGone,
    ConditionReason.DISPOSED: SandboxGone,
    ConditionReason.DISPOSAL_FAILED: SandboxGone,
    ConditionReason.KEY_UNCLEAN: SandboxKeyUnclean,
    ConditionReason.PURGED: SandboxGone,
    ConditionReason.PURGE_INCOMPLETE: SandboxGone,
}

#: Reasons a Sandbox's conditions never carry: a SandboxWarmPool's, Events' and
#: ``status.egressEditRefused``'s.
NOT_SANDBOX_REASONS: frozenset[str] = frozenset(
    {
        ConditionReason.FILLING,
        ConditionReason.TEMPLATE_INVALID,
        ConditionReason.POOL_UNSUPPORTED,
        ConditionReason.POOL_EXHAUSTED,
        ConditionReason.ACCESS_NOT_GRANTED,
        ConditionReason.EGRESS_EDITED,
        ConditionReason.EGRESS_EDIT_REFUSED,
        ConditionReason.EGRESS_EDIT_NOT_SUPPORTED,
    }
)

#: Condition reasons that mean "still on its way" (and no reason yet); anything else that is not
#: Ready is terminal.
PENDING_REASONS: frozenset[str] = frozenset(
    {""} | {reason.value for reason, cls in CONDITION_ERRORS.items() if cls is None}
)

#: One exception class per refusal reason, keyed by the reason.
REFUSAL_ERRORS: Mapping[RefusalReason, type[SandboxRefused]] = {
    cls.refusal_reason: cls
    for cls in CONDITION_ERRORS.values()
    if cls is not None and issubclass(cls, SandboxRefused)
}

_BY_VALUE: Mapping[str, type[SandboxAcquireError] | None] = {
    reason.value: cls for reason, cls in CONDITION_ERRORS.items()
}


def check_condition_errors() -> None:
    """Hold the table against the contract; raise ``ImportError`` naming what disagrees.

    Every ConditionReason is decided (a row, or a reason Sandboxes never carry); every refusal
    reason has one client class, under its own condition reason, whose ``refusal_type`` is the
    contract's ``REFUSAL_TYPES`` entry for it."""
    problems = [
        f"condition reason without a client exception: {reason.value}"
        for reason in ConditionReason
        if reason not in CONDITION_ERRORS and reason not in NOT_SANDBOX_REASONS
    ]
    problems += [
        f"refusal reason without a client exception: {reason.value}"
        for reason in RefusalReason
        if reason not in REFUSAL_ERRORS
    ]
    for reason, cls in REFUSAL_ERRORS.items():
        if CONDITION_ERRORS.get(refusal_condition_reason(reason)) is not cls:
            problems.append(f"{cls.__name__} is not the row for {reason.value}")
        if (
            contract.REFUSAL_TYPES.get(reason) is not cls.refusal_type
            or cls.refusal_type.reason != reason
        ):
            problems.append(f"{cls.__name__}.refusal_type is not REFUSAL_TYPES[{reason.value}]")
    if problems:  # pragma: no cover - a contract change without a client change
        raise ImportError("; ".join(problems))


check_condition_errors()


def refusal_error_for(reason: RefusalReason | str) -> type[SandboxRefused]:
    """The exception class for a refusal reason (``ValueError`` when it is not one)."""
    return REFUSAL_ERRORS[RefusalReason(reason)]


def acquire_error_for(reason: str) -> type[SandboxAcquireError] | None:
    """The exception class for a terminal condition reason, or None when the reason is pending.

    An unknown reason is terminal but unexplained: it is reported as a failure, not a hang."""
    if reason in PENDING_REASONS:
        return None
    return _BY_VALUE.get(reason) or SandboxFailed
