"""Admission policy: the six checks, backend selection and registration validation.

Pure functions over contract models; no Kubernetes, no I/O. The check order is fixed and part of
the contract: floor, capabilities, OS family, transfer ceilings, egress, isolation scope. A
backend that passes all six but is currently unavailable is refused last, with
``BackendUnavailable``, so a spec a backend can never serve always gets the permanent reason.
Before any backend is judged, :func:`select_backend` holds the spec's resources to the host's
ceilings (``ResourcesExceedCeiling``, see :mod:`sandbox_operator.policy.resources`), and the
admission it returns carries the spec with its resources resolved.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from sandbox_operator.contract import (
    ISOLATION_LADDER,
    BackendDeclarations,
    BackendUnavailable,
    CallIdRequired,
    CapabilityDenied,
    CapabilityNotSupported,
    ConfigurationError,
    Egress,
    EgressNotEnforced,
    HostPolicy,
    Isolation,
    IsolationBelowFloor,
    IsolationScope,
    IsolationScopeNotEnforced,
    NoBackendCanServe,
    OsFamily,
    OsFamilyNotSupported,
    SandboxRefusal,
    SandboxSpec,
    Selection,
    StorageNotSupported,
    TransferExcess,
    TransferLimits,
    TransferLimitsNotPermitted,
    UnknownIsolation,
    isolation_rank,
    isolation_scope_rank,
    parse_isolation,
)
from sandbox_operator.contract.workdir import DRIVE_LETTER_PATTERN

from .resources import check_resources, resolve_spec

#: Where a floor came from, in the order they are reported.
HOST: Final = "host"
SCOPE: Final = "scope"
SPEC: Final = "spec"

BACKEND_NAME_PATTERN: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class BackendProfile:
    """What the policy knows about one registered backend.

    ``isolation`` is the raw declared value, kept as given so an unknown rung can be reported as
    such rather than failing before the policy sees it. ``available`` and
    ``unavailable_reason`` describe whether it can serve right now (the reason is prose for a
    person and must carry no secrets or endpoints).
    """

    name: str
    isolation: str
    declarations: BackendDeclarations = field(default_factory=BackendDeclarations)
    available: bool = True
    unavailable_reason: str = ""

    @property
    def known_isolation(self) -> Isolation | None:
        """The declared rung, or None when it is not on the ladder."""
        try:
            return parse_isolation(self.isolation)
        except UnknownIsolation:
            return None


@dataclass(frozen=True)
class EffectiveFloor:
    """The strictest isolation floor, and which sources set it (``host``, ``scope``, ``spec``)."""

    isolation: Isolation
    raised_by: tuple[str, ...]


@dataclass(frozen=True)
class EffectiveIsolationScope:
    """The most separating isolation scope, and which sources require it."""

    isolation_scope: IsolationScope
    raised_by: tuple[str, ...]


@dataclass(frozen=True)
class Admission:
    """A spec admitted onto a backend, with the floor and isolation scope it was judged against.

    ``spec`` is the admitted spec with its resources resolved under the host policy
    (:func:`~sandbox_operator.policy.resources.resolve_spec`): what the backend driver is given.
    :func:`select_backend` always sets it.
    """

    backend: BackendProfile
    floor: Isolation
    isolation_scope: IsolationScope
    floor_raised_by: tuple[str, ...] = ()
    isolation_scope_raised_by: tuple[str, ...] = ()
    spec: SandboxSpec | None = None


def effective_floor(
    host: HostPolicy, spec: SandboxSpec, *, scope_floor: Isolation | None = None
) -> EffectiveFloor:
    """Strictest of the host's, the scope's and the spec's floors: they raise, never lower."""
    sources: list[tuple[str, Isolation]] = [(HOST, host.min_isolation)]
    if scope_floor is not None:
        sources.append((SCOPE, scope_floor))
    if spec.min_isolation is not None:
        sources.append((SPEC, spec.min_isolation))
    top = max(isolation_rank(value) for _, value in sources)
    return EffectiveFloor(
        isolation=ISOLATION_LADDER[top],
        raised_by=tuple(name for name, value in sources if isolation_rank(value) == top),
    )


