"""Unit tests of sandbox_operator.contract: vocabulary, models, refusal types."""

from __future__ import annotations

import itertools

import pytest
from pydantic import ValidationError

from sandbox_operator.contract import (
    DEFAULT_CAPABILITIES,
    DEFAULT_RESOURCE_LIMITS,
    DEFAULT_RESOURCE_REQUESTS,
    ISOLATION_LADDER,
    ISOLATION_SCOPE_LADDER,
    REFUSAL_TYPES,
    BackendDeclarations,
    Capability,
    Condition,
    ConditionReason,
    DeclaredOutput,
    DisposalCode,
    DisposalFailure,
    Egress,
    HostPolicy,
    Isolation,
    IsolationScope,
    Lifetime,
    RefusalReason,
    ResourceExcess,
    ResourceList,
    ResourcePolicy,
    ResourceRequirements,
    ResourcesExceedCeiling,
    SandboxKey,
    SandboxResourceSpec,
    SandboxScopeResourceSpec,
    SandboxSpec,
    ScopePurge,
    Selection,
    TransferLimits,
    UnknownIsolation,
    isolation_rank,
    isolation_scope_rank,
    meets_floor,
    parse_isolation,
    parse_quantity,
    refusal_condition_reason,
    stricter_isolation,
    stricter_isolation_scope,
)

MiB = 1024 * 1024


def spec(**kw: object) -> SandboxSpec:
    return SandboxSpec.model_validate({"kind": "python", "image": "python:1", **kw})


def error_text(exc: pytest.ExceptionInfo[ValidationError]) -> str:
    return str(exc.value)


def error_locs(exc: pytest.ExceptionInfo[ValidationError]) -> list[str]:
    return [".".join(str(p) for p in e["loc"]) for e in exc.value.errors()]


# --- the isolation ladder ---------------------------------------------------------------------


def test_ladder_is_exhaustive_and_in_order() -> None:
    assert set(ISOLATION_LADDER) == set(Isolation)
    assert len(ISOLATION_LADDER) == len(Isolation) == 7
    assert [r.value for r in ISOLATION_LADDER] == [
        "none",
        "runtime",
        "os_process",
        "container",
        "hardened_container",
        "microvm",
        "vm",
    ]
    assert [isolation_rank(r) for r in ISOLATION_LADDER] == list(range(7))


def test_every_rung_has_a_rank_and_parses_from_its_value() -> None:
    for rung in Isolation:
        assert parse_isolation(rung.value) is rung
        assert Isolation(rung.value) is rung
        assert isolation_rank(rung) == ISOLATION_LADDER.index(rung)


@pytest.mark.parametrize("a, b", list(itertools.product(Isolation, repeat=2)))
def test_comparison_is_by_rank_never_by_string(a: Isolation, b: Isolation) -> None:
    ra, rb = isolation_rank(a), isolation_rank(b)
    assert (a < b) == (ra < rb)
    assert (a <= b) == (ra <= rb)
    assert (a > b) == (ra > rb)
    assert (a >= b) == (ra >= rb)
    assert meets_floor(a, b) == (ra >= rb)
    assert isolation_rank(stricter_isolation(a, b)) == max(ra, rb)


def test_string_order_would_be_wrong_for_these_pairs() -> None:
    # Guards the reason for ranking as data: each of these is inverted in string order.
    assert Isolation.NONE < Isolation.CONTAINER and "none" > "container"
    assert Isolation.OS_PROCESS < Isolation.HARDENED_CONTAINER
    assert "os_process" > "hardened_container"
    assert Isolation.RUNTIME < Isolation.MICROVM and "runtime" > "microvm"
    assert sorted(Isolation) == list(ISOLATION_LADDER)
    assert max(Isolation) is Isolation.VM and min(Isolation) is Isolation.NONE


@pytest.mark.parametrize("other", ["vm", "none", 3])
def test_comparison_with_a_non_rung_is_refused(other: object) -> None:
    with pytest.raises(TypeError, match="parse_isolation"):
        _ = other > Isolation.MICROVM  # type: ignore[operator]
    with pytest.raises(TypeError):
        _ = other <= Isolation.MICROVM  # type: ignore[operator]


@pytest.mark.parametrize("raw", ["process", "Microvm", "gvisor", "", "container "])
def test_unknown_isolation_is_refused_naming_the_allowed_values(raw: str) -> None:
    with pytest.raises(UnknownIsolation) as exc:
        parse_isolation(raw)
    assert isinstance(exc.value, ValueError)
    assert exc.value.value == raw
    assert exc.value.allowed == tuple(r.value for r in ISOLATION_LADDER)
    for rung in ISOLATION_LADDER:
        assert rung.value in str(exc.value)
    with pytest.raises(ValueError):
        Isolation(raw)


def test_retired_process_spelling_is_refused_with_a_hint() -> None:
    with pytest.raises(UnknownIsolation, match="retired spelling"):
        parse_isolation("process")
    with pytest.raises(ValidationError) as exc:
        spec(minIsolation="process")
    assert error_locs(exc) == ["minIsolation"]
    assert "os_process" in error_text(exc) and "retired" in error_text(exc)
    with pytest.raises(ValidationError):
        HostPolicy.model_validate({"minIsolation": "process"})


