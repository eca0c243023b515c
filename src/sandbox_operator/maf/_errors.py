"""What an acquire's failure means to maf-sandbox: one table from the client's acquire errors
(one class per condition reason the operator writes, see
:data:`sandbox_operator.client.errors.CONDITION_ERRORS`) to the maf exception of the same meaning.

maf's router branches on the type: its attach refusals (``ATTACH_REFUSALS``) say the workload
was refused and routing may try the next backend; :class:`maf_sandbox.SandboxBackendUnavailable`
is the one failure that permits fallback, and only once nothing was retained or started, so the
backend disposes the Sandbox before raising it (:data:`NEEDS_DISPOSAL`). Conditions maf has no
word for raise :class:`OperatorAcquireFailed` (or a subclass) with the operator's reason, never a
stretched maf type. ``tests/unit/maf/test_errors.py`` holds the table against both sides.
"""

from __future__ import annotations

from collections.abc import Mapping

import maf_sandbox as maf

from sandbox_operator.client import errors as client_errors


class OperatorAcquireFailed(RuntimeError):
    """The operator did not produce a Ready sandbox, for a reason maf-sandbox has no type for.

    ``reason`` is the operator's condition reason (or the client's: ``NotReadyInTime``,
    ``SpecConflict``, ``SpecRejected``); the message carries the client's scrubbed text."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class OperatorAcquireTimedOut(OperatorAcquireFailed, TimeoutError):
    """The client's own deadline for the Sandbox to become Ready passed."""


class OperatorSpecRejected(OperatorAcquireFailed, ValueError):
    """The API server rejected the Sandbox the spec maps to, or another spec holds the key."""


class OperatorBackendMismatch(OperatorAcquireFailed):
    """The Sandbox was served by an operator backend other than the one this maf backend stands
    for (its declarations would not describe it); it was disposed."""


#: The client's acquire error -> the maf exception (or ours) it is raised as.
ACQUIRE_ERRORS: Mapping[type[client_errors.SandboxAcquireError], type[Exception]] = {
    # The operator's admission refusals: maf's attach refusals of the same meaning.
    client_errors.SandboxIsolationBelowFloor: maf.SandboxBackendNotPermitted,
    client_errors.SandboxCapabilityNotSupported: maf.SandboxCapabilityNotSupported,
    client_errors.SandboxOsFamilyNotSupported: maf.SandboxOsFamilyNotSupported,
    client_errors.SandboxTransferLimitsNotPermitted: maf.SandboxTransferLimitsNotPermitted,
    client_errors.SandboxEgressNotEnforced: maf.SandboxEgressNotEnforced,
    client_errors.SandboxIsolationScopeNotEnforced: maf.SandboxScopeNotEnforced,
    # A call-scoped spec acquired without a call id: the scope cannot be given.
    client_errors.SandboxCallIdRequired: maf.SandboxScopeNotEnforced,
    # The host denies the capability outright: maf's hard stop of the same name.
    client_errors.SandboxCapabilityDenied: maf.SandboxCapabilityDenied,
    # The host's resource ceiling: a host policy refusal, fixed by a person.
    client_errors.SandboxResourcesExceedCeiling: maf.SandboxBackendNotPermitted,
    # The operator's backend is down: nothing started; disposed first (NEEDS_DISPOSAL).
    client_errors.SandboxBackendUnavailable: maf.SandboxBackendUnavailable,
    # perSpec selection found no backend: maf's "no backend" lookup failure.
    client_errors.SandboxNoBackendCanServe: maf.NoSandboxBackend,
    # A spec asking for persistent storage (maf specs never do): a capability mismatch.
    client_errors.SandboxStorageNotSupported: maf.SandboxCapabilityNotSupported,
    # Startup: the pod never ran a command of the caller's; disposed first, fallback allowed.
    client_errors.SandboxStartupTimeout: maf.SandboxBackendUnavailable,
    # An image that cannot start is configuration, which maf says must not fall back.
    client_errors.SandboxStartupFailed: OperatorAcquireFailed,
    client_errors.SandboxFailed: OperatorAcquireFailed,
    # The key waits for a disposal that did not land: maf's unclean-key refusal.
    client_errors.SandboxKeyUnclean: maf.SandboxUnclean,
    # Deleted, expired, disposing, purged while acquired: cleanup in progress for the key.
    client_errors.SandboxGone: maf.SandboxUnclean,
    client_errors.SandboxScopeNotFound: OperatorAcquireFailed,
    client_errors.SandboxScopeConflict: OperatorAcquireFailed,
    client_errors.SandboxSuspended: OperatorAcquireFailed,
    client_errors.SandboxSpecConflict: OperatorSpecRejected,
    client_errors.SandboxSpecRejected: OperatorSpecRejected,
    client_errors.SandboxNotReadyInTime: OperatorAcquireTimedOut,
}

#: The rows whose maf meaning requires that nothing be retained: the Sandbox is disposed (and
#: seen gone) before the error is raised; if that fails, :class:`OperatorAcquireFailed` instead.
NEEDS_DISPOSAL: frozenset[type[Exception]] = frozenset({maf.SandboxBackendUnavailable})

#: maf's attach refusals the operator never raises, and why (the table's other side).
NOT_RAISED: Mapping[type[Exception], str] = {
    maf.SandboxAttachedIdentityNotPermitted: "the router's own identity check; no attachment",
    maf.SandboxCapabilityDenied: "a host's deny list lives in the router, not the operator",
    maf.SandboxIdentityDenied: "host-tool identities are the router's to deny",
}


def translate(exc: client_errors.SandboxAcquireError) -> Exception:
    """The maf exception for a client acquire error (the most specific row of its class)."""
    for cls in type(exc).__mro__:
        target = ACQUIRE_ERRORS.get(cls)
        if target is not None:
            return _build(target, exc)
    return OperatorAcquireFailed(str(exc), reason=exc.reason)


def _build(target: type[Exception], exc: client_errors.SandboxAcquireError) -> Exception:
    if issubclass(target, OperatorAcquireFailed):
        return target(str(exc), reason=exc.reason)
    if target is maf.SandboxUnclean:
        return maf.SandboxUnclean(str(exc))
    return target(str(exc))
