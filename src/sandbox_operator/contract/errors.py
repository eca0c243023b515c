"""Refusals and configuration errors.

Every refusal is a type with fields a caller branches on (``reason``, ``backend``, ``kind`` and
the check's own values); ``message`` is prose for a person and is never parsed. Messages name the
backend, the workload kind and the offending values; they never carry secrets or endpoints.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, TypeVar

from .enums import (
    Capability,
    Egress,
    Isolation,
    IsolationScope,
    OsFamily,
)

_E = TypeVar("_E", bound=StrEnum)


class RefusalReason(StrEnum):
    """Machine-readable reason of a refusal; also a condition reason and a client exception."""

    ISOLATION_BELOW_FLOOR = "IsolationBelowFloor"
    CAPABILITY_NOT_SUPPORTED = "CapabilityNotSupported"
    OS_FAMILY_NOT_SUPPORTED = "OsFamilyNotSupported"
    TRANSFER_LIMITS_NOT_PERMITTED = "TransferLimitsNotPermitted"
    EGRESS_NOT_ENFORCED = "EgressNotEnforced"
    ISOLATION_SCOPE_NOT_ENFORCED = "IsolationScopeNotEnforced"
    CALL_ID_REQUIRED = "CallIdRequired"
    CAPABILITY_DENIED = "CapabilityDenied"
    RESOURCES_EXCEED_CEILING = "ResourcesExceedCeiling"
    BACKEND_UNAVAILABLE = "BackendUnavailable"
    NO_BACKEND_CAN_SERVE = "NoBackendCanServe"
    STORAGE_NOT_SUPPORTED = "StorageNotSupported"


def _names(values: Iterable[str], empty: str = "none") -> str:
    items = [str(v) for v in values]
    return ", ".join(items) if items else empty


def _sorted_by_definition(values: Iterable[_E], enum: type[_E]) -> tuple[_E, ...]:
    wanted = set(values)
    return tuple(member for member in enum if member in wanted)


class SandboxRefusal(Exception):
    """Base of every admission refusal.

    ``reason`` is stable and machine-readable; ``backend`` names the backend that refused (or
    ``None`` when the refusal covers several); ``kind`` is the workload kind; ``detail`` is the
    check-specific part of the prose; ``message`` is the whole sentence.
    """

    reason: ClassVar[RefusalReason]

    def __init__(self, *, backend: str | None, kind: str, detail: str, message: str) -> None:
        super().__init__(message)
        self.backend = backend
        self.kind = kind
        self.detail = detail
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(reason={self.reason.value!r}, "
            f"backend={self.backend!r}, kind={self.kind!r})"
        )


def _raised_by(sources: Sequence[str]) -> str:
    return f" (floor raised by: {', '.join(sources)})" if sources else ""


class IsolationBelowFloor(SandboxRefusal):
    """The backend's declared isolation is below the effective floor, or is not a known rung.

    ``isolation`` is the backend's raw declaration; ``known`` is False when it is not on the
    ladder; ``floor`` is the effective floor; ``raised_by`` names who set it (host/scope/spec).
    """

    reason = RefusalReason.ISOLATION_BELOW_FLOOR

    def __init__(
        self,
        *,
        backend: str,
        kind: str,
        isolation: str,
        floor: Isolation,
        raised_by: Sequence[str] = (),
        known: bool = True,
    ) -> None:
        self.isolation = isolation
        self.floor = floor
        self.raised_by = tuple(raised_by)
        self.known = known
        if known:
            detail = (
                f"isolation {isolation} is below the effective floor {floor.value}"
                f"{_raised_by(raised_by)}"
            )
            message = (
                f"backend {backend!r} (isolation {isolation}) is below the effective floor "
                f"{floor.value} for kind {kind!r}{_raised_by(raised_by)}"
            )
        else:
            detail = (
                f"declared isolation {isolation!r} is not a rung on the ladder, so it cannot be "
                f"judged against the floor {floor.value}"
            )
            message = (
                f"backend {backend!r} declares isolation {isolation!r}, which is not a rung on "
                f"the ladder; kind {kind!r} is refused rather than guessing how it compares with "
                f"the effective floor {floor.value}{_raised_by(raised_by)}"
            )
        super().__init__(backend=backend, kind=kind, detail=detail, message=message)


class CapabilityNotSupported(SandboxRefusal):
    """The backend lacks capabilities the spec requires
    (``missing``; ``declared``: what it has)."""

    reason = RefusalReason.CAPABILITY_NOT_SUPPORTED

    def __init__(
        self,
        *,
        backend: str,
        kind: str,
        missing: Iterable[Capability],
        declared: Iterable[Capability],
    ) -> None:
        self.missing = _sorted_by_definition(missing, Capability)
        self.declared = _sorted_by_definition(declared, Capability)
        noun = "capability" if len(self.missing) == 1 else "capabilities"
        detail = (
            f"missing required {noun} {_names(self.missing)} (declares {_names(self.declared)})"
        )
        message = (
            f"backend {backend!r} cannot serve kind {kind!r}: it lacks the required "
            f"{noun} {_names(self.missing)} (it declares {_names(self.declared)})"
        )
        super().__init__(backend=backend, kind=kind, detail=detail, message=message)


class OsFamilyNotSupported(SandboxRefusal):
    """The spec asks for an OS family (``requested``) the backend does not declare.

    ``work_dir`` is set when the spec states no family and its workDir (a Windows path) is what
    asks for one.
    """

    reason = RefusalReason.OS_FAMILY_NOT_SUPPORTED

    def __init__(
        self,
        *,
        backend: str,
        kind: str,
        requested: OsFamily,
        declared: Iterable[OsFamily],
        work_dir: str | None = None,
    ) -> None:
        self.requested = requested
        self.declared = _sorted_by_definition(declared, OsFamily)
        self.work_dir = work_dir
        declared_text = _names(self.declared, empty="no OS family")
        why = f" (workDir {work_dir!r} is a {requested.value} path)" if work_dir else ""
        detail = f"requires OS family {requested.value}{why} (declares {declared_text})"
        message = (
            f"backend {backend!r} cannot serve kind {kind!r}: the spec requires OS family "
            f"{requested.value}{why} and the backend declares {declared_text}"
        )
        super().__init__(backend=backend, kind=kind, detail=detail, message=message)


@dataclass(frozen=True)
class TransferExcess:
    """One transfer limit the spec asks above the backend's ceiling.

    ``direction`` is ``filesIn`` or ``filesOut``; ``field`` the camelCase limit name.
    """

    direction: str
    field: str
    asked: int
    ceiling: int

    def describe(self) -> str:
        if self.field == "maxFiles":
            return f"{self.direction}.{self.field} {self.asked} > {self.ceiling}"
        return f"{self.direction}.{self.field} {_bytes(self.asked)} > {_bytes(self.ceiling)}"


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


class TransferLimitsNotPermitted(SandboxRefusal):
    """The spec's transfer limits exceed the backend's ceilings; the ask is refused, not clamped."""

    reason = RefusalReason.TRANSFER_LIMITS_NOT_PERMITTED

    def __init__(self, *, backend: str, kind: str, excesses: Sequence[TransferExcess]) -> None:
        self.excesses = tuple(excesses)
        listed = "; ".join(e.describe() for e in self.excesses)
        detail = f"transfer limits above the backend's ceilings ({listed})"
        message = (
            f"backend {backend!r} cannot serve kind {kind!r}: the spec asks for transfer limits "
            f"above the backend's ceilings ({listed}); a larger ask is refused, never clamped"
        )
        super().__init__(backend=backend, kind=kind, detail=detail, message=message)


class EgressNotEnforced(SandboxRefusal):
    """The backend does not enforce the spec's egress mode, or the host forbids ``unrestricted``.

    ``requested`` is the spec's mode; ``declared`` the backend's modes; ``host_forbids`` is True
    when the refusal comes from the host policy not allowing unrestricted egress; ``rules`` is
    True when the mode is declared but the spec's ``egressRules`` are not (the backend does not
    declare ``egressRules``, or ``rules_https``: not ``egressRulesHttps`` for a rule naming https);
    ``credentials`` is True when a rule names a credential and the backend does not declare
    ``egressCredentials``.
    """

    reason = RefusalReason.EGRESS_NOT_ENFORCED

    def __init__(
        self,
        *,
        backend: str,
        kind: str,
        requested: Egress,
        declared: Iterable[Egress],
        host_forbids: bool = False,
        rules: bool = False,
        rules_https: bool = False,
        credentials: bool = False,
    ) -> None:
        self.requested = requested
        self.declared = _sorted_by_definition(declared, Egress)
        self.host_forbids = host_forbids
        self.rules = rules or rules_https or credentials
        self.rules_https = rules_https
        self.credentials = credentials
        declared_text = _names(self.declared, empty="no egress modes")
        if credentials:
            detail = "egressRules credentials are not attached"
            message = (
                f"backend {backend!r} cannot serve kind {kind!r}: its egress hop does not attach "
                "egressRules credentials (it does not declare egressCredentials)"
            )
        elif rules_https:
            detail = "egressRules for https are not enforced"
            message = (
                f"backend {backend!r} cannot serve kind {kind!r}: its egress hop does not judge "
                "egressRules inside HTTPS (it does not declare egressRulesHttps)"
            )
        elif rules:
            detail = "egressRules (methods and paths) are not enforced"
            message = (
                f"backend {backend!r} cannot serve kind {kind!r}: its egress hop does not judge "
                "egressRules (methods and paths; it does not declare egressRules)"
            )
        elif host_forbids:
            detail = "unrestricted egress is not allowed by the host policy"
            message = (
                f"backend {backend!r} will not serve kind {kind!r} with unrestricted egress: the "
                "host policy does not allow unrestricted egress (allowUnrestrictedEgress is false)"
            )
        else:
            detail = f"egress mode {requested.value} is not enforced (declares {declared_text})"
            message = (
                f"backend {backend!r} cannot serve kind {kind!r}: it does not enforce egress mode "
                f"{requested.value} (it declares {declared_text})"
            )
        super().__init__(backend=backend, kind=kind, detail=detail, message=message)


class IsolationScopeNotEnforced(SandboxRefusal):
    """The backend cannot serve the effective isolation scope (``required``)."""

    reason = RefusalReason.ISOLATION_SCOPE_NOT_ENFORCED

    def __init__(
        self,
        *,
        backend: str,
        kind: str,
        required: IsolationScope,
        declared: Iterable[IsolationScope],
        raised_by: Sequence[str] = (),
    ) -> None:
        self.required = required
        self.declared = _sorted_by_definition(declared, IsolationScope)
        self.raised_by = tuple(raised_by)
        by = f" (required by: {', '.join(self.raised_by)})" if self.raised_by else ""
        declared_text = _names(self.declared, empty="no isolation scopes")
        detail = f"isolation scope {required.value}{by} is not served (declares {declared_text})"
        message = (
            f"backend {backend!r} cannot serve kind {kind!r} at isolation scope "
            f"{required.value}{by}: it declares {declared_text}"
        )
        super().__init__(backend=backend, kind=kind, detail=detail, message=message)


class StorageNotSupported(SandboxRefusal):
    """The spec asks for a persistent work volume (``storage``) and the backend does not keep
    one across suspend and resume (it declares no ``persistentStorage``)."""

    reason = RefusalReason.STORAGE_NOT_SUPPORTED

    def __init__(self, *, backend: str, kind: str) -> None:
        detail = "persistent storage is not served (the backend declares no persistentStorage)"
        message = (
            f"backend {backend!r} cannot serve kind {kind!r} with storage: it keeps no work "
            "volume across suspend and resume (persistentStorage is not declared)"
        )
        super().__init__(backend=backend, kind=kind, detail=detail, message=message)


class CallIdRequired(SandboxRefusal):
    """The effective isolation scope is ``call`` but the request names no call.

    Refused before any backend is judged (``backend`` is None): a sandbox keyed without a call
    id is the conversation's one sandbox, so serving it would let the calls meet in one
    filesystem, which is exactly what the raised scope forbids. ``raised_by`` names who asked
    for ``call`` (host and/or scope; the spec itself cannot, its schema then requires the id).
    """

    reason = RefusalReason.CALL_ID_REQUIRED

    def __init__(self, *, kind: str, raised_by: Sequence[str] = ()) -> None:
        self.raised_by = tuple(raised_by)
        by = f" (required by: {', '.join(self.raised_by)})" if self.raised_by else ""
        detail = f"isolation scope call{by} needs a call id, and none was given"
        message = (
            f"kind {kind!r} must run one sandbox per call (isolation scope call{by}), but the "
            "request names no call: ask with isolationScope call and the call's callId"
        )
        super().__init__(backend=None, kind=kind, detail=detail, message=message)


@dataclass(frozen=True)
class ResourceExcess:
    """One resource amount the spec states above the host's ceiling.

    ``field`` is the spec's entry (``requests.cpu``, ``limits.memory``, ...); ``ceiling_field``
    the host policy's (``maxRequests.cpu``, ``maxLimits.memory``, ...); amounts as written.
    ``built_in`` is True when the host policy sets no such ceiling and the built-in one applied.
    """

    field: str
    asked: str
    ceiling_field: str
    ceiling: str
    built_in: bool = False

    def describe(self) -> str:
        text = f"{self.field} {self.asked} > {self.ceiling_field} {self.ceiling}"
        if self.built_in:
            text += " (built-in; set hostPolicy.resources.maxLimits to change it)"
        return text


class ResourcesExceedCeiling(SandboxRefusal):
    """The spec asks for more CPU or memory than the host policy allows (``excesses``).

    Refused before any backend is judged (``backend`` is None): the ceilings are the host's
    (``hostPolicy.resources``), whichever backend would serve. A larger ask is refused, never
    clamped: a sandbox quietly given less memory than it asked for fails somewhere nobody looks.
    """

    reason = RefusalReason.RESOURCES_EXCEED_CEILING

    def __init__(self, *, kind: str, excesses: Sequence[ResourceExcess]) -> None:
        self.excesses = tuple(excesses)
        listed = "; ".join(e.describe() for e in self.excesses)
        detail = f"resources above the host's ceilings ({listed})"
        message = (
            f"kind {kind!r} asks for more than the host allows: {listed} "
            "(ceilings from hostPolicy.resources); a larger ask is refused, never clamped"
        )
        super().__init__(backend=None, kind=kind, detail=detail, message=message)


class CapabilityDenied(SandboxRefusal):
    """The spec requires capabilities the host denies outright (``denied``), whatever a backend
    declares: ``hostPolicy.deniedCapabilities``.

    Refused before any backend is judged (``backend`` is None), and under per-spec selection no
    next backend is tried: it is the host's posture, not a backend's gap. A hard stop, e.g.
    ``deniedCapabilities: [host_tools]`` closes the host-tool channel for every Sandbox the
    operator serves.
    """

    reason = RefusalReason.CAPABILITY_DENIED

    def __init__(self, *, kind: str, denied: Iterable[Capability]) -> None:
        self.denied = _sorted_by_definition(denied, Capability)
        noun = "capability" if len(self.denied) == 1 else "capabilities"
        detail = f"requires {noun} {_names(self.denied)}, which the host denies outright"
        message = (
            f"kind {kind!r} requires the {noun} {_names(self.denied)}, which this host denies "
            "outright (hostPolicy.deniedCapabilities): no backend may serve it here"
        )
        super().__init__(backend=None, kind=kind, detail=detail, message=message)


class BackendUnavailable(SandboxRefusal):
    """The backend passed every check but cannot serve right now (``unavailable_reason``)."""

    reason = RefusalReason.BACKEND_UNAVAILABLE

    def __init__(self, *, backend: str, kind: str, unavailable_reason: str = "") -> None:
        self.unavailable_reason = unavailable_reason
        why = f": {unavailable_reason}" if unavailable_reason else ""
        detail = f"unavailable{why}"
        message = f"backend {backend!r} is unavailable to serve kind {kind!r}{why}"
        super().__init__(backend=backend, kind=kind, detail=detail, message=message)


class NoBackendCanServe(SandboxRefusal):
    """Per-spec selection found no backend that passes; ``refusals`` holds each one's refusal,
    in registration order."""

    reason = RefusalReason.NO_BACKEND_CAN_SERVE

    def __init__(self, *, kind: str, refusals: Sequence[SandboxRefusal]) -> None:
        self.refusals = tuple(refusals)
        each = "; ".join(f"{r.backend!r} {r.reason.value}: {r.detail}" for r in self.refusals)
        detail = each or "no backends are registered"
        message = f"no registered backend can serve kind {kind!r}: {detail}"
        super().__init__(backend=None, kind=kind, detail=detail, message=message)

    def reason_for(self, backend: str) -> RefusalReason | None:
        """The reason ``backend`` refused, or None when it is not among the refusals."""
        for refusal in self.refusals:
            if refusal.backend == backend:
                return refusal.reason
        return None


class ConfigurationError(ValueError):
    """The operator's configuration is wrong; ``entry`` names which entry (e.g.
    ``hostPolicy.pinnedBackend`` or ``backends[1].isolation``)."""

    def __init__(self, entry: str, problem: str) -> None:
        self.entry = entry
        self.problem = problem
        super().__init__(f"configuration entry {entry}: {problem}")


#: Every refusal type, keyed by its reason. The client's refusal exceptions name these as their
#: ``refusal_type``; ``client.acquire_errors.check_condition_errors`` holds the two against each
#: other at import.
REFUSAL_TYPES: dict[RefusalReason, type[SandboxRefusal]] = {
    cls.reason: cls
    for cls in (
        IsolationBelowFloor,
        CapabilityNotSupported,
        OsFamilyNotSupported,
        TransferLimitsNotPermitted,
        EgressNotEnforced,
        IsolationScopeNotEnforced,
        CallIdRequired,
        CapabilityDenied,
        ResourcesExceedCeiling,
        BackendUnavailable,
        NoBackendCanServe,
        StorageNotSupported,
    )
}
