"""Whether idle warm-pool pods are sealed until claimed (reconcile/seal.py, #36 item 2): the
chart's own policies judged as the operator watches them, every way they can fail to seal, and
what a claim records."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sandbox_operator.backends.base import Observation, ObservedPhase, ServedBy
from sandbox_operator.contract import SandboxKey, SandboxResourceSpec
from sandbox_operator.reconcile import compute
from sandbox_operator.reconcile.seal import NOT_CONFIGURED, SETTLE, Seal, judge_seal, seal_names
from sandbox_operator.views import AdmissionPolicyView, PolicyBindingView, SandboxView
from tests.fixtures.chart import template

OPERATOR = "system:serviceaccount:so-system:so-sandbox-operator"
POLICY = "so-sandbox-operator-sealed-pool-pods"
T0 = datetime(2026, 12, 1, 10, tzinfo=UTC)


def _stamp(obj: dict[str, Any], created: datetime, changed: datetime | None = None) -> None:
    obj["metadata"]["creationTimestamp"] = f"{created:%Y-%m-%dT%H:%M:%SZ}"
    obj["metadata"]["managedFields"] = [
        {"manager": "helm", "time": f"{(changed or created):%Y-%m-%dT%H:%M:%SZ}"}
    ]


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, Any]]:
    """The chart's four objects, as the API server would hold them, keyed as judge_seal takes."""
    objs = template({"sealIdlePoolPods": "true"}, namespace="so-system")
    out: dict[str, dict[str, Any]] = {}
    for o in objs:
        if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") != "warm-pools":
            continue
        kind = "policy" if o["kind"] == "ValidatingAdmissionPolicy" else "binding"
        _stamp(o, T0)
        out[f"{kind}/{o['metadata']['name']}"] = o
    assert len(out) == 4, sorted(out)
    return out