def test_isolation_scope_ladder() -> None:
    assert set(ISOLATION_SCOPE_LADDER) == set(IsolationScope)
    assert isolation_scope_rank(IsolationScope.CONVERSATION) < isolation_scope_rank(
        IsolationScope.CALL
    )
    for a, b in itertools.product(IsolationScope, repeat=2):
        winner = stricter_isolation_scope(a, b)
        assert isolation_scope_rank(winner) == max(isolation_scope_rank(a), isolation_scope_rank(b))


# --- vocabularies -----------------------------------------------------------------------------


def test_vocabularies_are_exactly_the_contract() -> None:
    assert {c.value for c in Capability} == {
        "exec",
        "run_code",
        "host_tools",
        "files_in",
        "files_out",
        "files_list",
        "files_delete",
        "snapshot",
        "attached_identity",
    }
    assert [e.value for e in Egress] == ["closed", "allowlist", "unrestricted"]
    assert [s.value for s in Selection] == ["fixed", "perSpec"]
    assert [d.value for d in DisposalCode] == [
        "unreachable",
        "timeout",
        "refused",
        "unlisted",
        "unknown",
    ]
    assert {Capability.EXEC, Capability.FILES_IN} == DEFAULT_CAPABILITIES


@pytest.mark.parametrize(
    "field, value, allowed",
    [
        ("egress", "open", ["closed", "allowlist", "unrestricted"]),
        ("isolationScope", "thread", ["conversation", "call"]),
        ("requiresOsFamily", "linux", ["posix", "windows"]),
        ("requires", ["exec", "teleport"], ["exec", "run_code", "attached_identity"]),
    ],
)
def test_enum_fields_refuse_unknown_values_naming_allowed_ones(
    field: str, value: object, allowed: list[str]
) -> None:
    with pytest.raises(ValidationError) as exc:
        spec(**{field: value})
    assert error_locs(exc)[0].startswith(field)
    for name in allowed:
        assert f"'{name}'" in error_text(exc)


# --- SandboxSpec ------------------------------------------------------------------------------


def test_spec_defaults_are_the_closed_posture() -> None:
    s = spec()
    assert s.egress is Egress.CLOSED
    assert s.egress_allow == ()
    assert s.requires == DEFAULT_CAPABILITIES
    assert s.isolation_scope is IsolationScope.CONVERSATION
    assert s.min_isolation is None
    assert s.requires_os_family is None
    assert s.files_in == s.files_out == TransferLimits()
    assert TransferLimits() == TransferLimits(
        max_bytes_per_file=8 * MiB, max_total_bytes=32 * MiB, max_files=64
    )


def test_camel_case_aliases_and_snake_case_names_both_populate() -> None:
    a = spec(workDir="/w", minIsolation="vm", egress="allowlist", egressAllow=["pypi.org"])
    b = spec(work_dir="/w", min_isolation="vm", egress="allowlist", egress_allow=["pypi.org"])
    assert a == b
    assert a.min_isolation is Isolation.VM
    wire = a.to_wire()
    assert wire["workDir"] == "/w" and wire["minIsolation"] == "vm"
    assert wire["egressAllow"] == ["pypi.org"]
    assert "work_dir" not in wire
    assert SandboxSpec.model_validate(wire) == a


def test_unknown_fields_are_refused_naming_them() -> None:
    with pytest.raises(ValidationError) as exc:
        spec(egressAllowList=["x"])
    assert error_locs(exc) == ["egressAllowList"]
    assert "Extra inputs are not permitted" in error_text(exc)


def test_models_are_frozen() -> None:
    s = spec()
    with pytest.raises(ValidationError):
        s.image = "other"  # type: ignore[misc]


