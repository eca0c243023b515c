"""Condition types and reasons: the one source for Sandbox/SandboxScope status conditions, client
exception types and docs."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import NamedTuple

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
    # Egress edits on a live Sandbox (Events; status.egressPolicy and egressEditRefused too).
    EGRESS_EDITED = "EgressEdited"
    EGRESS_EDIT_REFUSED = "EgressEditRefused"
    # Why an edit was refused when no admission check refused it: the backend cannot follow one.
    EGRESS_EDIT_NOT_SUPPORTED = "EgressEditNotSupported"


class ReasonDoc(NamedTuple):
    """What one reason means, for the reasons table of docs/conditions.md (``make docs``).

    Kept here, next to the enum, so that a reason cannot be added without saying what it means:
    the generator refuses a reason without an entry, and the docs' drift test fails until the
    table is regenerated. The strings are Markdown.
    """

    #: Which conditions (of which kind) carry it.
    conditions: str
    #: What it means, in one line.
    meaning: str
    #: Whether it is the end of the Sandbox: ``yes`` (nothing is created again), ``no``, ``—``
    #: (not a failure), ``retried``.
    terminal: str


_REFUSED = "Admitted=False, Ready=False"
_POOL = "SandboxWarmPool Ready=False"

#: One entry per :class:`ConditionReason`, in the enum's order (a test holds them equal).
REASON_DOCS: Mapping[ConditionReason, ReasonDoc] = {
    ConditionReason.ISOLATION_BELOW_FLOOR: ReasonDoc(
        _REFUSED,
        "backend below the effective floor (host, scope, spec), or an unknown rung",
        "no (re-judged each pass)",
    ),
    ConditionReason.CAPABILITY_NOT_SUPPORTED: ReasonDoc(
        _REFUSED, "spec requires a capability the backend does not declare", "no"
    ),
    ConditionReason.OS_FAMILY_NOT_SUPPORTED: ReasonDoc(
        _REFUSED,
        "spec asks an OS family the backend does not declare (a drive-letter workDir such as "
        "`C:\\work` asks for `windows`)",
        "no",
    ),
    ConditionReason.TRANSFER_LIMITS_NOT_PERMITTED: ReasonDoc(
        _REFUSED, "filesIn/filesOut above the backend's ceilings", "no"
    ),
    ConditionReason.EGRESS_NOT_ENFORCED: ReasonDoc(
        _REFUSED, "egress mode not declared, or unrestricted not allowed by the host", "no"
    ),
    ConditionReason.ISOLATION_SCOPE_NOT_ENFORCED: ReasonDoc(
        _REFUSED, "per-call isolation not declared", "no"
    ),
    ConditionReason.CALL_ID_REQUIRED: ReasonDoc(
        _REFUSED,
        "the host or the SandboxScope raises the isolation scope to `call`, but the Sandbox names "
        "no call (ask with `isolationScope: call` and a `callId`); judged before any backend",
        "no",
    ),
    ConditionReason.CAPABILITY_DENIED: ReasonDoc(
        _REFUSED,
        "the spec requires a capability in `hostPolicy.deniedCapabilities` (e.g. `host_tools`): "
        "the host refuses it outright, whatever a backend declares; judged before any backend, "
        "and under perSpec no next backend is tried",
        "no",
    ),
    ConditionReason.RESOURCES_EXCEED_CEILING: ReasonDoc(
        _REFUSED,
        "the spec states a request or limit above `hostPolicy.resources.maxRequests`/`maxLimits`; "
        "the message lists each, e.g. `limits.memory 4Gi > maxLimits.memory 2Gi`; judged before "
        "any backend, refused rather than clamped",
        "no",
    ),
    ConditionReason.BACKEND_UNAVAILABLE: ReasonDoc(
        _REFUSED, "the chosen backend cannot serve (e.g. RuntimeClass missing)", "no"
    ),
    ConditionReason.NO_BACKEND_CAN_SERVE: ReasonDoc(
        _REFUSED, "perSpec: no backend passes; the message names each with its reason", "no"
    ),
    ConditionReason.STORAGE_NOT_SUPPORTED: ReasonDoc(
        _REFUSED,
        "the spec asks for `storage` and the backend does not declare `persistentStorage`",
        "no",
    ),
    ConditionReason.SCOPE_NOT_FOUND: ReasonDoc(
        _REFUSED, "the scopeRef does not exist (yet) or is being deleted; retried", "no"
    ),
    ConditionReason.SCOPE_CONFLICT: ReasonDoc(
        f"SandboxScope Ready=False; a Sandbox's {_REFUSED}",
        "one conversation, one SandboxScope: an older SandboxScope in the namespace already holds "
        "this one's scope and threadId (the message names it); this scope and the Sandboxes "
        "naming it are refused, with no label of the conversation put on them, until the holder "
        "is gone, then admitted; retried",
        "no",
    ),
    ConditionReason.ADMITTED: ReasonDoc("Admitted=True", "admitted to `status.backend`", "—"),
    ConditionReason.PENDING: ReasonDoc(
        "none (never written)",
        "no condition yet: what the client's status and the `sandbox_operator_sandboxes` "
        "metric report for a Sandbox the operator has not judged",
        "no",
    ),
    ConditionReason.CREATING: ReasonDoc(
        "Ready=False",
        "objects created, not ready yet; or creating them failed transiently (5xx, 429, "
        "unreachable): the message names the failed operation, status and service code, and the "
        "create is retried with backoff (5 s doubling to 60 s, or the service's Retry-After) "
        "until `startupTimeoutSeconds`, counted from admission",
        "no",
    ),
    ConditionReason.READY: ReasonDoc(
        "Ready=True",
        "the pod runs and is ready for exec; for an `allowlist` Sandbox served by the "
        "operator-run egress proxy, also that proxy has admitted it (`status.egress.admitted`), "
        'so its first request is served (until then `Creating`, "waiting for the egress proxy to '
        'admit the sandbox", under the same startup timeout); once Ready it stays Ready if that '
        "field later goes missing",
        "—",
    ),
    ConditionReason.STARTUP_FAILED: ReasonDoc(
        "Ready=False",
        "cannot start: image missing (`ErrImageNeverPull`, `ImagePullBackOff`), RuntimeClass "
        "missing at pod creation, a node whose container runtime has no handler for the "
        "RuntimeClass (`RuntimeHandlerMissing`, seen in the kubelet's `FailedCreatePodSandBox` "
        "Events, which the operator watches; the kubelet itself would retry forever), container "
        "crashed before the Sandbox was Ready, invalid spec",
        "yes",
    ),
    ConditionReason.STARTUP_TIMEOUT: ReasonDoc(
        "Ready=False", "not ready within `lifetime.startupTimeoutSeconds`", "yes"
    ),
    ConditionReason.FAILED: ReasonDoc(
        "Ready=False", "stopped or vanished after the Sandbox had reported Ready", "yes"
    ),
    ConditionReason.EXPIRED: ReasonDoc(
        "Ready=False",
        "`ttlSeconds` after creation (suspended or not), or `idleTimeoutSeconds` without activity "
        "(unless `idleAction: suspend`)",
        "yes",
    ),
    ConditionReason.SUSPENDED: ReasonDoc(
        "Ready=False",
        "compute stopped, work volume kept: `spec.suspended: true`, or `idleTimeoutSeconds` "
        "without activity under `lifetime.idleAction: suspend`, or the backend stopped it (a "
        "remote service idling it); `status.suspendedBy` says which (`spec`, `idle`). See "
        "[suspend.md](suspend.md)",
        "no",
    ),
    ConditionReason.DISPOSING: ReasonDoc(
        "Ready=False, Disposed=False", "the Sandbox is being deleted", "—"
    ),
    ConditionReason.DISPOSED: ReasonDoc("Disposed=True", "backend objects removed", "—"),
    ConditionReason.DISPOSAL_FAILED: ReasonDoc(
        "Disposed=False (Ready=False)",
        "disposal did not land; message carries the DisposalCode (`unreachable`, `timeout`, "
        "`refused`, `unlisted`, `unknown`)",
        "retried",
    ),
    ConditionReason.KEY_UNCLEAN: ReasonDoc(
        _REFUSED,
        "an earlier sandbox with the same key has not been disposed; retried. Also when the "
        "Sandbox's pod name is held by something else, and the message says which: another live "
        "Sandbox whose pod name this Sandbox's name is (rename it: it never clears), a pod owned "
        "by something else, or a pod not confined as the backend makes it (delete it)",
        "no",
    ),
    ConditionReason.PURGED: ReasonDoc(
        "SandboxScope Disposed",
        "outcome of a scope purge: everything disposed (also in `status.lastPurge` and an Event)",
        "—",
    ),
    ConditionReason.PURGE_INCOMPLETE: ReasonDoc(
        "SandboxScope Disposed",
        "outcome of a scope purge: something stayed undisposed (also in `status.lastPurge` and "
        "an Event); retried up to `scopePurgeAttempts` times",
        "—",
    ),
    ConditionReason.ACCESS_NOT_GRANTED: ReasonDoc(
        "SandboxScope Ready=False (and a Warning Event)",
        "the Role and RoleBinding granting the scope's `agentServiceAccounts` their conversation "
        'could not be written (docs/concepts.md, "The conversation boundary"); retried',
        "—",
    ),
    ConditionReason.FILLING: ReasonDoc(
        _POOL,
        "fewer Ready idle pods than `replicas`; the message names a pod problem such as "
        "`ImagePullBackOff`, or the egress proxy's objects being refused. Never on a Sandbox "
        "([warm-pools.md](warm-pools.md))",
        "—",
    ),
    ConditionReason.TEMPLATE_INVALID: ReasonDoc(
        _POOL,
        "the pool's template is invalid; the message names the field. Never on a Sandbox",
        "—",
    ),
    ConditionReason.POOL_UNSUPPORTED: ReasonDoc(
        _POOL,
        "the chosen backend cannot keep pods: only runtimeClass backends can. Never on a Sandbox",
        "—",
    ),
    ConditionReason.POOL_EXHAUSTED: ReasonDoc(
        "an Event on a Sandbox (no condition)",
        "a warm pool of its shape had no idle Ready pod: it starts cold",
        "—",
    ),
    ConditionReason.EGRESS_EDITED: ReasonDoc(
        "an Event on a Sandbox (no condition)",
        "an edit of `egressAllow` / `egressRules` was accepted: `status.admittedEgressAllow` "
        "and `status.egressPolicy` now hold it, and the egress proxy enforces it "
        "([egress.md](egress.md#editing-egress-on-a-live-sandbox))",
        "—",
    ),
    ConditionReason.EGRESS_EDIT_REFUSED: ReasonDoc(
        "a Warning Event on a Sandbox (no condition)",
        "an egress edit was refused (`status.egressEditRefused` says why); the egress "
        "admitted before stays enforced",
        "—",
    ),
    ConditionReason.EGRESS_EDIT_NOT_SUPPORTED: ReasonDoc(
        "`status.egressEditRefused.reason` of a Sandbox",
        "its backend cannot enforce an egress edit on a live sandbox (the acas backend, a "
        "runtimeClass backend with an external proxy): the edit is refused",
        "—",
    ),
}


def refusal_condition_reason(reason: RefusalReason) -> ConditionReason:
    """The condition reason that reports ``reason``."""
    return ConditionReason(reason.value)


class ConditionStatus(StrEnum):
    """metav1.Condition status values."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"
