"""Unit tests of sandbox_operator.policy: the six checks, floors, selection, registration."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox_operator.contract import (
    ISOLATION_LADDER,
    BackendDeclarations,
    BackendUnavailable,
    CallIdRequired,
    Capability,
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
    RefusalReason,
    ResourceExcess,
    ResourceList,
    ResourceRequirements,
    ResourcesExceedCeiling,
    SandboxRefusal,
    SandboxSpec,
    Selection,
    TransferLimits,
    TransferLimitsNotPermitted,
    isolation_rank,
    isolation_scope_rank,
    parse_quantity,
)
from sandbox_operator.policy import (
    BackendProfile,
    admit_request,
    check_backend,
    check_call_key,
    check_resources,
    effective_floor,
    effective_isolation_scope,
    limit_ceilings,
    resolve_fixed_backend,
    resolve_resources,
    resolve_spec,
    select_backend,
    validate_registration,
)

MiB = 1024 * 1024

FULL = BackendDeclarations(
    capabilities=frozenset(Capability),
    limits=TransferLimits(max_bytes_per_file=64 * MiB, max_total_bytes=256 * MiB, max_files=512),
    egress_modes=frozenset({Egress.CLOSED, Egress.ALLOWLIST}),
    os_families=frozenset({OsFamily.POSIX}),
    isolation_scopes=frozenset(IsolationScope),
)


def backend(
    name: str = "acas",
    isolation: str = "microvm",
    declarations: BackendDeclarations = FULL,
    **kw: Any,
) -> BackendProfile:
    return BackendProfile(name=name, isolation=isolation, declarations=declarations, **kw)


def spec(**kw: Any) -> SandboxSpec:
    return SandboxSpec.model_validate({"kind": "python", "image": "python:1", **kw})


def check(b: BackendProfile, s: SandboxSpec, host: HostPolicy | None = None) -> None:
    host = host or HostPolicy()
    floor = effective_floor(host, s)
    scope = effective_isolation_scope(host, s)
    check_backend(
        b,
        s,
        floor=floor.isolation,
        isolation_scope=scope.isolation_scope,
        allow_unrestricted=host.allow_unrestricted_egress,
        floor_raised_by=floor.raised_by,
        isolation_scope_raised_by=scope.raised_by,
    )


def declared(**kw: Any) -> BackendDeclarations:
    return FULL.model_copy(update=kw)


# --- each check: positive control, then its refusal ------------------------------------------


def test_positive_control_passes_every_check() -> None:
    check(backend(), spec())
    check(
        backend(),
        spec(
            minIsolation="microvm",
            requires=["exec", "files_in", "files_out", "run_code"],
            requiresOsFamily="posix",
            egress="allowlist",
            egressAllow=["pypi.org"],
            isolationScope="call",
            filesOut={"maxBytesPerFile": 64 * MiB, "maxTotalBytes": 256 * MiB, "maxFiles": 512},
        ),
    )


CASES: list[tuple[str, Callable[[], BackendProfile], SandboxSpec, type[SandboxRefusal], str]] = [
    (
        "floor",
        lambda: backend(isolation="container"),
        spec(),
        IsolationBelowFloor,
        "backend 'acas' (isolation container) is below the effective floor microvm for kind "
        "'python' (floor raised by: host)",
    ),
    (
        "floor raised by spec",
        lambda: backend(isolation="microvm"),
        spec(minIsolation="vm"),
        IsolationBelowFloor,
        "floor raised by: spec",
    ),
    (
        "unknown rung",
        lambda: backend(isolation="process"),
        spec(),
        IsolationBelowFloor,
        "declares isolation 'process', which is not a rung on the ladder",
    ),
    (
        "capabilities",
        lambda: backend(declarations=declared(capabilities=frozenset({Capability.EXEC}))),
        spec(requires=["exec", "files_in", "run_code"]),
        CapabilityNotSupported,
        "lacks the required capabilities run_code, files_in (it declares exec)",
    ),
    (
        "os family",
        lambda: backend(declarations=declared(os_families=frozenset({OsFamily.POSIX}))),
        spec(requiresOsFamily="windows"),
        OsFamilyNotSupported,
        "requires OS family windows and the backend declares posix",
    ),
    (
        "transfer ceilings",
        lambda: backend(declarations=declared(limits=TransferLimits())),
        spec(filesOut={"maxTotalBytes": 64 * MiB, "maxFiles": 100}),
        TransferLimitsNotPermitted,
        "filesOut.maxTotalBytes 64 MiB > 32 MiB; filesOut.maxFiles 100 > 64",
    ),
    (
        "egress mode not declared",
        lambda: backend(declarations=declared(egress_modes=frozenset({Egress.CLOSED}))),
        spec(egress="allowlist", egressAllow=["pypi.org"]),
        EgressNotEnforced,
        "does not enforce egress mode allowlist (it declares closed)",
    ),
    (
        "unrestricted without host consent",
        lambda: backend(declarations=declared(egress_modes=frozenset(Egress))),
        spec(egress="unrestricted"),
        EgressNotEnforced,
        "host policy does not allow unrestricted egress",
    ),
    (
        "isolation scope",
        lambda: backend(
            declarations=declared(isolation_scopes=frozenset({IsolationScope.CONVERSATION}))
        ),
        spec(isolationScope="call"),
        IsolationScopeNotEnforced,
        "at isolation scope call (required by: spec): it declares conversation",
    ),
    (
        "unavailable",
        lambda: backend(available=False, unavailable_reason="service reports 503"),
        spec(),
        BackendUnavailable,
        "backend 'acas' is unavailable to serve kind 'python': service reports 503",
    ),
]


@pytest.mark.parametrize(
    "make_backend, s, refusal, needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_each_check_refuses_with_its_type_and_reason(
    make_backend: Callable[[], BackendProfile],
    s: SandboxSpec,
    refusal: type[SandboxRefusal],
    needle: str,
) -> None:
    b = make_backend()
    with pytest.raises(SandboxRefusal) as exc:
        check(b, s)
    assert type(exc.value) is refusal
    assert exc.value.reason is refusal.reason
    assert exc.value.reason.value == refusal.__name__
    assert exc.value.backend == "acas" and exc.value.kind == "python"
    assert needle in exc.value.message
    assert str(exc.value) == exc.value.message
    assert "'acas'" in exc.value.message and "'python'" in exc.value.message


def test_refusals_carry_fields_to_branch_on() -> None:
    with pytest.raises(IsolationBelowFloor) as floor:
        check(backend(isolation="hardened_container"), spec())
    assert floor.value.floor is Isolation.MICROVM and floor.value.isolation == "hardened_container"
    assert floor.value.raised_by == ("host",) and floor.value.known
    with pytest.raises(CapabilityNotSupported) as caps:
        check(backend(declarations=declared(capabilities=frozenset())), spec())
    assert caps.value.missing == (Capability.EXEC, Capability.FILES_IN)
    with pytest.raises(TransferLimitsNotPermitted) as limits:
        check(
            backend(declarations=declared(limits=TransferLimits())), spec(filesIn={"maxFiles": 65})
        )
    (excess,) = limits.value.excesses
    assert (excess.direction, excess.field, excess.asked, excess.ceiling) == (
        "filesIn",
        "maxFiles",
        65,
        64,
    )


def test_checks_run_in_the_fixed_order() -> None:
    # Fails floor, capabilities, OS family, transfer, egress and scope at once: floor first.
    worst = backend(isolation="container", declarations=BackendDeclarations(), available=False)
    s = spec(
        requires=["run_code"],
        requiresOsFamily="posix",
        filesIn={"maxFiles": 100},
        egress="allowlist",
        isolationScope="call",
    )
    order = [
        IsolationBelowFloor,
        CapabilityNotSupported,
        OsFamilyNotSupported,
        TransferLimitsNotPermitted,
        EgressNotEnforced,
        IsolationScopeNotEnforced,
        BackendUnavailable,
    ]
    fixes: list[Callable[[BackendProfile], BackendProfile]] = [
        lambda b: BackendProfile(b.name, "vm", b.declarations, b.available),
        lambda b: BackendProfile(
            b.name,
            b.isolation,
            b.declarations.model_copy(update={"capabilities": FULL.capabilities}),
            b.available,
        ),
        lambda b: BackendProfile(
            b.name,
            b.isolation,
            b.declarations.model_copy(update={"os_families": FULL.os_families}),
            b.available,
        ),
        lambda b: BackendProfile(
            b.name,
            b.isolation,
            b.declarations.model_copy(update={"limits": FULL.limits}),
            b.available,
        ),
        lambda b: BackendProfile(
            b.name,
            b.isolation,
            b.declarations.model_copy(update={"egress_modes": FULL.egress_modes}),
            b.available,
        ),
        lambda b: BackendProfile(
            b.name,
            b.isolation,
            b.declarations.model_copy(update={"isolation_scopes": FULL.isolation_scopes}),
            b.available,
        ),
        lambda b: BackendProfile(b.name, b.isolation, b.declarations, True),
    ]
    current = worst
    for expected, fix in zip(order, fixes, strict=True):
        with pytest.raises(SandboxRefusal) as exc:
            check(current, s)
        assert type(exc.value) is expected
        current = fix(current)
    check(current, s)


# --- silence rules ----------------------------------------------------------------------------


def silent(isolation: str = "microvm", **kw: Any) -> BackendProfile:
    """A backend that states only its egress modes (the one declaration it must make)."""
    return backend(isolation=isolation, declarations=BackendDeclarations(**kw))


def test_silent_capabilities_mean_exec_and_files_in() -> None:
    b = silent(egress_modes={Egress.CLOSED})
    check(b, spec())
    check(b, spec(requires=["exec"]))
    with pytest.raises(CapabilityNotSupported):
        check(b, spec(requires=["exec", "files_in", "files_out"]))


def test_silent_egress_refuses_every_spec() -> None:
    b = silent()
    for s in (spec(), spec(egress="allowlist"), spec(egress="unrestricted")):
        with pytest.raises(EgressNotEnforced):
            check(b, s, HostPolicy(allow_unrestricted_egress=True))
    with pytest.raises(EgressNotEnforced) as exc:
        check(b, spec())
    assert "it declares no egress modes" in exc.value.message


def test_egress_mismatch_is_refused_in_both_directions() -> None:
    only_allowlist = silent(egress_modes={Egress.ALLOWLIST})
    only_closed = silent(egress_modes={Egress.CLOSED})
    with pytest.raises(EgressNotEnforced):  # backend would confine more than asked
        check(only_allowlist, spec())
    with pytest.raises(EgressNotEnforced):  # backend would confine less than asked
        check(only_closed, spec(egress="allowlist", egressAllow=["pypi.org"]))
    check(only_allowlist, spec(egress="allowlist", egressAllow=["pypi.org"]))


def test_egress_rules_need_a_backend_that_declares_them() -> None:
    # #38 item 2: a backend whose egress hop judges hosts only would let every method and path
    # through (or, as acas, drop the host): a spec with egressRules is refused there.
    ruled = spec(
        egress="allowlist",
        egressRules=[{"host": "api.example.com", "schemes": ["http"], "methods": ["GET"]}],
    )
    hosts_only = silent(egress_modes={Egress.ALLOWLIST})
    with pytest.raises(EgressNotEnforced) as exc:
        check(hosts_only, ruled)
    assert exc.value.rules and not exc.value.host_forbids
    assert "egressRules" in exc.value.message
    check(hosts_only, spec(egress="allowlist", egressAllow=["pypi.org"]))
    check(silent(egress_modes={Egress.ALLOWLIST}, egress_rules=True), ruled)
    # A rule naming https needs the hop to terminate TLS (#38 item 1): declared apart.
    https = spec(
        egress="allowlist",
        egressRules=[{"host": "api.example.com", "schemes": ["https"], "methods": ["GET"]}],
    )
    with pytest.raises(EgressNotEnforced) as exc:
        check(silent(egress_modes={Egress.ALLOWLIST}, egress_rules=True), https)
    assert exc.value.rules_https and "egressRulesHttps" in exc.value.message
    check(
        silent(egress_modes={Egress.ALLOWLIST}, egress_rules=True, egress_rules_https=True), https
    )


def test_a_credential_needs_a_backend_whose_hop_attaches_it() -> None:
    # #38 item 3: a backend that judges https rules but does not attach credentials would send
    # the request without the header (or, worse, leave it to the guest): refused at admission.
    rule = {"host": "api.example.com", "schemes": ["https"], "methods": ["GET"]}
    credential = {"secretName": "api-token", "key": "token"}
    attached = spec(egress="allowlist", egressRules=[{**rule, "credential": credential}])
    https = dict(egress_modes={Egress.ALLOWLIST}, egress_rules=True, egress_rules_https=True)
    with pytest.raises(EgressNotEnforced) as exc:
        check(silent(**https), attached)
    assert exc.value.credentials and exc.value.rules and not exc.value.rules_https
    assert "egressCredentials" in exc.value.message
    check(silent(**https), spec(egress="allowlist", egressRules=[rule]))
    check(silent(**https, egress_credentials=True), attached)


def test_unrestricted_needs_host_consent_and_a_declaring_backend() -> None:
    open_backend = silent(egress_modes=set(Egress))
    allow = HostPolicy(allow_unrestricted_egress=True)
    check(open_backend, spec(egress="unrestricted"), allow)
    with pytest.raises(EgressNotEnforced) as exc:
        check(open_backend, spec(egress="unrestricted"))
    assert exc.value.host_forbids
    with pytest.raises(EgressNotEnforced) as exc:
        check(silent(egress_modes={Egress.CLOSED}), spec(egress="unrestricted"), allow)
    assert not exc.value.host_forbids


def test_silent_os_families_refuse_only_a_spec_that_asks() -> None:
    b = silent(egress_modes={Egress.CLOSED})
    check(b, spec())
    for family in OsFamily:
        with pytest.raises(OsFamilyNotSupported) as exc:
            check(b, spec(requiresOsFamily=family.value))
        assert "the backend declares no OS family" in exc.value.message


def test_silent_limits_are_the_default_ceilings_and_a_bigger_ask_is_refused() -> None:
    b = silent(egress_modes={Egress.CLOSED})
    check(b, spec(filesIn=TransferLimits().to_wire(), filesOut=TransferLimits().to_wire()))
    for field in ("maxBytesPerFile", "maxTotalBytes", "maxFiles"):
        bigger = TransferLimits().to_wire()
        bigger[field] += 1
        if field == "maxBytesPerFile":
            bigger["maxTotalBytes"] += 1
        with pytest.raises(TransferLimitsNotPermitted) as exc:
            check(b, spec(filesOut=bigger))
        assert any(e.field == field for e in exc.value.excesses)
        assert "never clamped" in exc.value.message
    check(b, spec(filesIn={"maxFiles": 1}))  # a smaller ask is fine


def test_silent_isolation_scopes_mean_conversation() -> None:
    b = silent(egress_modes={Egress.CLOSED})
    check(b, spec())
    with pytest.raises(IsolationScopeNotEnforced):
        check(b, spec(isolationScope="call"))
    with pytest.raises(IsolationScopeNotEnforced) as exc:
        check(b, spec(), HostPolicy(min_isolation_scope=IsolationScope.CALL))
    assert exc.value.raised_by == ("host",)


def test_a_raised_call_scope_needs_a_call_id() -> None:
    host_call = HostPolicy(min_isolation_scope=IsolationScope.CALL)
    # Nobody asks for call: no call id is needed.
    check_call_key(HostPolicy(), spec(), None)
    check_call_key(HostPolicy(), spec(), "")
    # The host asks for call and the request names no call: refused, naming who asked.
    with pytest.raises(CallIdRequired) as exc:
        check_call_key(host_call, spec(), "")
    assert exc.value.reason is RefusalReason.CALL_ID_REQUIRED
    assert exc.value.raised_by == ("host",)
    assert exc.value.backend is None
    assert "required by: host" in exc.value.message and "callId" in exc.value.message
    # The conversation's scope asks for it.
    with pytest.raises(CallIdRequired) as exc:
        check_call_key(HostPolicy(), spec(), None, scope_min_isolation_scope=IsolationScope.CALL)
    assert exc.value.raised_by == ("scope",)
    # A per-call request with its call id passes, whoever raised the scope.
    check_call_key(host_call, spec(isolationScope="call"), "call-7")
    check_call_key(
        HostPolicy(), spec(isolationScope="call"), "call-7",
        scope_min_isolation_scope=IsolationScope.CALL,
    )  # fmt: skip


def test_admit_request_judges_the_key_before_any_backend() -> None:
    host_call = HostPolicy(min_isolation_scope=IsolationScope.CALL)
    no_backend_serves_call = backend(declarations=declared(isolation_scopes=frozenset()))
    # A keyed request without its call: refused for the key even though no backend could serve
    # it either (select_backend alone refuses for the backend: IsolationScopeNotEnforced).
    with pytest.raises(CallIdRequired):
        admit_request(host_call, [no_backend_serves_call], spec(), call_id="")
    with pytest.raises(IsolationScopeNotEnforced):
        select_backend(host_call, [no_backend_serves_call], spec())
    # No key at all (a bare spec): the per-call check is skipped, the backends still judge.
    with pytest.raises(IsolationScopeNotEnforced):
        admit_request(host_call, [no_backend_serves_call], spec(), call_id=None)
    # With its call: the same admission select_backend gives.
    got = admit_request(host_call, [backend()], spec(isolationScope="call"), call_id="c-1")
    assert got == select_backend(host_call, [backend()], spec(isolationScope="call"))
    assert got.backend.name == "acas"


def test_observes_egress_is_informational() -> None:
    check(silent(egress_modes={Egress.CLOSED}, observes_egress=True), spec())


# --- floors only raise ------------------------------------------------------------------------

rungs = st.sampled_from(list(Isolation))
optional_rungs = st.none() | rungs
scopes = st.sampled_from(list(IsolationScope))


@given(host=rungs, scope=optional_rungs, own=optional_rungs)
def test_effective_floor_is_the_strictest_and_never_lowers(
    host: Isolation, scope: Isolation | None, own: Isolation | None
) -> None:
    s = spec(minIsolation=own.value if own else None)
    floor = effective_floor(HostPolicy(min_isolation=host), s, scope_floor=scope)
    given_floors = [f for f in (host, scope, own) if f is not None]
    assert floor.isolation >= host
    for f in given_floors:
        assert floor.isolation >= f
    assert floor.isolation in given_floors
    assert isolation_rank(floor.isolation) == max(isolation_rank(f) for f in given_floors)
    assert floor.raised_by and set(floor.raised_by) <= {"host", "scope", "spec"}


@given(host=scopes, scope=st.none() | scopes, own=scopes)
def test_effective_isolation_scope_only_raises(
    host: IsolationScope, scope: IsolationScope | None, own: IsolationScope
) -> None:
    result = effective_isolation_scope(
        HostPolicy(min_isolation_scope=host),
        spec(isolationScope=own.value),
        scope_min_isolation_scope=scope,
    )
    for s in (host, scope, own):
        if s is not None:
            assert isolation_scope_rank(result.isolation_scope) >= isolation_scope_rank(s)


def test_a_spec_cannot_lower_the_host_floor() -> None:
    floor = effective_floor(HostPolicy(), spec(minIsolation="none"))
    assert floor.isolation is Isolation.MICROVM and floor.raised_by == ("host",)
    with pytest.raises(IsolationBelowFloor):
        check(backend(isolation="none"), spec(minIsolation="none"))


def test_scope_floor_raises() -> None:
    host = HostPolicy(min_isolation=Isolation.CONTAINER, selection=Selection.PER_SPEC)
    backends = [backend("runc", "container"), backend("kata", "microvm")]
    assert select_backend(host, backends, spec()).backend.name == "runc"
    admitted = select_backend(host, backends, spec(), scope_floor=Isolation.MICROVM)
    assert admitted.backend.name == "kata"
    assert admitted.floor is Isolation.MICROVM and admitted.floor_raised_by == ("scope",)
    with pytest.raises(NoBackendCanServe):
        select_backend(host, backends, spec(), scope_floor=Isolation.VM)


# --- selection --------------------------------------------------------------------------------


def test_fixed_selection_uses_the_first_or_the_pinned_backend() -> None:
    a, b = backend("a", "vm"), backend("b", "vm")
    assert select_backend(HostPolicy(), [a, b], spec()).backend is a
    assert select_backend(HostPolicy(pinned_backend="b"), [a, b], spec()).backend is b
    with pytest.raises(ConfigurationError) as exc:
        select_backend(HostPolicy(pinned_backend="c"), [a, b], spec())
    assert exc.value.entry == "hostPolicy.pinnedBackend"
    with pytest.raises(ConfigurationError) as exc:
        resolve_fixed_backend(HostPolicy(), [])
    assert exc.value.entry == "backends"


def test_fixed_selection_refuses_with_the_backends_own_refusal() -> None:
    a = backend("a", "vm", declared(capabilities=frozenset({Capability.EXEC})))
    b = backend("b", "vm")
    with pytest.raises(CapabilityNotSupported) as exc:
        select_backend(HostPolicy(), [a, b], spec())
    assert exc.value.backend == "a"  # b would pass, but fixed selection never moves


def test_per_spec_routes_to_the_first_backend_that_passes() -> None:
    host = HostPolicy(selection=Selection.PER_SPEC)
    runc = backend("runc", "container")
    narrow = backend("narrow", "microvm", declared(capabilities=frozenset({Capability.EXEC})))
    wide = backend("wide", "vm")
    admitted = select_backend(host, [runc, narrow, wide], spec())
    assert admitted.backend is wide
    assert admitted.floor is Isolation.MICROVM
    assert admitted.isolation_scope is IsolationScope.CONVERSATION
    assert select_backend(host, [runc, narrow, wide], spec(requires=["exec"])).backend is narrow


def test_per_spec_refusal_names_every_backend_with_its_reason() -> None:
    host = HostPolicy(selection=Selection.PER_SPEC)
    backends = [
        backend("runc", "container"),
        backend("narrow", "microvm", declared(capabilities=frozenset({Capability.EXEC}))),
        backend("closed", "vm", declared(egress_modes=frozenset())),
    ]
    with pytest.raises(NoBackendCanServe) as exc:
        select_backend(host, backends, spec())
    refusal = exc.value
    assert refusal.reason is RefusalReason.NO_BACKEND_CAN_SERVE
    assert refusal.backend is None and refusal.kind == "python"
    assert [r.backend for r in refusal.refusals] == ["runc", "narrow", "closed"]
    assert [r.reason for r in refusal.refusals] == [
        RefusalReason.ISOLATION_BELOW_FLOOR,
        RefusalReason.CAPABILITY_NOT_SUPPORTED,
        RefusalReason.EGRESS_NOT_ENFORCED,
    ]
    assert refusal.reason_for("narrow") is RefusalReason.CAPABILITY_NOT_SUPPORTED
    assert refusal.reason_for("missing") is None
    for name in ("'runc'", "'narrow'", "'closed'", "IsolationBelowFloor"):
        assert name in refusal.message


def test_per_spec_route_does_not_depend_on_availability() -> None:
    """#25 item 5: the route is a function of the spec and the declarations. The first backend
    that passes the six checks is the route; when it is down, the spec fails with its
    BackendUnavailable and never lands on the next one (which would serve it)."""
    host = HostPolicy(selection=Selection.PER_SPEC)
    first = backend("down", "vm", available=False, unavailable_reason="quota exhausted")
    second = backend("up", "microvm")
    with pytest.raises(BackendUnavailable) as exc:
        select_backend(host, [first, second], spec())
    assert exc.value.backend == "down" and "quota exhausted" in exc.value.message
    # Up again: the same backend, as always.
    assert select_backend(host, [backend("down", "vm"), second], spec()).backend.name == "down"
    # A backend refused by the checks is still passed over, down or not.
    below = backend("weak", "container", available=False)
    assert select_backend(host, [below, second], spec()).backend.name == "up"


declarations_st = st.builds(
    BackendDeclarations,
    capabilities=st.frozensets(st.sampled_from(list(Capability))),
    limits=st.builds(
        TransferLimits,
        max_bytes_per_file=st.sampled_from([MiB, 8 * MiB]),
        max_total_bytes=st.sampled_from([32 * MiB, 64 * MiB]),
        max_files=st.sampled_from([8, 64, 128]),
    ),
    egress_modes=st.frozensets(st.sampled_from(list(Egress))),
    os_families=st.frozensets(st.sampled_from(list(OsFamily))),
    isolation_scopes=st.frozensets(st.sampled_from(list(IsolationScope))),
)
backends_st = st.lists(
    st.builds(
        BackendProfile,
        name=st.sampled_from(["a", "b", "c", "d", "e"]),
        isolation=st.sampled_from([r.value for r in ISOLATION_LADDER] + ["process", "gvisor"]),
        declarations=declarations_st,
        available=st.booleans(),
    ),
    min_size=1,
    max_size=5,
    unique_by=lambda b: b.name,
)
specs_st = st.builds(
    lambda requires, floor, scope, family, egress, files: spec(
        requires=sorted(requires),
        minIsolation=floor,
        isolationScope=scope,
        requiresOsFamily=family,
        egress=egress,
        filesIn={"maxFiles": files},
    ),
    st.frozensets(st.sampled_from(list(Capability))),
    st.none() | st.sampled_from([r.value for r in Isolation]),
    st.sampled_from([s.value for s in IsolationScope]),
    st.none() | st.sampled_from([f.value for f in OsFamily]),
    st.sampled_from([e.value for e in Egress]),
    st.sampled_from([8, 64, 100]),
)
hosts_st = st.builds(
    HostPolicy,
    min_isolation=rungs,
    min_isolation_scope=scopes,
    selection=st.just(Selection.PER_SPEC),
    allow_unrestricted_egress=st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(host=hosts_st, backends=backends_st, s=specs_st, scope_floor=optional_rungs)
def test_per_spec_route_is_deterministic_and_never_below_the_floor(
    host: HostPolicy,
    backends: list[BackendProfile],
    s: SandboxSpec,
    scope_floor: Isolation | None,
) -> None:
    def route() -> str | tuple[str | None, ...]:
        try:
            admitted = select_backend(host, backends, s, scope_floor=scope_floor)
        except NoBackendCanServe as refusal:
            assert [r.backend for r in refusal.refusals] == [b.name for b in backends]
            return tuple(r.reason.value for r in refusal.refusals)
        except BackendUnavailable as down:
            return f"down:{down.backend}"
        rung = admitted.backend.known_isolation
        assert rung is not None
        assert rung >= host.min_isolation
        assert rung >= admitted.floor
        if scope_floor is not None:
            assert rung >= scope_floor
        if s.min_isolation is not None:
            assert rung >= s.min_isolation
        assert admitted.backend.available
        # It is the first registered backend that passes.
        index = backends.index(admitted.backend)
        for earlier in backends[:index]:
            with pytest.raises(SandboxRefusal):
                check_backend(
                    earlier,
                    s,
                    floor=admitted.floor,
                    isolation_scope=admitted.isolation_scope,
                    allow_unrestricted=host.allow_unrestricted_egress,
                )
        return admitted.backend.name

    first = route()
    assert route() == first
    assert route() == first
    # The route does not depend on availability (#25 item 5): with every backend up, the spec
    # lands where it was routed (served, or failed because that backend was down).
    all_up = [dataclasses.replace(b, available=True) for b in backends]
    try:
        up = select_backend(host, all_up, s, scope_floor=scope_floor).backend.name
    except NoBackendCanServe:
        assert not isinstance(first, str), first
    else:
        assert first in (up, f"down:{up}"), (first, up)


# --- registration -----------------------------------------------------------------------------


def test_registration_fixed_refuses_a_resolved_backend_below_the_floor() -> None:
    with pytest.raises(ConfigurationError) as exc:
        validate_registration(HostPolicy(), [backend("runc", "container"), backend("kata")])
    assert exc.value.entry == "backends[0].isolation"
    assert "'runc' (isolation container) is below the host floor microvm" in str(exc.value)
    with pytest.raises(ConfigurationError) as exc:
        validate_registration(
            HostPolicy(pinned_backend="runc"), [backend("kata"), backend("runc", "container")]
        )
    assert exc.value.entry == "backends[1].isolation"
    assert (
        validate_registration(
            HostPolicy(min_isolation=Isolation.CONTAINER), [backend("runc", "container")]
        )
        == ()
    )


@pytest.mark.parametrize("name", ["kata\n", "Kata", "-kata", "k" * 64])
def test_registration_refuses_a_backend_name_that_is_not_a_dns_label(name: str) -> None:
    with pytest.raises(ConfigurationError) as exc:
        validate_registration(HostPolicy(), [backend(name)])
    assert exc.value.entry == "backends[0].name"


def test_registration_fixed_refuses_an_unknown_rung() -> None:
    with pytest.raises(ConfigurationError) as exc:
        validate_registration(HostPolicy(min_isolation=Isolation.NONE), [backend("old", "process")])
    assert exc.value.entry == "backends[0].isolation"
    assert "'process'" in str(exc.value) and "os_process" in str(exc.value)


def test_registration_per_spec_refuses_only_when_nothing_clears_the_floor() -> None:
    host = HostPolicy(selection=Selection.PER_SPEC)
    with pytest.raises(ConfigurationError) as exc:
        validate_registration(host, [backend("runc", "container"), backend("old", "process")])
    assert exc.value.entry == "backends"
    warnings = validate_registration(
        host, [backend("runc", "container"), backend("old", "process"), backend("kata")]
    )
    assert len(warnings) == 2
    assert "'runc' (isolation container) is below the host floor microvm" in warnings[0]
    assert "never routes to it" in warnings[0]
    assert "'old' declares isolation 'process'" in warnings[1]


def test_registration_refuses_malformed_sets() -> None:
    with pytest.raises(ConfigurationError) as exc:
        validate_registration(HostPolicy(), [])
    assert exc.value.entry == "backends"
    with pytest.raises(ConfigurationError) as exc:
        validate_registration(HostPolicy(), [backend("a"), backend("a")])
    assert exc.value.entry == "backends[1].name"
    with pytest.raises(ConfigurationError) as exc:
        validate_registration(HostPolicy(), [backend("Not A Name")])
    assert exc.value.entry == "backends[0].name"
    with pytest.raises(ConfigurationError) as exc:
        validate_registration(HostPolicy(pinned_backend="zzz"), [backend("a")])
    assert exc.value.entry == "hostPolicy.pinnedBackend"
    assert isinstance(exc.value, ValueError)


def test_registration_warns_about_a_backend_that_refuses_everything() -> None:
    warnings = validate_registration(HostPolicy(), [backend("a"), silent()])
    assert any("declares no egress modes" in w for w in warnings)


# --- resources: defaults, capping, spec wins, ceilings ----------------------------------------


def rr(requests: dict[str, str], limits: dict[str, str]) -> ResourceRequirements:
    return ResourceRequirements(requests=ResourceList(**requests), limits=ResourceList(**limits))


def host_resources(**resources: Any) -> HostPolicy:
    return HostPolicy.model_validate({"resources": resources})


def test_a_spec_that_names_no_resources_gets_small_requests_under_the_default_limits() -> None:
    assert resolve_resources(HostPolicy(), spec()) == rr(
        {"cpu": "10m", "memory": "32Mi"}, {"cpu": "1", "memory": "512Mi"}
    )


@pytest.mark.parametrize(
    "stated, resolved",
    [
        # Only limits: the default requests stay, capped at the stated limits.
        (
            {"limits": {"cpu": "5m", "memory": "16Mi"}},
            rr({"cpu": "5m", "memory": "16Mi"}, {"cpu": "5m", "memory": "16Mi"}),
        ),
        (
            {"limits": {"cpu": "2", "memory": "2Gi"}},
            rr({"cpu": "10m", "memory": "32Mi"}, {"cpu": "2", "memory": "2Gi"}),
        ),
        # One limit stated: the other resource keeps its default limit.
        (
            {"limits": {"memory": "20Mi"}},
            rr({"cpu": "10m", "memory": "20Mi"}, {"cpu": "1", "memory": "20Mi"}),
        ),
        # Only requests: the default limits stay, raised to a larger stated request.
        (
            {"requests": {"cpu": "2", "memory": "100Mi"}},
            rr({"cpu": "2", "memory": "100Mi"}, {"cpu": "2", "memory": "512Mi"}),
        ),
        # Everything stated: nothing changes.
        (
            {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
            rr({"cpu": "1", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"}),
        ),
    ],
    ids=["limits-below-default-requests", "limits-only", "one-limit", "requests-only", "all"],
)
def test_defaults_fill_what_the_spec_leaves_out_and_never_put_requests_above_limits(
    stated: dict[str, Any], resolved: ResourceRequirements
) -> None:
    assert resolve_resources(HostPolicy(), spec(resources=stated)) == resolved


def test_host_defaults_fill_the_rest_and_the_spec_wins() -> None:
    host = host_resources(
        defaultRequests={"cpu": "50m", "memory": "64Mi"},
        defaultLimits={"cpu": "500m", "memory": "256Mi"},
    )
    assert resolve_resources(host, spec()) == rr(
        {"cpu": "50m", "memory": "64Mi"}, {"cpu": "500m", "memory": "256Mi"}
    )
    # The spec's own values win, field by field; the host fills the others.
    assert resolve_resources(
        host, spec(resources={"requests": {"memory": "128Mi"}, "limits": {"cpu": "2"}})
    ) == rr({"cpu": "50m", "memory": "128Mi"}, {"cpu": "2", "memory": "256Mi"})
    # A partial host default keeps the built-in value for the other resource.
    partial = host_resources(defaultLimits={"memory": "1Gi"})
    assert resolve_resources(partial, spec()) == rr(
        {"cpu": "10m", "memory": "32Mi"}, {"cpu": "1", "memory": "1Gi"}
    )


def test_resolve_spec_is_idempotent_and_changes_only_resources() -> None:
    host = host_resources(defaultLimits={"cpu": "500m"})
    s = spec(egress="allowlist", egressAllow=["pypi.org"], resources={"limits": {"memory": "1Gi"}})
    once = resolve_spec(host, s)
    assert once.resources == resolve_resources(host, s)
    assert once.model_dump(exclude={"resources"}) == s.model_dump(exclude={"resources"})
    assert resolve_spec(host, once) is once
    # Resolving under other defaults changes nothing either: everything is stated now.
    assert resolve_spec(HostPolicy(), once) is once


_CPU = st.sampled_from(["1m", "5m", "10m", "100m", "250m", "1", "1500m", "2", "4"])
_MEM = st.sampled_from(["8Mi", "16Mi", "32Mi", "100M", "256Mi", "512Mi", "1Gi", "2Gi"])


@st.composite
def _resource_lists(draw: st.DrawFn) -> dict[str, str]:
    out = {}
    if draw(st.booleans()):
        out["cpu"] = draw(_CPU)
    if draw(st.booleans()):
        out["memory"] = draw(_MEM)
    return out


@settings(max_examples=300, deadline=None)
@given(requests=_resource_lists(), limits=_resource_lists(), dreq=_CPU, dlim=_CPU)
def test_resolved_requests_never_exceed_limits_and_stated_values_survive(
    requests: dict[str, str], limits: dict[str, str], dreq: str, dlim: str
) -> None:
    for r in ("cpu", "memory"):
        if (
            r in requests
            and r in limits
            and parse_quantity(requests[r]) > parse_quantity(limits[r])
        ):
            requests[r] = limits[r]  # the model refuses it; that has its own test
    if parse_quantity(dreq) > parse_quantity(dlim):
        dreq, dlim = dlim, dreq
    host = host_resources(defaultRequests={"cpu": dreq}, defaultLimits={"cpu": dlim})
    s = spec(resources={"requests": requests, "limits": limits})
    got = resolve_resources(host, s)
    for r in ("cpu", "memory"):
        req, lim = getattr(got.requests, r), getattr(got.limits, r)
        assert req is not None and lim is not None
        assert parse_quantity(req) <= parse_quantity(lim)
        if r in requests:
            assert req == requests[r]
        if r in limits:
            assert lim == limits[r]
    assert resolve_resources(host, resolve_spec(host, s)) == got


def test_a_spec_above_the_host_ceiling_is_refused_naming_the_fields() -> None:
    host = host_resources(maxRequests={"cpu": "500m"}, maxLimits={"cpu": "2", "memory": "2Gi"})
    check_resources(host, spec())  # the defaults are within the ceilings
    check_resources(host, spec(resources={"limits": {"cpu": "2", "memory": "2Gi"}}))  # at it
    with pytest.raises(ResourcesExceedCeiling) as exc:
        check_resources(host, spec(resources={"limits": {"memory": "4Gi"}}))
    assert exc.value.reason is RefusalReason.RESOURCES_EXCEED_CEILING
    assert exc.value.excesses == (
        ResourceExcess("limits.memory", "4Gi", "maxLimits.memory", "2Gi"),
    )
    assert exc.value.backend is None and exc.value.kind == "python"
    assert "limits.memory 4Gi > maxLimits.memory 2Gi" in exc.value.message
    # A request is held to the tighter ceiling it exceeds; every excess is listed.
    with pytest.raises(ResourcesExceedCeiling) as exc:
        check_resources(
            host,
            spec(resources={"requests": {"cpu": "3"}, "limits": {"cpu": "3", "memory": "3Gi"}}),
        )
    assert [e.describe() for e in exc.value.excesses] == [
        "requests.cpu 3 > maxRequests.cpu 500m",
        "limits.cpu 3 > maxLimits.cpu 2",
        "limits.memory 3Gi > maxLimits.memory 2Gi",
    ]
    # A request above maxLimits with no limit stated is refused too (its limit would follow it).
    with pytest.raises(ResourcesExceedCeiling) as exc:
        check_resources(
            host_resources(maxLimits={"memory": "1Gi"}),
            spec(resources={"requests": {"memory": "2Gi"}}),
        )
    assert exc.value.excesses[0].field == "requests.memory"
    assert exc.value.excesses[0].ceiling_field == "maxLimits.memory"


def test_no_configured_ceiling_by_default_only_the_built_in_one() -> None:
    # The host policy sets no ceiling; the built-in one (8 CPU, 16Gi) is what bounds a spec.
    check_resources(HostPolicy(), spec(resources={"limits": {"cpu": "8", "memory": "16Gi"}}))
    with pytest.raises(ResourcesExceedCeiling):
        check_resources(HostPolicy(), spec(resources={"limits": {"cpu": "64", "memory": "256Gi"}}))
    # A host that configures a ceiling gets exactly it.
    check_resources(
        host_resources(maxLimits={"cpu": "64", "memory": "256Gi"}),
        spec(resources={"limits": {"cpu": "64", "memory": "256Gi"}}),
    )


@pytest.mark.parametrize(
    "resources, fields",
    [
        ({"limits": {"cpu": 10**18}}, ["limits.cpu"]),
        ({"limits": {"memory": str(10**18)}}, ["limits.memory"]),
        ({"requests": {"cpu": "1000000000000000000"}}, ["requests.cpu"]),
        (
            {"requests": {"memory": "1Pi"}, "limits": {"cpu": "9", "memory": "1Pi"}},
            ["requests.memory", "limits.cpu", "limits.memory"],
        ),
    ],
)
def test_an_unconfigured_host_refuses_absurd_resources_with_the_built_in_ceiling(
    resources: dict[str, Any], fields: list[str]
) -> None:
    with pytest.raises(ResourcesExceedCeiling) as exc:
        select_backend(HostPolicy(), [backend()], spec(resources=resources))
    assert [e.field for e in exc.value.excesses] == fields
    assert all(e.built_in for e in exc.value.excesses)
    assert all(e.ceiling_field.startswith("maxLimits.") for e in exc.value.excesses)
    assert "built-in; set hostPolicy.resources.maxLimits to change it" in exc.value.message


def test_the_built_in_ceiling_follows_a_larger_default_limit() -> None:
    host = host_resources(defaultLimits={"cpu": "32", "memory": "64Gi"})
    assert limit_ceilings(host) == (
        ResourceList(cpu="32", memory="64Gi"),
        frozenset({"cpu", "memory"}),
    )
    check_resources(host, spec(resources={"limits": {"cpu": "32", "memory": "64Gi"}}))
    with pytest.raises(ResourcesExceedCeiling) as exc:
        check_resources(host, spec(resources={"limits": {"cpu": "33"}}))
    assert exc.value.excesses[0].ceiling == "32" and exc.value.excesses[0].built_in
    # A configured ceiling is never built in, per resource.
    ceilings, built_in = limit_ceilings(host_resources(maxLimits={"memory": "1Gi"}))
    assert ceilings == ResourceList(cpu="8", memory="1Gi") and built_in == {"cpu"}
    with pytest.raises(ResourcesExceedCeiling) as exc:
        check_resources(
            host_resources(maxLimits={"memory": "1Gi"}),
            spec(resources={"limits": {"memory": "2Gi"}}),
        )
    assert not exc.value.excesses[0].built_in
    assert "built-in" not in exc.value.message


# --- a Windows workDir asks for the windows OS family ------------------------------------------


def test_a_windows_work_dir_on_a_posix_backend_is_refused_as_an_os_family() -> None:
    with pytest.raises(OsFamilyNotSupported) as exc:
        check(backend(), spec(workDir="C:\\work"))
    assert exc.value.requested is OsFamily.WINDOWS and exc.value.work_dir == "C:\\work"
    assert "workDir 'C:\\\\work' is a windows path" in exc.value.message
    # A backend that declares nothing refuses it too (the path asks for a family).
    with pytest.raises(OsFamilyNotSupported):
        check(backend(declarations=declared(os_families=frozenset())), spec(workDir="D:/w"))
    # Served where windows is declared; a posix path asks for nothing.
    windows = backend(declarations=declared(os_families=frozenset({OsFamily.WINDOWS})))
    check(windows, spec(workDir="C:\\work"))
    check(windows, spec(workDir="/workspace"))
    # A stated family is reported as stated, without the workDir.
    with pytest.raises(OsFamilyNotSupported) as exc:
        check(backend(), spec(workDir="C:\\work", requiresOsFamily="windows"))
    assert exc.value.work_dir is None and "workDir" not in exc.value.message


@pytest.mark.parametrize("selection", [Selection.FIXED, Selection.PER_SPEC])
def test_select_backend_refuses_above_the_ceiling_before_judging_any_backend(
    selection: Selection,
) -> None:
    host = HostPolicy.model_validate(
        {"selection": selection.value, "resources": {"maxLimits": {"memory": "1Gi"}}}
    )
    # The backend is below the floor too: the host's ceiling is reported, not the backend.
    backends = [backend("runc", "container"), backend("kata")]
    with pytest.raises(SandboxRefusal) as exc:
        select_backend(host, backends, spec(resources={"limits": {"memory": "8Gi"}}))
    assert type(exc.value) is ResourcesExceedCeiling
    assert exc.value.backend is None


def test_the_admission_carries_the_spec_with_resolved_resources() -> None:
    host = HostPolicy.model_validate(
        {
            "selection": "perSpec",
            "resources": {"defaultRequests": {"cpu": "20m"}, "defaultLimits": {"memory": "1Gi"}},
        }
    )
    s = spec(resources={"limits": {"cpu": "500m"}})
    admission = select_backend(host, [backend("kata")], s)
    assert admission.spec is not None
    assert admission.spec.resources == rr(
        {"cpu": "20m", "memory": "32Mi"}, {"cpu": "500m", "memory": "1Gi"}
    )
    assert admission.spec == resolve_spec(host, s)
    assert admission.spec.kind == s.kind and admission.spec.image == s.image


def test_the_ceiling_refusal_reaches_the_client_as_its_own_exception() -> None:
    from sandbox_operator.client import SandboxRefused, SandboxResourcesExceedCeiling
    from sandbox_operator.client.errors import acquire_error_for
    from sandbox_operator.contract import ConditionReason, refusal_condition_reason

    reason = ResourcesExceedCeiling.reason
    condition_reason = refusal_condition_reason(reason)
    assert condition_reason is ConditionReason.RESOURCES_EXCEED_CEILING
    error = acquire_error_for(condition_reason.value)
    assert error is SandboxResourcesExceedCeiling
    assert issubclass(error, SandboxRefused) and error.refusal_reason is reason


def test_a_capability_the_host_denies_is_refused_before_any_backend_is_judged() -> None:
    """``hostPolicy.deniedCapabilities`` is a hard stop: a spec requiring one is refused with
    CapabilityDenied (no backend named) under either selection, even when every backend
    declares the capability and the first one is down; a spec not requiring it is served."""
    host_tools = spec(requires=["exec", "host_tools"])
    backends = [backend("down", available=False), backend("up")]
    for selection in (Selection.FIXED, Selection.PER_SPEC):
        host = HostPolicy(
            min_isolation=Isolation.MICROVM,
            selection=selection,
            denied_capabilities=frozenset({Capability.HOST_TOOLS, Capability.SNAPSHOT}),
        )
        with pytest.raises(CapabilityDenied) as exc:
            select_backend(host, backends, host_tools)
        assert exc.value.reason is RefusalReason.CAPABILITY_DENIED
        assert exc.value.denied == (Capability.HOST_TOOLS,)
        assert exc.value.backend is None and exc.value.kind == "python"
        assert "host_tools" in exc.value.message and "deniedCapabilities" in exc.value.message
        # Denials come before the host's ceilings too: the posture is the first answer.
        greedy = spec(requires=["host_tools"], resources={"limits": {"cpu": "64"}})
        with pytest.raises(CapabilityDenied):
            select_backend(host, backends, greedy)
    allowed = HostPolicy(
        selection=Selection.PER_SPEC, denied_capabilities=frozenset({Capability.SNAPSHOT})
    )
    with pytest.raises(BackendUnavailable):  # judged as usual: the first backend, down
        select_backend(allowed, backends, host_tools)
    assert select_backend(allowed, backends[1:], host_tools).backend.name == "up"


def test_denied_capabilities_parse_from_the_wire_and_refuse_unknown_names() -> None:
    host = HostPolicy.model_validate({"deniedCapabilities": ["host_tools"]})
    assert host.denied_capabilities == frozenset({Capability.HOST_TOOLS})
    assert HostPolicy().denied_capabilities == frozenset()
    with pytest.raises(ValueError, match="deniedCapabilities"):
        HostPolicy.model_validate({"deniedCapabilities": ["root"]})
