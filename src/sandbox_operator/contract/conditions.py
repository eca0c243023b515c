"""Condition types and reasons: the one source for Sandbox/SandboxScope status conditions, client
exception types and docs."""

from __future__ import annotations

from enum import StrEnum

from .errors import RefusalReason


class ConditionType(StrEnum):
    """Condition types a Sandbox or SandboxScope carries."""

    ADMITTED = "Admitted"
    READY = "Ready"
    DISPOSED = "Disposed"


class ConditionReason(StrEnum):
    """Every machine-readable reason a condition may carry.

    The first block mirrors :class:`RefusalReason` value for value (a test holds them equal).
    """

    # Refusals (Admitted=False).
    ISOLATION_BELOW_FLOOR = RefusalReason.ISOLATION_BELOW_FLOOR.value
    CAPABILITY_NOT_SUPPORTED = RefusalReason.CAPABILITY_NOT_SUPPORTED.value
    OS_FAMILY_NOT_SUPPORTED = RefusalReason.OS_FAMILY_NOT_SUPPORTED.value
    TRANSFER_LIMITS_NOT_PERMITTED = RefusalReason.TRANSFER_LIMITS_NOT_PERMITTED.value
    EGRESS_NOT_ENFORCED = RefusalReason.EGRESS_NOT_ENFORCED.value
    ISOLATION_SCOPE_NOT_ENFORCED = RefusalReason.ISOLATION_SCOPE_NOT_ENFORCED.value
    CALL_ID_REQUIRED = RefusalReason.CALL_ID_REQUIRED.value
    CAPABILITY_DENIED = RefusalReason.CAPABILITY_DENIED.value
    RESOURCES_EXCEED_CEILING = RefusalReason.RESOURCES_EXCEED_CEILING.value
    BACKEND_UNAVAILABLE = RefusalReason.BACKEND_UNAVAILABLE.value
    NO_BACKEND_CAN_SERVE = RefusalReason.NO_BACKEND_CAN_SERVE.value
    STORAGE_NOT_SUPPORTED = RefusalReason.STORAGE_NOT_SUPPORTED.value
    # Admission and lifecycle.
    SCOPE_NOT_FOUND = "ScopeNotFound"
    # A SandboxScope (Ready=False) whose scope and threadId an older SandboxScope in the
    # namespace already holds, and the Sandboxes naming it (Admitted=False): one conversation,
    # one SandboxScope.
    SCOPE_CONFLICT = "ScopeConflict"
    ADMITTED = "Admitted"
    PENDING = "Pending"
    CREATING = "Creating"
    READY = "Ready"
    STARTUP_FAILED = "StartupFailed"
    STARTUP_TIMEOUT = "StartupTimeout"
    FAILED = "Failed"
    EXPIRED = "Expired"
    # Compute stopped, work volume kept (spec.suspended, or lifetime.idleAction suspend).
    SUSPENDED = "Suspended"
    # Disposal.
    DISPOSING = "Disposing"
    DISPOSED = "Disposed"
    DISPOSAL_FAILED = "DisposalFailed"
    KEY_UNCLEAN = "KeyUnclean"
    # SandboxScope purges.
    PURGED = "Purged"
    PURGE_INCOMPLETE = "PurgeIncomplete"
    # The Role and RoleBinding granting a SandboxScope's agents their conversation could not be
    # written (an Event on the scope; retried).
    ACCESS_NOT_GRANTED = "AccessNotGranted"
    # SandboxWarmPools (Ready=False while the pool has fewer ready idle pods than wanted, or
    # cannot serve its template; a template the policy refuses carries the refusal's reason).
    FILLING = "Filling"
    TEMPLATE_INVALID = "TemplateInvalid"
    POOL_UNSUPPORTED = "PoolUnsupported"
    # A Sandbox served cold although a warm pool for its spec exists (an Event, not a condition).
    POOL_EXHAUSTED = "PoolExhausted"


def refusal_condition_reason(reason: RefusalReason) -> ConditionReason:
    """The condition reason that reports ``reason``."""
    return ConditionReason(reason.value)


class ConditionStatus(StrEnum):
    """metav1.Condition status values."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"