def objects(rendered: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A copy of the four, as the watches hand them out (views over the wire dicts)."""
    return {
        key: (AdmissionPolicyView if key.startswith("policy/") else PolicyBindingView)(obj)
        for key, obj in copy.deepcopy(rendered).items()
    }


def test_the_charts_policies_seal_from_their_last_change_on(
    rendered: dict[str, dict[str, Any]],
) -> None:
    objs = objects(rendered)
    seal = judge_seal(objs, POLICY, OPERATOR)
    assert seal.since == T0 + SETTLE, seal
    assert "sealed by" in seal.reason
    # A pod made before the policies were in force is not covered; one made after is.
    assert not seal.covers(T0 + SETTLE - timedelta(seconds=1))
    assert seal.covers(T0 + SETTLE + timedelta(seconds=1))
    assert not seal.covers(None)
    # The API server's own status write (the policy's type checking) changes nothing enforced.
    policy = objs[f"policy/{POLICY}"]
    assert policy is not None
    policy["metadata"]["managedFields"].append(
        {"manager": "validatingadmissionpolicy-status", "subresource": "status",
         "time": f"{T0 + timedelta(minutes=5):%Y-%m-%dT%H:%M:%SZ}"}
    )  # fmt: skip
    assert judge_seal(objs, POLICY, OPERATOR).since == T0 + SETTLE
    # Any later write to any of the four moves "since" past the pods made before it.
    changed = T0 + timedelta(hours=1)
    binding = objs[f"binding/{seal_names(POLICY)[1]}"]
    assert binding is not None
    _stamp(binding, T0, changed)
    assert judge_seal(objs, POLICY, OPERATOR).since == changed + SETTLE


def _break(objs: dict[str, Any], how: str) -> None:
    connect, update = seal_names(POLICY)
    if how == "no-binding":
        objs[f"binding/{update}"] = None
    elif how == "no-policy":
        del objs[f"policy/{connect}"]
    elif how == "fails-open":
        objs[f"policy/{update}"]["spec"]["failurePolicy"] = "Ignore"
    elif how == "warns-only":
        objs[f"binding/{connect}"]["spec"]["validationActions"] = ["Warn"]
    elif how == "no-portforward":
        objs[f"policy/{connect}"]["spec"]["matchConstraints"]["resourceRules"][0]["resources"] = [
            "pods/exec", "pods/attach"
        ]  # fmt: skip
    elif how == "exempts-someone":
        for c in objs[f"policy/{connect}"]["spec"]["matchConditions"]:
            if c["name"] == "not-the-operator":
                c["expression"] = c["expression"].replace("[", '["kubernetes-admin",', 1)
    elif how == "no-exemption":
        spec = objs[f"policy/{update}"]["spec"]
        spec["matchConditions"] = [
            c for c in spec["matchConditions"] if c["name"] != "not-the-operator"
        ]
    elif how == "other-params":
        objs[f"binding/{connect}"]["spec"]["paramRef"]["selector"] = {}
    elif how == "binds-other":
        objs[f"binding/{connect}"]["spec"]["policyName"] = "something-else"


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("no-binding", f"ValidatingAdmissionPolicyBinding {POLICY}-update is not installed"),
        ("no-policy", f"ValidatingAdmissionPolicy {POLICY} is not installed"),
        ("fails-open", "does not fail closed"),
        ("warns-only", "does not deny"),
        ("no-portforward", "not match CONNECT of all of pods/attach, pods/exec, pods/portforward"),
        ("exempts-someone", "exempts identities besides the operator's"),
        ("no-exemption", "has no exemption for the operator"),
        ("other-params", "does not take the idle pool pods"),
        ("binds-other", "binds another policy"),
    ],
)  # fmt: skip
def test_every_way_the_policies_do_not_seal_is_named(
    rendered: dict[str, dict[str, Any]], how: str, says: str
) -> None:
    objs: dict[str, Any] = objects(rendered)
    _break(objs, how)
    seal = judge_seal(objs, POLICY, OPERATOR)
    assert seal.since is None and says in seal.reason, seal
    assert seal.reason.startswith("idle pool pods are not sealed: ")


def test_policies_exempting_another_operator_do_not_seal_for_this_one(
    rendered: dict[str, dict[str, Any]],
) -> None:
    seal = judge_seal(objects(rendered), POLICY, "system:serviceaccount:other:operator")
    assert (
        seal.since is None and "not this one (system:serviceaccount:other:operator)" in seal.reason
    )


# ---- what a claim records ---------------------------------------------------------------------


def _plan(
    status: dict[str, Any], served_from: str, created: datetime, seal: Seal
) -> dict[str, Any]:
    now = T0 + timedelta(hours=2)
    spec = {"scopeRef": "conv", "agentDir": "a", "kind": "shell", "image": "busybox"}
    obj = SandboxView({"metadata": {"name": "box", "namespace": "ns", "uid": "u", "generation": 1},
                       "spec": spec, "status": status})  # fmt: skip
    admission = compute.Admission(
        True, "Admitted", "admitted", "gvisor",
        key=SandboxKey(scope="s", thread_id="t", agent_dir="a", call_id=""),
    )  # fmt: skip
    obs = Observation(
        ObservedPhase.READY, ServedBy("Pod", "x", "ns"), created_at=created, ready_at=created,
        served_from=served_from,
    )  # fmt: skip
    parsed = SandboxResourceSpec.model_validate(spec)
    plan = compute.plan(obj, parsed, admission, obs, key_unclean=None, scope_problem="", now=now,
                        seal=seal)  # fmt: skip
    return dict(plan.fields)


def test_a_claim_records_whether_its_pod_was_sealed_from_its_creation() -> None:
    seal = Seal(T0, "sealed")
    pool = "SandboxWarmPool/p"
    assert _plan({}, pool, T0 + timedelta(minutes=1), seal)["sealedUntilClaim"] is True
    assert _plan({}, pool, T0 - timedelta(minutes=1), seal)["sealedUntilClaim"] is False
    assert _plan({}, pool, T0 + timedelta(minutes=1), NOT_CONFIGURED)["sealedUntilClaim"] is False
    # Judged once, at the claim: what the policies do later does not reach back.
    kept = {"sealedUntilClaim": True}
    assert _plan(kept, pool, T0 + timedelta(minutes=1), NOT_CONFIGURED)["sealedUntilClaim"] is True
    # A cold pod was made for its Sandbox: nothing to record.
    assert "sealedUntilClaim" not in _plan({}, "cold", T0 + timedelta(minutes=1), seal)
