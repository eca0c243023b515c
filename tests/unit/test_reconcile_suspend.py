"""Suspend and resume as pure decisions (reconcile/compute.py, reconcile/lifecycle.py): where a
Sandbox stands, what its status says while suspended, the TTL, the resume's re-admission."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from sandbox_operator.backends.base import Observation, ObservedPhase, ServedBy
from sandbox_operator.config import parse_config, profiles
from sandbox_operator.contract import (
    BackendDeclarations,
    Lifetime,
    NoBackendCanServe,
    SandboxResourceSpec,
    SandboxSpec,
    StorageNotSupported,
)
from sandbox_operator.policy import BackendProfile, select_backend
from sandbox_operator.reconcile import compute
from sandbox_operator.reconcile.lifecycle import judge
from sandbox_operator.views import SandboxScopeView, SandboxStatusView
from tests.fixtures import compute as compute_fixture
from tests.fixtures.compute import rfc

NOW = datetime(2099, 1, 1, 12, 0, 0, tzinfo=UTC)
STORAGE = {"size": "1Gi"}
SPEC = {
    "scopeRef": "conv",
    "agentDir": "agents/a",
    "kind": "shell",
    "image": "busybox",
    "storage": STORAGE,
}
SCOPE = {"metadata": {"name": "conv", "namespace": "ns"}, "spec": {"scope": "s", "threadId": "t"}}


def config(floor: str = "hardened_container", storage: bool = True) -> Any:
    parsed, _ = parse_config(
        {
            "hostPolicy": {"minIsolation": floor, "selection": "perSpec"},
            "backends": [
                {
                    "name": "gvisor",
                    "type": "runtimeClass",
                    "runtimeClassName": "gvisor",
                    "isolation": "hardened_container",
                    "declarations": {"egressModes": ["closed"], "persistentStorage": storage},
                }
            ],
        }
    )
    return parsed


def sandbox(spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None) -> Any:
    return compute_fixture.sandbox(spec or SPEC, status, age=100)


def ready_status(**extra: Any) -> dict[str, Any]:
    return {
        "conditions": [
            {
                "type": "Admitted",
                "status": "True",
                "reason": "Admitted",
                "message": "admitted to backend gvisor",
                "lastTransitionTime": rfc(NOW - timedelta(seconds=90)),
            },
            {
                "type": "Ready",
                "status": "True",
                "reason": "Ready",
                "message": "",
                "lastTransitionTime": rfc(NOW - timedelta(seconds=80)),
            },
        ],
        "backend": "gvisor",
        "isolationScope": "conversation",
        **extra,
    }


def spec_of(obj: Any) -> SandboxResourceSpec:
    return SandboxResourceSpec.model_validate(obj["spec"])


# -- the contract ---------------------------------------------------------------------------


def test_suspended_and_idle_suspend_need_storage() -> None:
    bare = {k: v for k, v in SPEC.items() if k != "storage"}
    with pytest.raises(ValidationError, match="suspended needs storage"):
        SandboxResourceSpec.model_validate({**bare, "suspended": True})
    with pytest.raises(ValidationError, match="idleAction suspend needs storage"):
        SandboxResourceSpec.model_validate({**bare, "lifetime": {"idleAction": "suspend"}})
    assert SandboxResourceSpec.model_validate({**SPEC, "suspended": True}).suspended


@pytest.mark.parametrize("size", ["0", "2Ti", "-1Gi", "lots"])
def test_storage_size_bounds(size: str) -> None:
    with pytest.raises(ValidationError):
        SandboxResourceSpec.model_validate({**SPEC, "storage": {"size": size}})


def test_storage_refused_where_not_declared() -> None:
    spec = SandboxSpec(kind="shell", image="busybox", storage={"size": "1Gi"})
    plain = BackendProfile("runc", "container", BackendDeclarations(egress_modes={"closed"}))
    cfg = config(floor="container")
    with pytest.raises(NoBackendCanServe) as err:
        select_backend(cfg.host_policy, [plain], spec)
    (why,) = err.value.refusals
    assert isinstance(why, StorageNotSupported) and why.reason.value == "StorageNotSupported"
    kept = BackendProfile(
        "runc",
        "container",
        BackendDeclarations(egress_modes={"closed"}, persistent_storage=True),
    )
    assert select_backend(cfg.host_policy, [kept], spec).backend.name == "runc"


# -- where a Sandbox stands -----------------------------------------------------------------


def _suspension(obj: Any, status: dict[str, Any], at: datetime | None) -> compute.Suspension:
    return compute.suspension(spec_of(obj), SandboxStatusView(status), last_activity=at)


def test_suspension_states() -> None:
    running = sandbox()
    assert _suspension(running, {}, None).state == "running"
    asked = sandbox({**SPEC, "suspended": True})
    assert _suspension(asked, {}, None) == compute.Suspension("suspend", "spec")
    held = {"suspendedBy": "spec", "suspendedAt": rfc(NOW)}
    assert _suspension(asked, held, None).state == "suspended"
    # spec.suspended back to false: resume
    assert _suspension(running, held, None).state == "resume"
    idle = {"suspendedBy": "idle", "suspendedAt": rfc(NOW)}
    before = NOW - timedelta(seconds=5)
    after = NOW + timedelta(seconds=5)
    assert _suspension(running, idle, None).state == "suspended"
    assert _suspension(running, idle, before).state == "suspended"
    assert _suspension(running, idle, after).state == "resume"
    # idle-suspended, then the spec asks too: held by the spec from now on
    assert _suspension(asked, idle, after) == compute.Suspension("suspended", "spec")


def test_idle_timeout_suspends_when_declared() -> None:
    obs = Observation(ObservedPhase.READY, ready_at=NOW - timedelta(seconds=1000))
    common: dict[str, Any] = {
        "was_ready": True,
        "ready_since": NOW - timedelta(seconds=1000),
        "sandbox_created": NOW - timedelta(seconds=1000),
        "admitted_at": NOW - timedelta(seconds=1000),
        "last_activity": None,
        "now": NOW,
    }
    lifetime = Lifetime(idle_timeout_seconds=60, ttl_seconds=3600)
    expired = judge(obs, lifetime=lifetime, **common)
    assert (expired.reason, expired.terminal, expired.suspend) == ("Expired", True, False)
    suspend = Lifetime(idle_timeout_seconds=60, ttl_seconds=3600, idle_action="suspend")
    verdict = judge(obs, lifetime=suspend, **common)
    assert (verdict.reason, verdict.terminal, verdict.dispose, verdict.suspend) == (
        "Suspended",
        False,
        False,
        True,
    )
    ttl = judge(
        obs,
        lifetime=Lifetime(idle_timeout_seconds=60, ttl_seconds=600, idle_action="suspend"),
        **common,
    )
    assert ttl.reason == "Expired", "the TTL wins over idling"


def test_plan_says_suspend_for_an_idle_sandbox() -> None:
    spec = {**SPEC, "lifetime": {"idleTimeoutSeconds": 30, "idleAction": "suspend"}}
    obj = sandbox(spec, ready_status())
    cfg = config()
    resolution = compute.resolve_scope(SandboxScopeView(SCOPE), "conv", "ns")
    admission = compute.admit(
        obj,
        spec_of(obj),
        resolution,
        host_policy=cfg.host_policy,
        profiles=profiles(cfg, {}),
        known_backends=("gvisor",),
    )
    obs = Observation(
        ObservedPhase.READY,
        served_by=ServedBy("Pod", "sbx-a", "ns"),
        ready_at=NOW - timedelta(seconds=80),
    )
    plan = compute.plan(
        obj, spec_of(obj), admission, obs, key_unclean=None, scope_problem="", now=NOW
    )
    assert plan.suspend and not plan.dispose and not plan.create


# -- the suspended status -------------------------------------------------------------------


def test_suspended_plan_records_once() -> None:
    obj = sandbox({**SPEC, "suspended": True}, ready_status(suspendCount=2))
    first = compute.suspended_plan(obj, spec_of(obj), "spec", still_stopping=["Pod sbx-a"], now=NOW)
    assert first.conditions[0][:3] == ("Ready", False, "Suspended")
    assert "stopping Pod sbx-a" in first.conditions[0][3]
    assert first.fields["suspendedBy"] == "spec"
    assert first.fields["suspendCount"] == 3
    assert first.fields["suspendedAt"] == rfc(NOW)
    assert "servedBy" not in first.fields, "what still stops stays on record"
    done_status = ready_status(suspendCount=3, suspendedBy="spec", suspendedAt=rfc(NOW))
    obj = sandbox({**SPEC, "suspended": True}, done_status)
    later = compute.suspended_plan(
        obj, spec_of(obj), "spec", still_stopping=[], now=NOW + timedelta(seconds=9)
    )
    assert "suspendCount" not in later.fields and "suspendedAt" not in later.fields
    assert later.fields["servedBy"] is None
    assert "set spec.suspended to false" in later.conditions[0][3]
    # next look: when the TTL (3600 s from creation, 100 s ago) ends it
    assert later.requeue_after == pytest.approx(3600 - 100 - 9 + 0.05)


def test_ttl_ends_a_suspended_sandbox() -> None:
    spec = {**SPEC, "suspended": True, "lifetime": {"ttlSeconds": 60, "idleTimeoutSeconds": 30}}
    obj = sandbox(spec, ready_status(suspendedBy="spec", suspendedAt=rfc(NOW)))
    plan = compute.suspended_plan(obj, spec_of(obj), "spec", still_stopping=[], now=NOW)
    assert plan.dispose and plan.verdict is not None and plan.verdict.terminal
    assert plan.conditions[0][:3] == ("Ready", False, "Expired")


# -- resume ---------------------------------------------------------------------------------


RAISED_SCOPE = {**SCOPE, "spec": {**SCOPE["spec"], "minIsolation": "microvm"}}


def _admit(obj: Any, cfg: Any, *, rejudge: bool, scope: Any = SCOPE) -> compute.Admission:
    return compute.admit(
        obj,
        spec_of(obj),
        compute.resolve_scope(SandboxScopeView(scope), "conv", "ns"),
        host_policy=cfg.host_policy,
        profiles=profiles(cfg, {}),
        known_backends=("gvisor",),
        rejudge=rejudge,
    )


def test_resume_is_judged_again() -> None:
    status = ready_status(suspendedBy="spec", suspendedAt=rfc(NOW), suspendCount=2, resumeCount=1)
    obj = sandbox(SPEC, status)
    recalled = _admit(obj, config(), rejudge=False, scope=RAISED_SCOPE)
    assert recalled.admitted, "a running sandbox's admission stands"
    # The conversation's floor was raised while it was suspended.
    refused = _admit(obj, config(), rejudge=True, scope=RAISED_SCOPE)
    assert not refused.admitted and refused.reason == "NoBackendCanServe"
    assert "IsolationBelowFloor" in refused.message
    plan = compute.refused_resume_plan(refused)
    assert [c[:3] for c in plan.conditions] == [
        ("Admitted", False, "NoBackendCanServe"),
        ("Ready", False, "NoBackendCanServe"),
    ]
    assert plan.conditions[0][3].startswith("resume refused: ")
    assert "backend" not in plan.fields and "suspendedBy" not in plan.fields
    again = _admit(obj, config(), rejudge=True)
    assert again.admitted
    resume = compute.resume_plan(obj, again, now=NOW)
    assert resume.fields["suspendedBy"] is None
    assert resume.fields["resumeCount"] == 2
    assert resume.fields["resumedAt"] == rfc(NOW)
    assert resume.conditions[-1][:3] == ("Ready", False, "Creating")


def test_resumed_sandbox_startup_clock_starts_at_resume() -> None:
    long_ago = NOW - timedelta(hours=2)
    status = ready_status(resumedAt=rfc(NOW - timedelta(seconds=5)))
    status["conditions"][0]["lastTransitionTime"] = rfc(long_ago)
    status["conditions"][1].update(status="False", reason="Creating")
    spec = {**SPEC, "lifetime": {"ttlSeconds": 86400, "idleTimeoutSeconds": 900}}
    obj = sandbox(spec, status)
    obj["metadata"]["creationTimestamp"] = rfc(long_ago)
    admission = _admit(obj, config(), rejudge=False)
    plan = compute.plan(
        obj,
        spec_of(obj),
        admission,
        Observation(ObservedPhase.ABSENT),
        key_unclean=None,
        scope_problem="",
        now=NOW,
    )
    assert plan.create, "not StartupTimeout: the startup clock is the resume, 5 s ago"


def test_a_kept_serving_object_stays_on_record() -> None:
    """A remote sandbox stopped, not deleted, stays in servedBy: a resume finds that one (or
    refuses), never starting an empty one in its place; a pod that went does not."""
    obj = sandbox({**SPEC, "suspended": True}, ready_status())
    stopped = Observation(ObservedPhase.SUSPENDED, served_by=ServedBy("AcaSandbox", "sb-1"))
    plan = compute.suspended_plan(
        obj, spec_of(obj), "spec", still_stopping=[], now=NOW, kept=stopped
    )
    assert plan.fields["servedBy"] == {"kind": "AcaSandbox", "name": "sb-1"}
    gone = compute.suspended_plan(
        obj,
        spec_of(obj),
        "spec",
        still_stopping=[],
        now=NOW,
        kept=Observation(ObservedPhase.ABSENT),
    )
    assert gone.fields["servedBy"] is None
    by_backend = compute.suspended_plan(
        obj,
        spec_of(obj),
        "idle",
        still_stopping=[],
        now=NOW,
        detail="stopped by the backend (Idle)",
    )
    assert "stopped by the backend (Idle)" in by_backend.conditions[0][3]
    assert "idleAction" not in by_backend.conditions[0][3]


def test_created_suspended_is_started_not_resumed() -> None:
    """A Sandbox created with suspended: true was never admitted: nothing is counted as
    suspended, and letting it go starts it (ensure), not resumes it (its volume does not exist
    yet)."""
    obj = sandbox({**SPEC, "suspended": True}, {})
    plan = compute.suspended_plan(obj, spec_of(obj), "spec", still_stopping=[], now=NOW)
    assert "suspendCount" not in plan.fields and plan.fields["suspendedAt"] == rfc(NOW)
    held = sandbox(SPEC, {"suspendedBy": "spec", "suspendedAt": rfc(NOW)})
    admission = _admit(held, config(), rejudge=True)
    start = compute.resume_plan(held, admission, now=NOW)
    assert "resumedAt" not in start.fields and "resumeCount" not in start.fields
    assert "created suspended" in start.conditions[-1][3]
    assert not compute.resuming(SandboxStatusView(start.fields))
    ran = sandbox(SPEC, {**ready_status(), "suspendedBy": "spec", "suspendCount": 1})
    again = compute.resume_plan(ran, _admit(ran, config(), rejudge=True), now=NOW)
    assert compute.resuming(SandboxStatusView(again.fields))


def test_a_resume_stays_on_the_backend_holding_the_volume() -> None:
    """perSpec would now pick another backend first: the resume is judged on its own backend
    only; a backend no longer configured refuses it."""
    two, _ = parse_config(
        {
            "hostPolicy": {"minIsolation": "container", "selection": "perSpec"},
            "backends": [
                {
                    "name": name,
                    "type": "runtimeClass",
                    "runtimeClassName": name,
                    "isolation": iso,
                    "declarations": {"egressModes": ["closed"], "persistentStorage": True},
                }
                for name, iso in (("runc", "container"), ("gvisor", "hardened_container"))
            ],
        }
    )
    status = ready_status(suspendedBy="spec", suspendedAt=rfc(NOW), suspendCount=1)
    obj = sandbox(SPEC, status)  # on gvisor; runc is listed first

    def judge_resume(profiles_: Any) -> compute.Admission:
        return compute.admit(
            obj,
            spec_of(obj),
            compute.resolve_scope(SandboxScopeView(SCOPE), "conv", "ns"),
            host_policy=two.host_policy,
            profiles=profiles_,
            known_backends=tuple(p.name for p in profiles_),
            rejudge=True,
        )

    fresh = compute.admit(
        sandbox(SPEC),
        spec_of(obj),
        compute.resolve_scope(SandboxScopeView(SCOPE), "conv", "ns"),
        host_policy=two.host_policy,
        profiles=profiles(two, {}),
        known_backends=("runc", "gvisor"),
    )
    assert fresh.backend == "runc", "a new Sandbox of that spec would go to runc"
    assert judge_resume(profiles(two, {})).backend == "gvisor"
    gone = judge_resume([p for p in profiles(two, {}) if p.name == "runc"])
    assert not gone.admitted and gone.reason == "BackendUnavailable"
    assert "work volume" in gone.message