def effective_isolation_scope(
    host: HostPolicy,
    spec: SandboxSpec,
    *,
    scope_min_isolation_scope: IsolationScope | None = None,
) -> EffectiveIsolationScope:
    """Most separating of the host's, the scope's and the spec's isolation scopes."""
    sources: list[tuple[str, IsolationScope]] = [(HOST, host.min_isolation_scope)]
    if scope_min_isolation_scope is not None:
        sources.append((SCOPE, scope_min_isolation_scope))
    sources.append((SPEC, spec.isolation_scope))
    top = max(isolation_scope_rank(value) for _, value in sources)
    winner = next(value for _, value in sources if isolation_scope_rank(value) == top)
    return EffectiveIsolationScope(
        isolation_scope=winner,
        raised_by=tuple(name for name, value in sources if isolation_scope_rank(value) == top),
    )


def check_call_key(
    host: HostPolicy,
    spec: SandboxSpec,
    call_id: str | None,
    *,
    scope_min_isolation_scope: IsolationScope | None = None,
) -> None:
    """Refuse a request keyed without a call when the effective isolation scope is ``call``.

    Runs before any backend is judged: the key, not a backend, is what is missing. Without it
    the sandbox would be the conversation's shared one, whatever the backend declares.
    """
    scope = effective_isolation_scope(
        host, spec, scope_min_isolation_scope=scope_min_isolation_scope
    )
    if scope.isolation_scope is IsolationScope.CALL and not call_id:
        raise CallIdRequired(kind=spec.kind, raised_by=scope.raised_by)


def required_os_family(spec: SandboxSpec) -> OsFamily | None:
    """The OS family ``spec`` needs: the one it states, else ``windows`` when its workDir is a
    Windows path (``C:\\work``), else None (a posix-looking path is also valid on Windows)."""
    if spec.requires_os_family is not None:
        return spec.requires_os_family
    if re.match(DRIVE_LETTER_PATTERN, spec.work_dir):
        return OsFamily.WINDOWS
    return None


def _transfer_excesses(spec: SandboxSpec, ceiling: TransferLimits) -> list[TransferExcess]:
    excesses: list[TransferExcess] = []
    for direction, asked in (("filesIn", spec.files_in), ("filesOut", spec.files_out)):
        for attr, wire in (
            ("max_bytes_per_file", "maxBytesPerFile"),
            ("max_total_bytes", "maxTotalBytes"),
            ("max_files", "maxFiles"),
        ):
            value = getattr(asked, attr)
            limit = getattr(ceiling, attr)
            if value > limit:
                excesses.append(TransferExcess(direction, wire, value, limit))
    return excesses


def check_egress(backend: BackendProfile, spec: SandboxSpec, *, allow_unrestricted: bool) -> None:
    """Raise :class:`EgressNotEnforced` unless ``backend`` enforces ``spec``'s egress: the mode
    (``unrestricted`` only where the host allows it), and its ``egressRules`` (and those judged
    inside HTTPS) only where the backend declares it judges them.

    Step 5 of :func:`check_backend`, and alone the judgement of an egress edit on a live Sandbox
    (docs/egress.md, "Editing egress on a live Sandbox"): the edit is judged against the backend
    that serves the sandbox, with the host's policy of now; the floor, capabilities and the rest
    of the admission were decided when it started and are not asked again.
    """
    name, kind, declared = backend.name, spec.kind, backend.declarations
    if spec.egress is Egress.UNRESTRICTED and not allow_unrestricted:
        raise EgressNotEnforced(
            backend=name,
            kind=kind,
            requested=spec.egress,
            declared=declared.egress_modes,
            host_forbids=True,
        )
    if spec.egress not in declared.egress_modes:
        raise EgressNotEnforced(
            backend=name, kind=kind, requested=spec.egress, declared=declared.egress_modes
        )
    # What the rules ask of the hop beyond hosts, each declared apart (refused with its flag).
    unenforced = {
        "rules": bool(spec.egress_rules) and not declared.egress_rules,
        "rules_https": not declared.egress_rules_https
        and any("https" in r.schemes for r in spec.egress_rules),
        "credentials": not declared.egress_credentials
        and any(r.credential for r in spec.egress_rules),
    }
    for flag, refused in unenforced.items():
        if refused:
            raise EgressNotEnforced(
                backend=name,
                kind=kind,
                requested=spec.egress,
                declared=declared.egress_modes,
                **{flag: True},
            )