def test_set_fields_serialize_in_definition_order() -> None:
    s = spec(requires=["snapshot", "files_out", "exec", "run_code"])
    assert s.to_wire()["requires"] == ["exec", "run_code", "files_out", "snapshot"]
    d = BackendDeclarations(egress_modes={Egress.UNRESTRICTED, Egress.CLOSED})
    assert d.to_wire()["egressModes"] == ["closed", "unrestricted"]


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"egressAllow": ["pypi.org"]}, "egressAllow is only valid with egress allowlist"),
        (
            {"egress": "unrestricted", "egressAllow": ["pypi.org"]},
            "egressAllow is only valid with egress allowlist (egress is unrestricted)",
        ),
        ({"egress": "allowlist", "egressAllow": ["a.org", "a.org"]}, "more than once"),
        ({"egress": "allowlist", "egressAllow": ["https://a.org"]}, "egressAllow"),
        ({"egress": "allowlist", "egressAllow": ["a.org:443"]}, "egressAllow"),
        ({"egress": "allowlist", "egressAllow": ["*"]}, "egressAllow"),
        ({"workDir": "workspace"}, "workDir"),
        ({"kind": "Python"}, "kind"),
        ({"image": "has space"}, "image"),
        (
            {"declaredOutputs": [{"path": "a.png", "mediaType": "image/png"}]},
            "declaredOutputs needs files_out",
        ),
        (
            {
                "requires": ["exec", "files_out"],
                "declaredOutputs": [{"path": "/etc/passwd", "mediaType": "text/plain"}],
            },
            "must be relative",
        ),
        (
            {
                "requires": ["exec", "files_out"],
                "declaredOutputs": [{"path": "a/../../b", "mediaType": "text/plain"}],
            },
            "'..'",
        ),
        (
            {
                "requires": ["exec", "files_out"],
                "declaredOutputs": [
                    {"path": "a.png", "mediaType": "image/png"},
                    {"path": "b.png", "mediaType": "image/png", "name": "a.png"},
                ],
            },
            "same name",
        ),
        (
            {
                "requires": ["exec", "files_out"],
                "filesOut": {"maxFiles": 1},
                "declaredOutputs": [
                    {"path": "a.png", "mediaType": "image/png"},
                    {"path": "b.png", "mediaType": "image/png"},
                ],
            },
            "more than filesOut.maxFiles (1)",
        ),
        ({"filesIn": {"maxBytesPerFile": 10, "maxTotalBytes": 5}}, "maxBytesPerFile (10)"),
        ({"filesIn": {"maxFiles": -1}}, "filesIn.maxFiles"),
        (
            {"resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "512Mi"}}},
            "requests.memory (1Gi) exceeds limits.memory (512Mi)",
        ),
        (
            {"resources": {"requests": {"cpu": "1500m"}, "limits": {"cpu": 1}}},
            "requests.cpu (1500m) exceeds limits.cpu (1)",
        ),
        ({"resources": {"limits": {"cpu": "lots"}}}, "not a quantity"),
        ({"lifetime": {"ttlSeconds": 60, "idleTimeoutSeconds": 120}}, "idleTimeoutSeconds (120)"),
        ({"lifetime": {"startupTimeoutSeconds": 0}}, "lifetime.startupTimeoutSeconds"),
    ],
)
def test_invalid_specs_raise_at_construction_naming_the_field(
    kw: dict[str, object], needle: str
) -> None:
    with pytest.raises(ValidationError) as exc:
        spec(**kw)
    text = error_text(exc) + " " + " ".join(error_locs(exc))
    assert needle in text


def test_valid_combinations_are_accepted() -> None:
    s = spec(
        egress="allowlist",
        egressAllow=["pypi.org", "*.pythonhosted.org"],
        requires=["exec", "files_in", "files_out"],
        declaredOutputs=[
            {"path": "out/a.png", "mediaType": "image/png", "required": False},
            {"path": "b.json", "mediaType": "application/json", "disposition": "consume"},
        ],
        resources={"requests": {"cpu": "250m", "memory": "128Mi"}, "limits": {"cpu": 2}},
        lifetime={"ttlSeconds": 600, "idleTimeoutSeconds": 600},
    )
    assert s.declared_outputs[0].landing_name == "out/a.png"
    assert s.resources.limits.cpu == "2"
    assert DeclaredOutput(path="x", media_type="text/plain", name="y").landing_name == "y"


def test_quantities() -> None:
    assert parse_quantity("500m") == parse_quantity("0.5")
    assert parse_quantity("1Gi") == 1024**3
    assert parse_quantity("1G") == 10**9
    assert parse_quantity("10m") < parse_quantity("1") < parse_quantity("2")
    assert Lifetime().idle_timeout_seconds <= Lifetime().ttl_seconds


# --- declarations, host policy, key -----------------------------------------------------------


def test_backend_declarations_silence_rules() -> None:
    d = BackendDeclarations()
    assert d.capabilities == DEFAULT_CAPABILITIES
    assert d.limits == TransferLimits()
    assert d.egress_modes == frozenset()
    assert d.os_families == frozenset()
    assert d.isolation_scopes == frozenset({IsolationScope.CONVERSATION})
    assert d.observes_egress is False


def test_host_policy_defaults_and_pin_rule() -> None:
    h = HostPolicy()
    assert h.min_isolation is Isolation.MICROVM
    assert h.min_isolation_scope is IsolationScope.CONVERSATION
    assert h.selection is Selection.FIXED
    assert h.pinned_backend is None
    assert h.allow_unrestricted_egress is False
    assert h.resources == ResourcePolicy()
    assert HostPolicy(pinned_backend="acas").pinned_backend == "acas"
    with pytest.raises(ValidationError, match="pinnedBackend is only valid with selection fixed"):
        HostPolicy.model_validate({"selection": "perSpec", "pinnedBackend": "acas"})


# --- resources --------------------------------------------------------------------------------


def test_a_spec_states_resources_and_leaves_the_rest_unset() -> None:
    # The model keeps what the spec states; the policy fills the rest at admission, so the
    # host's defaults can apply (a model default here would look like a stated value).
    assert spec().resources == ResourceRequirements()
    assert ResourceRequirements().requests == ResourceList()
    assert ResourceRequirements().limits == ResourceList()
    s = spec(resources={"limits": {"memory": "1Gi"}})
    assert s.resources.limits == ResourceList(memory="1Gi")
    assert s.resources.requests == ResourceList()
    assert spec(resources={"limits": {"cpu": 2}}).resources.limits.cpu == "2"


