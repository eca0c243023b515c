"""The pure half of a Sandbox pass (reconcile/compute.py): admission, the plan, the deadlines.

No fakes at all: each case is (object, scope, host policy, observation) in, a decision out.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from sandbox_operator.backends.base import Observation, ObservedPhase, ServedBy
from sandbox_operator.config import parse_config, profiles
from sandbox_operator.contract import SandboxResourceSpec
from sandbox_operator.reconcile import compute
from sandbox_operator.reconcile.statusfields import served_by_wire
from sandbox_operator.views import SandboxScopeView, SandboxStatusView
from tests.fixtures.compute import (
    NOW,
    SCOPE,
    SPEC,
    admit,
    admitted_status,
    rfc,
    sandbox,
)


def plan(obj: Any, obs: Observation, unclean: str | None = None) -> compute.Plan:
    spec = SandboxResourceSpec.model_validate(obj["spec"])
    return compute.plan(obj, spec, admit(obj), obs, key_unclean=unclean, scope_problem="", now=NOW)


def test_a_new_sandbox_is_admitted_with_its_backend_floor_and_key() -> None:
    a = admit(sandbox())
    assert a.admitted and a.decided_now and a.backend == "gvisor"
    assert a.fields["effectiveFloor"] == "hardened_container"
    assert a.key is not None and a.key.agent_dir == "agents/a"


def test_a_refusal_names_its_reason_and_records_the_floor() -> None:
    a = admit(sandbox({**SPEC, "minIsolation": "microvm"}))
    assert not a.admitted and a.reason == "NoBackendCanServe"  # perSpec: none reaches microvm
    assert a.fields["effectiveFloor"] == "microvm" and a.fields["backend"] is None
    p = compute.refusal_plan(a)
    assert [(c[0], c[2]) for c in p.conditions] == [
        ("Admitted", "NoBackendCanServe"),
        ("Ready", "NoBackendCanServe"),
    ]
    assert not p.create and not p.dispose


def test_a_missing_or_deleting_scope_is_scope_not_found() -> None:
    assert admit(sandbox(), None).reason == "ScopeNotFound"
    deleting = {**SCOPE, "metadata": {**SCOPE["metadata"], "deletionTimestamp": rfc(NOW)}}
    a = admit(sandbox(), deleting)
    assert a.reason == "ScopeNotFound" and "being deleted" in a.message


def test_an_admission_is_never_decided_again() -> None:
    # Admitted earlier to a floor this host policy would now refuse: it stands.
    obj = sandbox({**SPEC, "minIsolation": "microvm"}, admitted_status(NOW))
    a = admit(obj)
    assert a.admitted and not a.decided_now and a.backend == "gvisor" and not a.fields


def test_an_invalid_spec_names_the_field() -> None:
    msg = compute.parse_spec(sandbox({**SPEC, "lifetime": {"ttlSeconds": -1}}))
    assert isinstance(msg, str) and "lifetime.ttlSeconds" in msg


def test_nothing_there_yet_means_create_and_an_unclean_key_means_wait() -> None:
    absent = Observation(ObservedPhase.ABSENT)
    p = plan(sandbox(), absent)
    assert p.create and ("Ready", False, "Creating", "creating the sandbox") in p.conditions
    held = plan(sandbox(), absent, unclean="Pod x of an earlier sandbox")
    assert not held.create
    assert {c[2] for c in held.conditions} == {"KeyUnclean"}


def test_starting_is_bounded_by_the_startup_deadline() -> None:
    created = NOW - timedelta(seconds=20)
    obs = Observation(ObservedPhase.STARTING, ServedBy("Pod", "sbx-a", "ns"), created_at=created)
    spec = {**SPEC, "lifetime": {"startupTimeoutSeconds": 300}}
    p = plan(sandbox(spec, admitted_status(created)), obs)
    assert p.verdict is not None and p.verdict.reason == "Creating"
    assert p.requeue_after is not None
    assert abs(p.requeue_after - (300 - 20)) < 1
    assert p.fields["servedBy"] == {"kind": "Pod", "name": "sbx-a", "namespace": "ns"}


def test_a_driver_recheck_comes_before_the_startup_deadline() -> None:
    obs = Observation(ObservedPhase.STARTING, created_at=NOW, recheck_at=NOW + timedelta(seconds=3))
    p = plan(sandbox(status=admitted_status(NOW)), obs)
    assert p.requeue_after is not None and 3 <= p.requeue_after < 3.5


def test_ready_waits_only_for_ttl_or_idle() -> None:
    ready_at = NOW - timedelta(seconds=100)
    spec = {**SPEC, "lifetime": {"ttlSeconds": 3600, "idleTimeoutSeconds": 600}}
    obj = sandbox(spec, admitted_status(ready_at, ready=True, ready_at=ready_at))
    obs = Observation(ObservedPhase.READY, ServedBy("Pod", "sbx-a", "ns"), ready_at=ready_at)
    p = plan(obj, obs)
    assert p.verdict is not None and p.verdict.ready
    assert p.requeue_after is not None and abs(p.requeue_after - 500) < 1  # idle first
    obj["metadata"]["annotations"] = {"sandbox-operator.dev/last-activity": rfc(NOW)}
    p = plan(obj, obs)
    assert p.requeue_after is not None and abs(p.requeue_after - 600) < 1  # activity moved it


def test_expired_and_failed_are_terminal_with_disposal_and_no_deadline() -> None:
    ready_at = NOW - timedelta(seconds=700)
    spec = {**SPEC, "lifetime": {"idleTimeoutSeconds": 600}}
    obj = sandbox(spec, admitted_status(ready_at, ready=True, ready_at=ready_at))
    p = plan(obj, Observation(ObservedPhase.READY, ready_at=ready_at))
    assert p.verdict is not None and p.verdict.reason == "Expired"
    assert p.dispose and p.requeue_after is None
    gone = plan(sandbox(status=admitted_status(NOW, ready=True)), Observation(ObservedPhase.ABSENT))
    assert gone.verdict is not None and gone.verdict.reason == "Failed" and gone.dispose
    failed = {"conditions": [{"type": "Ready", "status": "False", "reason": "Failed"}]}
    assert compute.is_terminal(SandboxStatusView(failed))


ALLOWLIST_CONFIG, _ = parse_config(
    {
        "hostPolicy": {"minIsolation": "hardened_container", "selection": "perSpec"},
        "backends": [
            {
                "name": "gvisor",
                "type": "runtimeClass",
                "runtimeClassName": "gvisor",
                "isolation": "hardened_container",
                "declarations": {"egressModes": ["closed", "allowlist"]},
                "egressProxy": {"url": "http://proxy:3128", "port": 3128},
            }
        ],
    }
)
ALLOWLIST_SPEC = {**SPEC, "egress": "allowlist", "egressAllow": ["pypi.org", "*.example.com"]}


def admit_allowlist(obj: Any) -> compute.Admission:
    spec = SandboxResourceSpec.model_validate(obj["spec"])
    return compute.admit(
        obj,
        spec,
        compute.resolve_scope(SandboxScopeView(SCOPE), spec.scope_ref, "ns"),
        host_policy=ALLOWLIST_CONFIG.host_policy,
        profiles=profiles(ALLOWLIST_CONFIG),
        known_backends=("gvisor",),
    )


def test_admission_records_the_allowlist_it_judged() -> None:
    a = admit_allowlist(sandbox(ALLOWLIST_SPEC))
    assert a.admitted and a.decided_now
    assert a.fields["admittedEgressAllow"] == ["pypi.org", "*.example.com"]
    # Closed egress records none.
    assert "admittedEgressAllow" not in admit_allowlist(sandbox()).fields


def test_admission_records_the_egress_rules_it_judged_and_nothing_without_them() -> None:
    # #38 item 2: the proxy enforces status.admittedEgressRules; a spec without rules records
    # none (an older Sandbox's status stays as it was).
    rule = {"host": "api.example.com", "schemes": ["http"], "methods": ["GET"], "paths": ["/v1/*"]}
    ruled = SandboxResourceSpec.model_validate({**ALLOWLIST_SPEC, "egressRules": [rule]})
    assert compute.admitted_allow(ruled) == {
        "admittedEgressAllow": ["pypi.org", "*.example.com"],
        "admittedEgressRules": [rule],
    }
    plain = SandboxResourceSpec.model_validate(ALLOWLIST_SPEC)
    assert "admittedEgressRules" not in compute.admitted_allow(plain)


def test_a_recalled_admission_never_rewrites_the_allowlist_from_the_spec() -> None:
    # Admitted, its lists not in status (from before they were recorded, or removed): the
    # admission does not take the spec's lists as they are; the egress edit judges them
    # (tests/unit/test_egress_edit.py).
    a = admit_allowlist(sandbox(ALLOWLIST_SPEC, admitted_status(NOW)))
    assert not a.decided_now and a.fields == {}
    # Recorded already: a later spec (an edit) changes nothing here either.
    status = {**admitted_status(NOW), "admittedEgressAllow": ["pypi.org"]}
    edited = {**ALLOWLIST_SPEC, "egressAllow": ["evil.example"]}
    assert admit_allowlist(sandbox(edited, status)).fields == {}


@pytest.mark.parametrize(
    "served",
    [
        ServedBy("Pod", "sbx-a", "ns"),
        ServedBy("AcaSandbox", "sb-1"),
        ServedBy("AcaSandbox", "b", ""),
    ],
)
def test_status_served_by_is_the_contract_models_wire_form(served: ServedBy) -> None:
    """``status.servedBy`` as the pass writes it (a typed dict built field by field) is what the
    contract's ``ServedBy`` encodes: no namespace for a remote resource."""
    assert served_by_wire(served) == served.to_wire()
    assert served_by_wire(None) is None