def check_backend(
    backend: BackendProfile,
    spec: SandboxSpec,
    *,
    floor: Isolation,
    isolation_scope: IsolationScope,
    allow_unrestricted: bool,
    floor_raised_by: Sequence[str] = (),
    isolation_scope_raised_by: Sequence[str] = (),
) -> None:
    """Raise the first refusal ``backend`` gives ``spec``, in the fixed check order.

    ``floor`` and ``isolation_scope`` are the effective values (see :func:`effective_floor` and
    :func:`effective_isolation_scope`); ``allow_unrestricted`` is the host's
    ``allow_unrestricted_egress``. The ``*_raised_by`` sources only shape the message.
    """
    name, kind, declared = backend.name, spec.kind, backend.declarations

    # 1. Isolation floor; an unknown rung is refused, never guessed.
    rung = backend.known_isolation
    if rung is None or isolation_rank(rung) < isolation_rank(floor):
        raise IsolationBelowFloor(
            backend=name,
            kind=kind,
            isolation=backend.isolation,
            floor=floor,
            raised_by=floor_raised_by,
            known=rung is not None,
        )

    # 2. Capabilities.
    missing = spec.requires - declared.capabilities
    if missing:
        raise CapabilityNotSupported(
            backend=name, kind=kind, missing=missing, declared=declared.capabilities
        )

    # 3. OS family: silence refuses only a spec that asks. A drive-letter workDir asks for
    #    windows: on a posix guest it is a relative directory named "C:" (or a mount that fails).
    family = required_os_family(spec)
    if family is not None and family not in declared.os_families:
        raise OsFamilyNotSupported(
            backend=name,
            kind=kind,
            requested=family,
            declared=declared.os_families,
            work_dir=spec.work_dir if spec.requires_os_family is None else None,
        )

    # 4. Transfer ceilings: a bigger ask is refused, never clamped.
    excesses = _transfer_excesses(spec, declared.limits)
    if excesses:
        raise TransferLimitsNotPermitted(backend=name, kind=kind, excesses=excesses)

    # 5. Egress: the host may forbid unrestricted outright; otherwise the backend must declare
    #    the exact mode (stricter or looser both refuse), and the rules it judges.
    check_egress(backend, spec, allow_unrestricted=allow_unrestricted)

    # 6. Isolation scope.
    if isolation_scope not in declared.isolation_scopes:
        raise IsolationScopeNotEnforced(
            backend=name,
            kind=kind,
            required=isolation_scope,
            declared=declared.isolation_scopes,
            raised_by=isolation_scope_raised_by,
        )

    # 7. Persistent storage: a work volume that outlives the compute is a promise the backend
    #    must declare it keeps (silence keeps nothing).
    if spec.storage is not None and not declared.persistent_storage:
        raise StorageNotSupported(backend=name, kind=kind)

    # Static checks passed; is it there to serve?
    if not backend.available:
        raise BackendUnavailable(
            backend=name, kind=kind, unavailable_reason=backend.unavailable_reason
        )