def test_built_in_resource_defaults_are_small_requests_under_bounded_limits() -> None:
    assert ResourceList(cpu="10m", memory="32Mi") == DEFAULT_RESOURCE_REQUESTS
    assert ResourceList(cpu="1", memory="512Mi") == DEFAULT_RESOURCE_LIMITS
    # 100 idle sandboxes reserve half of a 2-core node's CPU.
    assert 100 * parse_quantity(DEFAULT_RESOURCE_REQUESTS.cpu or "") <= 1
    p = ResourcePolicy()
    assert p.default_requests == DEFAULT_RESOURCE_REQUESTS
    assert p.default_limits == DEFAULT_RESOURCE_LIMITS
    assert p.max_requests == ResourceList() and p.max_limits == ResourceList()


def test_host_resource_policy_reads_camel_case_and_completes_partial_defaults() -> None:
    h = HostPolicy.model_validate(
        {
            "resources": {
                "defaultRequests": {"memory": "64Mi"},
                "defaultLimits": {"cpu": "500m"},
                "maxRequests": {"cpu": "1"},
                "maxLimits": {"cpu": 2, "memory": "2Gi"},
            }
        }
    )
    r = h.resources
    assert r.default_requests == ResourceList(cpu="10m", memory="64Mi")
    assert r.default_limits == ResourceList(cpu="500m", memory="512Mi")
    assert r.max_requests == ResourceList(cpu="1")
    assert r.max_limits == ResourceList(cpu="2", memory="2Gi")
    assert h.to_wire()["resources"]["defaultLimits"] == {"cpu": "500m", "memory": "512Mi"}


@pytest.mark.parametrize(
    "resources, needle",
    [
        (
            {"defaultRequests": {"cpu": "2"}},
            "defaultRequests.cpu (2) exceeds defaultLimits.cpu (1)",
        ),
        (
            {"defaultRequests": {"memory": "1Gi"}, "defaultLimits": {"memory": "256Mi"}},
            "defaultRequests.memory (1Gi) exceeds defaultLimits.memory (256Mi)",
        ),
        ({"maxLimits": {"cpu": "500m"}}, "defaultLimits.cpu (1) exceeds maxLimits.cpu (500m)"),
        (
            {"maxRequests": {"memory": "16Mi"}},
            "defaultRequests.memory (32Mi) exceeds maxRequests.memory (16Mi)",
        ),
        ({"maxLimits": {"cpu": "lots"}}, "not a quantity"),
        ({"ceiling": {"cpu": "1"}}, "ceiling"),
    ],
)
def test_host_resource_policy_refuses_defaults_above_limits_or_ceilings(
    resources: dict[str, object], needle: str
) -> None:
    with pytest.raises(ValidationError) as exc:
        HostPolicy.model_validate({"resources": resources})
    text = error_text(exc) + " " + " ".join(error_locs(exc))
    assert needle in text
    assert any(loc.startswith("resources") for loc in error_locs(exc))


def test_resources_exceed_ceiling_refusal() -> None:
    excess = ResourceExcess("limits.memory", "4Gi", "maxLimits.memory", "2Gi")
    refusal = ResourcesExceedCeiling(kind="python", excesses=[excess])
    assert refusal.reason is RefusalReason.RESOURCES_EXCEED_CEILING
    assert refusal.reason.value == "ResourcesExceedCeiling"
    assert refusal.backend is None and refusal.kind == "python"
    assert refusal.excesses == (excess,)
    assert "limits.memory 4Gi > maxLimits.memory 2Gi" in refusal.message
    assert "hostPolicy.resources" in refusal.message and "never clamped" in refusal.message
    assert REFUSAL_TYPES[RefusalReason.RESOURCES_EXCEED_CEILING] is ResourcesExceedCeiling
    assert refusal_condition_reason(refusal.reason) is ConditionReason.RESOURCES_EXCEED_CEILING


def test_sandbox_key() -> None:
    k = SandboxKey(scope="tenant-1", thread_id="t-1", agent_dir="devops")
    assert k.call_id == ""
    assert k.to_wire() == {
        "scope": "tenant-1",
        "threadId": "t-1",
        "agentDir": "devops",
        "callId": "",
    }
    with pytest.raises(ValidationError) as exc:
        SandboxKey(scope="", thread_id="t", agent_dir="a")
    assert "scope must not be empty" in error_text(exc)
    with pytest.raises(ValidationError, match="control characters"):
        SandboxKey(scope="s", thread_id="t\n", agent_dir="a")


def test_scope_purge_and_disposal_failure() -> None:
    purge = ScopePurge(
        disposed=2, undisposed=[DisposalFailure(code="timeout", backend="acas", detail="slow")]
    )
    assert not purge.complete
    assert purge.undisposed[0].code is DisposalCode.TIMEOUT
    assert ScopePurge().complete
    with pytest.raises(ValidationError) as exc:
        DisposalFailure.model_validate({"code": "vanished", "backend": "x"})
    assert "'unreachable'" in str(exc.value)