def resolve_fixed_backend(host: HostPolicy, backends: Sequence[BackendProfile]) -> BackendProfile:
    """The backend fixed selection uses: the pinned one, else the first registered."""
    if not backends:
        raise ConfigurationError("backends", "no backends are registered")
    if host.pinned_backend is None:
        return backends[0]
    for backend in backends:
        if backend.name == host.pinned_backend:
            return backend
    names = ", ".join(repr(b.name) for b in backends)
    raise ConfigurationError(
        "hostPolicy.pinnedBackend",
        f"pins backend {host.pinned_backend!r}, which is not registered (registered: {names})",
    )


def validate_registration(host: HostPolicy, backends: Sequence[BackendProfile]) -> tuple[str, ...]:
    """Judge a backend set against the host policy once, at construction.

    Raises :class:`ConfigurationError` naming the wrong entry; returns warnings (prose) for
    arrangements that are allowed but worth a person's attention.
    """
    if not backends:
        raise ConfigurationError("backends", "no backends are registered")
    seen: dict[str, int] = {}
    for index, backend in enumerate(backends):
        if not BACKEND_NAME_PATTERN.fullmatch(backend.name):
            raise ConfigurationError(
                f"backends[{index}].name",
                f"backend name {backend.name!r} must be a DNS label "
                "(lower-case letters, digits and '-', at most 63 characters)",
            )
        if backend.name in seen:
            raise ConfigurationError(
                f"backends[{index}].name",
                f"backend name {backend.name!r} is already used by backends[{seen[backend.name]}]",
            )
        seen[backend.name] = index
    if host.pinned_backend is not None and host.selection is not Selection.FIXED:
        raise ConfigurationError(
            "hostPolicy.pinnedBackend", "a pinned backend is only valid with selection fixed"
        )

    floor = host.min_isolation
    allowed = ", ".join(r.value for r in ISOLATION_LADDER)
    warnings: list[str] = []

    def below(backend: BackendProfile) -> bool:
        rung = backend.known_isolation
        return rung is None or isolation_rank(rung) < isolation_rank(floor)

    if host.selection is Selection.FIXED:
        chosen = resolve_fixed_backend(host, backends)
        index = seen[chosen.name]
        if chosen.known_isolation is None:
            raise ConfigurationError(
                f"backends[{index}].isolation",
                f"backend {chosen.name!r} declares isolation {chosen.isolation!r}, which is not "
                f"a rung on the ladder (allowed: {allowed})",
            )
        if below(chosen):
            raise ConfigurationError(
                f"backends[{index}].isolation",
                f"backend {chosen.name!r} (isolation {chosen.isolation}) is below the host "
                f"floor {floor.value}, and fixed selection would use it for every sandbox",
            )
        for backend in backends:
            if backend is not chosen and backend.known_isolation is None:
                warnings.append(
                    f"backend {backend.name!r} declares isolation {backend.isolation!r}, which is "
                    f"not a rung on the ladder (allowed: {allowed}); fixed selection does not "
                    "use it"
                )
    else:
        if all(below(b) for b in backends):
            raise ConfigurationError(
                "backends",
                f"no registered backend clears the host floor {floor.value} "
                f"({', '.join(f'{b.name!r}: {b.isolation}' for b in backends)})",
            )
        for backend in backends:
            if backend.known_isolation is None:
                warnings.append(
                    f"backend {backend.name!r} declares isolation {backend.isolation!r}, which is "
                    f"not a rung on the ladder (allowed: {allowed}); per-spec selection never "
                    "routes to it"
                )
            elif below(backend):
                warnings.append(
                    f"backend {backend.name!r} (isolation {backend.isolation}) is below the host "
                    f"floor {floor.value}; it stays registered, so disposal still reaches it, "
                    "but per-spec selection never routes to it"
                )
    for backend in backends:
        if not backend.declarations.egress_modes:
            warnings.append(
                f"backend {backend.name!r} declares no egress modes, so it refuses every spec"
            )
    return tuple(warnings)


def check_host_denials(host: HostPolicy, spec: SandboxSpec) -> None:
    """Refuse ``spec`` with :class:`CapabilityDenied` when it requires a capability in
    ``host.denied_capabilities``: a statement about the spec against the host's posture, not
    about what any backend could do."""
    denied = spec.requires & host.denied_capabilities
    if denied:
        raise CapabilityDenied(kind=spec.kind, denied=denied)


def select_backend(
    host: HostPolicy,
    backends: Sequence[BackendProfile],
    spec: SandboxSpec,
    *,
    scope_floor: Isolation | None = None,
    scope_min_isolation_scope: IsolationScope | None = None,
) -> Admission:
    """Pick the backend that serves ``spec``, or raise the refusal.

    First the host's hard stops (:class:`CapabilityDenied`: a capability the host refuses
    outright) and resource ceilings (:class:`ResourcesExceedCeiling`), whatever the selection,
    no backend judged: there is no next backend to try for the host's own posture. Then
    ``fixed``: the pinned (or first) backend, or its own refusal.
    ``perSpec``: the first registered backend that passes every check; the same spec and backends
    always give the same backend, available or not (an unavailable one is its
    :class:`BackendUnavailable`, never a move to the next); when none passes,
    :class:`NoBackendCanServe` names each backend with its reason. The returned
    :class:`Admission` carries ``spec`` with its resources resolved under ``host`` (pass that
    spec to the backend).
    """
    check_host_denials(host, spec)
    check_resources(host, spec)
    resolved = resolve_spec(host, spec)
    floor = effective_floor(host, spec, scope_floor=scope_floor)
    scope = effective_isolation_scope(
        host, spec, scope_min_isolation_scope=scope_min_isolation_scope
    )

    def admit(backend: BackendProfile) -> Admission:
        check_backend(
            backend,
            spec,
            floor=floor.isolation,
            isolation_scope=scope.isolation_scope,
            allow_unrestricted=host.allow_unrestricted_egress,
            floor_raised_by=floor.raised_by,
            isolation_scope_raised_by=scope.raised_by,
        )
        return Admission(
            backend=backend,
            floor=floor.isolation,
            isolation_scope=scope.isolation_scope,
            floor_raised_by=floor.raised_by,
            isolation_scope_raised_by=scope.raised_by,
            spec=resolved,
        )

    if host.selection is Selection.FIXED:
        return admit(resolve_fixed_backend(host, backends))

    if not backends:
        raise ConfigurationError("backends", "no backends are registered")
    refusals: list[SandboxRefusal] = []
    for backend in backends:
        try:
            return admit(backend)
        except BackendUnavailable:
            # The spec and the declarations chose this backend (it passed all six checks): its
            # being down is this spec's failure, never a move to the next one. A route that
            # depended on availability would land one spec on different backends over time,
            # and a conversation's warm sandbox on one it was never meant for.
            raise
        except SandboxRefusal as refusal:
            refusals.append(refusal)
    raise NoBackendCanServe(kind=spec.kind, refusals=refusals)


def admit_request(
    host: HostPolicy,
    backends: Sequence[BackendProfile],
    spec: SandboxSpec,
    *,
    call_id: str | None,
    scope_floor: Isolation | None = None,
    scope_min_isolation_scope: IsolationScope | None = None,
) -> Admission:
    """The whole admission of a keyed request: :func:`check_call_key`, then
    :func:`select_backend`. The operator, ``sandbox-operator check`` and the test kit judge
    through this one function, so the order (the key before any backend) cannot differ
    between them. ``call_id`` is the key's call part, ``""`` when the key has none; None means
    there is no key at all (a bare spec judged by ``sandbox-operator check``), which skips the
    per-call check: without a key there is nothing to find missing."""
    if call_id is not None:
        check_call_key(host, spec, call_id, scope_min_isolation_scope=scope_min_isolation_scope)
    return select_backend(
        host,
        backends,
        spec,
        scope_floor=scope_floor,
        scope_min_isolation_scope=scope_min_isolation_scope,
    )