# --- custom-resource models -------------------------------------------------------------------


def resource(**kw: object) -> SandboxResourceSpec:
    return SandboxResourceSpec.model_validate(
        {"scopeRef": "conv-1", "agentDir": "devops", "kind": "python", "image": "py:1", **kw}
    )


def test_call_id_required_iff_isolation_scope_is_call() -> None:
    assert resource().call_id == ""
    assert resource(isolationScope="call", callId="c-1").call_id == "c-1"
    with pytest.raises(ValidationError, match="callId is required when isolationScope is call"):
        resource(isolationScope="call")
    with pytest.raises(ValidationError, match="callId must be empty unless isolationScope is call"):
        resource(callId="c-1")


def test_resource_spec_yields_the_workload_spec_and_key() -> None:
    r = resource(isolationScope="call", callId="c-1", minIsolation="vm")
    s = r.sandbox_spec()
    assert type(s) is SandboxSpec
    assert s.min_isolation is Isolation.VM and s.isolation_scope is IsolationScope.CALL
    assert r.key("tenant", "thread") == SandboxKey(
        scope="tenant", thread_id="thread", agent_dir="devops", call_id="c-1"
    )
    with pytest.raises(ValidationError):
        resource(scopeRef="Not_A_Name")


def test_scope_resource_spec() -> None:
    s = SandboxScopeResourceSpec.model_validate(
        {"scope": "tenant", "threadId": "t", "minIsolation": "vm", "minIsolationScope": "call"}
    )
    assert s.min_isolation is Isolation.VM
    with pytest.raises(ValidationError, match="retired"):
        SandboxScopeResourceSpec.model_validate(
            {"scope": "tenant", "threadId": "t", "minIsolation": "process"}
        )


def test_condition_shape() -> None:
    c = Condition.model_validate(
        {
            "type": "Ready",
            "status": "False",
            "reason": "IsolationBelowFloor",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    )
    assert c.to_wire()["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    with pytest.raises(ValidationError) as exc:
        Condition.model_validate(
            {"type": "Ready", "status": "Maybe", "reason": "X", "lastTransitionTime": "2026-01-01"}
        )
    assert "'Unknown'" in str(exc.value)


# --- one source of reasons --------------------------------------------------------------------


def test_every_refusal_reason_is_a_condition_reason_and_has_a_type() -> None:
    assert set(REFUSAL_TYPES) == set(RefusalReason)
    for reason in RefusalReason:
        assert refusal_condition_reason(reason).value == reason.value
        assert REFUSAL_TYPES[reason].reason is reason
    values = {r.value for r in ConditionReason}
    for needed in [
        "ScopeNotFound",
        "Pending",
        "Creating",
        "Ready",
        "StartupFailed",
        "StartupTimeout",
        "Failed",
        "Expired",
        "Disposing",
        "Disposed",
        "DisposalFailed",
        "KeyUnclean",
        "Purged",
        "PurgeIncomplete",
    ]:
        assert needed in values
    for value in values:
        assert value[0].isupper() and value.isalnum()


# --- static bounds (issue 13): what the CRD carries as patterns and CEL ------------------------


def key(**kw: object) -> SandboxResourceSpec:
    return SandboxResourceSpec.model_validate(
        {"scopeRef": "conv", "agentDir": "agent", "kind": "python", "image": "python:1", **kw}
    )


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"agentDir": "a\x07b"}, "agentDir"),
        ({"agentDir": "\x00"}, "agentDir"),
        ({"isolationScope": "call", "callId": "c\n1"}, "callId"),
        ({"callId": "\x7f"}, "callId"),
    ],
)
def test_sandbox_key_parts_refuse_control_characters(kw: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as exc:
        key(**kw)
    assert f"{field} must not contain control characters" in error_text(exc)


#: Invisible characters that make one key read as another (#28 item 6): a right-to-left override,
#: a zero-width space and joiner, a bidi isolate, a byte-order mark, a C1 control.
INVISIBLE = ["\u202e", "\u200b", "\u200d", "\u2066", "\ufeff", "\x85", "\u00ad"]


@pytest.mark.parametrize("char", INVISIBLE)
def test_key_parts_refuse_invisible_characters_naming_the_field(char: str) -> None:
    for kw, field in (
        ({"agentDir": f"agent{char}1"}, "agentDir"),
        ({"callId": f"c{char}"}, "callId"),
    ):
        with pytest.raises(ValidationError) as exc:
            key(**kw)
        assert error_locs(exc) == [field]
    for kw in ({"scope": f"t{char}"}, {"threadId": f"thread{char}"}):
        with pytest.raises(ValidationError) as scope_exc:
            SandboxScopeResourceSpec.model_validate({"scope": "s", "threadId": "t", **kw})
        assert error_locs(scope_exc) == list(kw)
    with pytest.raises(ValidationError, match="invisible formatting characters"):
        SandboxKey(scope="s", thread_id=f"t{char}", agent_dir="a")
    # Visible non-ASCII stays a key part.
    assert key(agentDir="agent-é ✓").agent_dir == "agent-é ✓"


@pytest.mark.parametrize("kw", [{"scope": "t\x00"}, {"threadId": "a\tb"}])
def test_scope_key_parts_refuse_control_characters(kw: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="must not contain control characters"):
        SandboxScopeResourceSpec.model_validate({"scope": "s", "threadId": "t", **kw})


@pytest.mark.parametrize(
    "work_dir",
    [
        "/",
        "/proc",
        "/proc/self",
        "/sys/",
        "/dev",
        "/etc",
        "/etc/ssl",
        "/boot",
        "/run",
        "/var/run",
        "/var/run/secrets",
        "/bin",
        "/sbin/x",
        "/lib",
        "/lib64",
        "/usr/bin",
        "/usr/lib/python3",
        "/usr/local/bin",
        "/usr",
        "/usr/local",
        "/var",
        "C:\\",
        "C:\\Windows",
        "c:/windows/System32",
        "D:\\Program Files",
        "C:\\Program Files (x86)\\x",
        "C:\\ProgramData",
    ],
)
def test_work_dir_under_a_system_directory_is_refused(work_dir: str) -> None:
    with pytest.raises(ValidationError) as exc:
        spec(workDir=work_dir)
    assert "root or system directory" in error_text(exc)
    assert error_locs(exc) == ["workDir"]


@pytest.mark.parametrize(
    "work_dir, needle",
    [
        ("/w/../etc", "normalised"),
        ("/w/./x", "normalised"),
        ("//etc", "normalised"),
        ("C:\\w\\..\\Windows", "normalised"),
        ("C:\\PROGRA~1", "Windows spelling"),
        ("C:\\Windows.", "Windows spelling"),
        ("C:\\work ", "Windows spelling"),
        ("C:\\w:stream", "Windows spelling"),
        ("/w\x1b", "control characters"),
    ],
)
def test_work_dir_must_be_normalised_and_plain(work_dir: str, needle: str) -> None:
    with pytest.raises(ValidationError) as exc:
        spec(workDir=work_dir)
    assert needle in error_text(exc)


@pytest.mark.parametrize(
    "work_dir",
    [
        "/workspace",
        "/workspace/",
        "/procs",
        "/var/runner",
        "/etc2",
        "/tmp",
        "C:\\work",
        "/usr/src/app",
        "/var/lib/app",
        "/binaries",
        "/library",
        "/usr/local/app",
    ],
)
def test_work_dir_neighbours_of_system_directories_are_fine(work_dir: str) -> None:
    assert spec(workDir=work_dir).work_dir == work_dir


def test_a_windows_work_dir_contradicts_requires_os_family_posix() -> None:
    with pytest.raises(ValidationError, match="is a Windows path, but requiresOsFamily is posix"):
        spec(workDir="C:\\work", requiresOsFamily="posix")
    assert spec(workDir="C:\\work", requiresOsFamily="windows").work_dir == "C:\\work"


@pytest.mark.parametrize("field", ["path", "name"])
@pytest.mark.parametrize("value", ["*", "**/*", "out/*.png", "a?.txt", "[ab].txt"])
def test_declared_outputs_refuse_globs(field: str, value: str) -> None:
    entry = {"path": "a.png", "mediaType": "image/png", field: value}
    with pytest.raises(ValidationError) as exc:
        spec(requires=["exec", "files_out"], declaredOutputs=[entry])
    assert "glob characters" in error_text(exc)
    assert error_locs(exc) == [f"declaredOutputs.0.{field}"]


@pytest.mark.parametrize(
    "host, needle",
    [
        ("169.254.169.254", "IP literal"),
        ("10.0.0.1", "IP literal"),
        ("0x7f.0x1", "IP literal"),
        ("1.2.3.04", "IP literal"),
        ("2130706433", "single-label"),
        ("metadata", "single-label"),
        ("instance-data", "single-label"),
        ("localhost", "single-label"),
        ("metadata.google.internal", "metadata or loopback"),
        ("metadata.goog", "metadata or loopback"),
        ("instance-data.ec2.internal", "metadata or loopback"),
        ("app.localhost", "metadata or loopback"),
        ("*.internal", "would allow a cloud metadata name"),
        ("*.google.internal", "would allow a cloud metadata name"),
        ("*.goog", "would allow a cloud metadata name"),
    ],
)
def test_egress_allow_refuses_ip_literals_and_metadata_names(host: str, needle: str) -> None:
    with pytest.raises(ValidationError) as exc:
        spec(egress="allowlist", egressAllow=["pypi.org", host])
    assert needle in error_text(exc)
    assert error_locs(exc) == ["egressAllow.1"]


@pytest.mark.parametrize("host", ["::1", "[fd00:ec2::254]", "fe80::1%eth0", "[2001:db8::1]"])
def test_egress_allow_refuses_ipv6_literals(host: str) -> None:
    with pytest.raises(ValidationError) as exc:
        spec(egress="allowlist", egressAllow=[host])
    assert error_locs(exc) == ["egressAllow.0"]


@pytest.mark.parametrize(
    "host", ["pypi.org", "*.pythonhosted.org", "1a.2b", "x.0xzz", "metadata.example.com"]
)
def test_egress_allow_neighbours_are_fine(host: str) -> None:
    assert spec(egress="allowlist", egressAllow=[host]).egress_allow == (host,)


@pytest.mark.parametrize("image", ["py\x0b:1", "py\u00a0:1", "py\x85:1", "py\x01:1", "py\u3000"])
def test_image_refuses_every_kind_of_space_and_control(image: str) -> None:
    with pytest.raises(ValidationError) as exc:
        spec(image=image)
    assert error_locs(exc) == ["image"]


@pytest.mark.parametrize("value", [-1, 2**63, "1" * 65, "-1", "1e3", "1m\n", "1\n", "1Ki\n"])
def test_quantities_out_of_kubernetes_range_are_refused(value: object) -> None:
    with pytest.raises(ValidationError) as exc:
        spec(resources={"limits": {"cpu": value}})
    assert error_locs(exc) == ["resources.limits.cpu"]


def test_a_whole_float_quantity_is_its_integer_as_on_the_api_server() -> None:
    # The API server stores limits.memory 3.0 as 3 and refuses 1.5 and 1e20 (not an int64).
    assert spec(resources={"limits": {"memory": 3.0}}).resources.limits.memory == "3"
    for value in (1.5, 1e20, -2.0):
        with pytest.raises(ValidationError) as exc:
            spec(resources={"limits": {"memory": value}})
        assert error_locs(exc) == ["resources.limits.memory"]


def test_quantities_compare_as_kubernetes_does() -> None:
    # Rounded up to a nano, capped at 2^63-1: the API server's quantity() agrees.
    assert parse_quantity("0.0000000001") == parse_quantity("0.000000001")
    assert parse_quantity("9" * 30 + "P") == parse_quantity("8" * 30 + "P") == 2**63 - 1
    assert spec(resources={"limits": {"cpu": 2**63 - 1}}).resources.limits.cpu == str(2**63 - 1)
    spec(resources={"requests": {"cpu": "9" * 30}, "limits": {"cpu": "8" * 30}})


# --- egressRules: methods and paths (#38 item 2) ----------------------------------------------


def rule(**kw: object) -> dict[str, object]:
    return {"host": "api.example.com", "schemes": ["http"], "methods": ["GET"], **kw}


def test_an_egress_rule_keeps_its_methods_and_paths_on_the_wire() -> None:
    s = spec(
        egress="allowlist",
        egressAllow=["pypi.org"],
        egressRules=[rule(methods=["GET", "PROPFIND"], paths=["/v1/*", "/health"])],
    )
    assert s.to_wire()["egressRules"] == [
        {
            "host": "api.example.com",
            "schemes": ["http"],
            "methods": ["GET", "PROPFIND"],
            "paths": ["/v1/*", "/health"],
        }
    ]


def test_a_spec_without_rules_is_unchanged_on_the_wire() -> None:
    # Existing Sandboxes have no egressRules; writing [] on every apply would be refused by the
    # CRD's fixed-after-creation rule (see OMITTED_WHEN_UNSET).
    wire = spec(egress="allowlist", egressAllow=["pypi.org"]).to_wire()
    assert "egressRules" not in wire
    assert wire["egressAllow"] == ["pypi.org"]


@pytest.mark.parametrize(
    ("entry", "loc", "needle"),
    [
        (rule(methods=["get"]), "egressRules.0.methods.0", "pattern"),
        (rule(methods=["Get"]), "egressRules.0.methods.0", "pattern"),
        (rule(methods=["CONNECT"]), "egressRules.0.methods.0", "CONNECT opens a tunnel"),
        (rule(methods=[]), "egressRules.0.methods", "at least 1"),
        (rule(methods=["GET", "GET"]), "egressRules.0", "methods twice"),
        (rule(paths=["/a/../b"]), "egressRules.0.paths.0", "'..' segment"),
        (rule(paths=["/a/./b"]), "egressRules.0.paths.0", "'..' segment"),
        (rule(paths=["/a/..;/b"]), "egressRules.0.paths.0", "'..' segment"),
        (rule(paths=["/a/%2e%2e/b"]), "egressRules.0.paths.0", "percent-encoded"),
        (rule(paths=["/a/%2E/b"]), "egressRules.0.paths.0", "percent-encoded"),
        (rule(paths=["/a%2fb"]), "egressRules.0.paths.0", "percent-encoded"),
        (rule(paths=["/a%5cb"]), "egressRules.0.paths.0", "percent-encoded"),
        (rule(paths=["/a*"]), "egressRules.0.paths.0", "last segment"),
        (rule(paths=["/a/*/b"]), "egressRules.0.paths.0", "pattern"),
        (rule(paths=["/a?x=1"]), "egressRules.0.paths.0", "pattern"),
        (rule(paths=["/a\\b"]), "egressRules.0.paths.0", "pattern"),
        (rule(paths=["/a b"]), "egressRules.0.paths.0", "pattern"),
        (rule(paths=["a/b"]), "egressRules.0.paths.0", "pattern"),
        (rule(paths=["/a%zz"]), "egressRules.0.paths.0", "pattern"),
        (rule(schemes=["http", "http"]), "egressRules.0", "schemes twice"),
        (rule(schemes=["ftp"]), "egressRules.0.schemes.0", "http"),
        (rule(schemes=[]), "egressRules.0.schemes", "at least 1"),
        ({"host": "api.example.com", "schemes": ["http"]}, "egressRules.0", "egressAllow instead"),
        (rule(host="169.254.169.254"), "egressRules.0.host", "IP literal"),
        (rule(host="metadata.google.internal"), "egressRules.0.host", "metadata"),
    ],
)
def test_an_egress_rule_the_proxy_cannot_enforce_is_refused_naming_the_field(
    entry: dict[str, object], loc: str, needle: str
) -> None:
    with pytest.raises(ValidationError) as exc:
        spec(egress="allowlist", egressRules=[entry])
    # An optional list's error comes with its "or None" branch's, at the list itself.
    assert loc in error_locs(exc)
    assert all(loc.startswith(at) for at in error_locs(exc))
    assert needle in error_text(exc)


@pytest.mark.parametrize(
    "paths", [["/"], ["/*"], ["/v1/*"], ["/v1/models"], ["/a/.well-known/x"], ["/a%20b", "/..a"]]
)
def test_egress_rule_path_neighbours_are_fine(paths: list[str]) -> None:
    s = spec(egress="allowlist", egressRules=[rule(paths=paths)])
    assert s.egress_rules[0].paths == tuple(paths)


def test_an_https_rule_is_a_contract_the_backend_must_declare() -> None:
    # The model holds it; admission asks the backend (egressRulesHttps, tests/unit/test_policy).
    s = spec(egress="allowlist", egressRules=[rule(schemes=["http", "https"])])
    assert [str(x) for x in s.egress_rules[0].schemes] == ["http", "https"]


def test_egress_rules_combinations_are_refused() -> None:
    with pytest.raises(ValidationError, match="only valid with egress allowlist"):
        spec(egress="closed", egressRules=[rule()])
    with pytest.raises(ValidationError, match="names a host more than once"):
        spec(egress="allowlist", egressRules=[rule(), rule(methods=["POST"])])
    with pytest.raises(ValidationError, match="list a host in one of them"):
        spec(egress="allowlist", egressAllow=["api.example.com"], egressRules=[rule()])


CREDENTIAL = {"secretName": "api-token", "key": "token"}


def test_a_credential_names_a_secret_for_one_exact_https_origin() -> None:
    # #38 item 3: a reference only (the value stays in the Secret), with the header it fills.
    s = spec(egress="allowlist", egressRules=[rule(schemes=["https"], credential=CREDENTIAL)])
    credential = s.egress_rules[0].credential
    assert credential is not None
    assert (credential.secret_name, credential.key) == ("api-token", "token")
    assert (credential.header, credential.prefix) == ("Authorization", "Bearer ")
    wire = s.model_dump(mode="json", by_alias=True)["egressRules"][0]["credential"]
    assert wire == {**CREDENTIAL, "header": "Authorization", "prefix": "Bearer "}
    # A credential alone (every method and path of the origin, with it) is a rule too.
    alone = {"host": "api.example.com", "schemes": ["https"], "credential": CREDENTIAL}
    assert spec(egress="allowlist", egressRules=[alone]).egress_rules[0].methods is None


@pytest.mark.parametrize(
    ("entry", "loc", "needle"),
    [
        (rule(schemes=["http"], credential=CREDENTIAL), "egressRules.0", "schemes [https] only"),
        (rule(schemes=["http", "https"], credential=CREDENTIAL), "egressRules.0", "[https]"),
        (
            rule(host="*.example.com", schemes=["https"], credential=CREDENTIAL),
            "egressRules.0",
            "exact host",
        ),
        (
            rule(schemes=["https"], credential={**CREDENTIAL, "header": "Host"}),
            "egressRules.0.credential.header",
            "the proxy's own",
        ),
        (
            rule(schemes=["https"], credential={**CREDENTIAL, "prefix": "Bearer\r\nX: "}),
            "egressRules.0.credential.prefix",
            "pattern",
        ),
        (
            rule(schemes=["https"], credential={**CREDENTIAL, "secretName": "Bad_Name"}),
            "egressRules.0.credential.secretName",
            "pattern",
        ),
        (
            rule(schemes=["https"], credential={"secretName": "s"}),
            "egressRules.0.credential.key",
            "required",
        ),
    ],
)
def test_a_credential_the_proxy_cannot_attach_safely_is_refused_naming_the_field(
    entry: dict[str, object], loc: str, needle: str
) -> None:
    with pytest.raises(ValidationError) as exc:
        spec(egress="allowlist", egressRules=[entry])
    assert loc in error_locs(exc)
    assert needle in error_text(exc)
