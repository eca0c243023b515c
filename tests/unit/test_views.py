"""``sandbox_operator.views``: typed accessors over the wire dict itself (no copy), answering for
absent and null fields, and timestamps parsed once per object version."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from sandbox_operator.contract.resources import (
    SandboxResourceSpec,
    SandboxResourceStatus,
    SandboxScopeResourceSpec,
    SandboxScopeResourceStatus,
    SandboxWarmPoolResourceSpec,
    SandboxWarmPoolResourceStatus,
)
from sandbox_operator.views import (
    AdmissionPolicyView,
    Conditions,
    ConfigMapView,
    DeleteAnswerView,
    EventView,
    ListView,
    NamespaceView,
    PodView,
    PolicyBindingView,
    SandboxScopeView,
    SandboxView,
    SandboxWarmPoolView,
    SelfSubjectReviewView,
    ServiceView,
    WatchEvent,
)
from sandbox_operator.views import fields as view_fields
from sandbox_operator.views.fields import field_keys
from sandbox_operator.views.resources import (
    EgressEditRefusalView,
    EgressStatusView,
    SandboxStatusView,
    ScopeStatusView,
    WarmPoolStatusView,
)


def _sandbox() -> dict[str, Any]:
    return {
        "apiVersion": "sandbox-operator.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {
            "name": "sb",
            "namespace": "ns",
            "uid": "u-1",
            "resourceVersion": "42",
            "generation": 3,
            "creationTimestamp": "2026-01-02T03:04:05Z",
            "labels": {"a": "b"},
            "finalizers": ["f"],
            "ownerReferences": [{"kind": "SandboxScope", "name": "sc", "uid": "u-0"}],
        },
        "spec": {"scopeRef": "sc", "kind": "python"},
        "status": {
            "backend": "gvisor",
            "suspendCount": 2,
            "servedBy": {"kind": "Pod", "name": "p", "namespace": "ns"},
            "egress": {"admitted": "2026-01-02T03:04:06Z", "final": True},
            "conditions": [
                {"type": "Admitted", "status": "True", "reason": "Admitted"},
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "Starting",
                    "lastTransitionTime": "2026-01-02T03:04:07Z",
                },
            ],
        },
    }


def test_a_sandbox_view_reads_every_field_from_the_same_dict() -> None:
    raw = _sandbox()
    view = SandboxView(raw)
    assert view.raw is raw and view.metadata.raw is raw["metadata"]
    assert view.key == ("ns", "sb")
    assert (view.metadata.uid, view.metadata.resource_version, view.metadata.generation) == (
        "u-1",
        "42",
        3,
    )
    assert view.metadata.labels == {"a": "b"} and list(view.metadata.finalizers) == ["f"]
    assert [(o.kind, o.name, o.uid) for o in view.metadata.owner_references] == [
        ("SandboxScope", "sc", "u-0")
    ]
    assert view.metadata.created == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert not view.metadata.deleting
    assert (view.scope_ref, view.sandbox_kind) == ("sc", "python")
    status = view.status
    assert (status.backend, status.suspend_count, status.resume_count) == ("gvisor", 2, 0)
    assert (status.served_by.kind, status.served_by.name, status.served_by.namespace) == (
        "Pod",
        "p",
        "ns",
    )
    assert status.egress.final and status.egress.admitted_at is not None
    assert status.conditions.is_true("Admitted") and not status.conditions.is_true("Ready")
    ready = status.conditions.find("Ready")
    assert ready is not None and ready.reason == "Starting"
    assert ready.since == datetime(2026, 1, 2, 3, 4, 7, tzinfo=UTC)
    # A view is a read-only mapping over the object: code that still takes a mapping takes it.
    assert view["metadata"]["name"] == "sb" and dict(view) == raw
    raw["status"]["backend"] = "runc"  # no copy: a change to the dict is seen
    assert view.status.backend == "runc"


@pytest.mark.parametrize(
    "raw", [None, {}, {"metadata": None, "spec": None, "status": None}, {"status": {"x": 1}}]
)
def test_absent_and_null_fields_read_as_empty(raw: Any) -> None:
    view = SandboxView(raw)
    assert view.key == ("", "")
    assert view.metadata.generation == 0 and view.metadata.created is None
    assert dict(view.metadata.labels) == {} and list(view.metadata.owner_references) == []
    assert view.scope_ref == "" and view.status.backend == ""
    assert view.status.conditions.find("Ready") is None
    assert view.status.served_by.name == "" and not view.status.egress.final
    pod = PodView(raw)
    assert pod.status.phase == "Pending" and pod.status.container_statuses == []
    assert pod.node_name == ""


def test_timestamps_are_parsed_once_per_object_version(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    real = view_fields.parse_time

    def counting(value: object) -> datetime | None:
        calls.append(value)
        return real(value)

    monkeypatch.setattr(view_fields, "parse_time", counting)
    view_fields._parse_text.cache_clear()
    raw = _sandbox()
    raw["metadata"]["creationTimestamp"] = "2026-05-06T07:08:09Z"
    view = SandboxView(raw)
    for _ in range(9):
        assert view.metadata.created is not None
        assert SandboxView(raw).metadata.created is not None  # another view of that version
    assert calls == ["2026-05-06T07:08:09Z"]


def test_pod_scope_and_pool_views() -> None:
    pod = PodView(
        {
            "metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": "n1"},
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [
                    {"name": "c", "ready": False, "state": {"waiting": {"reason": "ErrImagePull"}}}
                ],
            },
        }
    )
    assert pod.metadata.deleting and pod.metadata.deleted_at is not None
    assert (pod.status.phase, pod.status.pod_ip, pod.node_name) == ("Running", "10.0.0.1", "n1")
    assert pod.status.conditions.is_true("Ready")
    assert [c.waiting_reason for c in pod.status.container_statuses] == ["ErrImagePull"]
    scope = SandboxScopeView(
        {"spec": {"scope": "s", "threadId": "t", "agentServiceAccounts": ["a"]}}
    )
    assert (scope.scope, scope.thread_id, list(scope.agent_service_accounts)) == ("s", "t", ["a"])
    pool = SandboxWarmPoolView({"spec": {"replicas": 3}, "status": {"shape": "x"}})
    assert (pool.replicas, pool.max_creating, pool.status.shape) == (3, 5, "x")


def test_views_of_the_answers_and_kinds_the_operator_watches() -> None:
    """Lists, watch events, the API's Status, Services, Events, container states, admission
    policies and a SelfSubjectReview, each read off the dict it was given (a list's items are
    that very list)."""
    items = [{"metadata": {"name": "a"}}]
    listed = ListView({"metadata": {"resourceVersion": "7"}, "items": items})
    assert listed.objects is items and listed.metadata.resource_version == "7"
    event = WatchEvent({"type": "DELETED", "object": items[0]})
    assert (event.type, event.object) == ("DELETED", items[0])
    gone = DeleteAnswerView({"kind": "Status", "message": "m", "details": {"uid": "u1"}})
    assert gone.is_status and gone.details.uid == "u1" and gone.message == "m"
    held = DeleteAnswerView({"kind": "Pod", "metadata": {"deletionGracePeriodSeconds": 0}})
    assert not held.is_status and held.metadata.deletion_grace_period_seconds == 0
    assert ServiceView({"spec": {"clusterIP": "10.0.0.9", "ports": [{"port": 3128}]}}).first_port
    assert ServiceView({"spec": {"cluster_ip": "10.0.0.9"}}).cluster_ip == "10.0.0.9"
    assert ServiceView({"spec": {}}).first_port is None
    kubelet = EventView({"reason": "R", "involvedObject": {"kind": "Pod", "uid": "p1"}})
    assert (kubelet.reason, kubelet.involved_object.kind, kubelet.involved_object.uid) == (
        "R",
        "Pod",
        "p1",
    )
    state = {"terminated": {"reason": "Error", "exitCode": 2}}
    container = PodView({"status": {"containerStatuses": [{"state": state}]}})
    (cs,) = container.status.container_statuses
    assert (cs.terminated.reason, cs.terminated.exit_code, bool(cs.waiting)) == ("Error", 2, False)
    assert NamespaceView({"status": {"phase": "Terminating"}}).terminating
    assert ConfigMapView({"data": {"k": "v"}}).data == {"k": "v"}
    policy = AdmissionPolicyView(
        {"spec": {"matchConstraints": {"resourceRules": [{"operations": ["CONNECT"]}]}}}
    )
    assert [r.operations for r in policy.resource_rules] == [("CONNECT",)]
    binding = PolicyBindingView({"spec": {"validationActions": ["Deny"], "paramRef": {}}})
    assert binding.validation_actions == ("Deny",) and binding.param_ref.namespace == ""
    who = SelfSubjectReviewView({"status": {"userInfo": {"username": "me"}}})
    assert who.user_info.username == "me"
    meta = PodView({"metadata": {"managedFields": [{"time": "2026-01-01T00:00:00Z"}]}}).metadata
    assert [m.time for m in meta.managed_fields] == [datetime(2026, 1, 1, tzinfo=UTC)]


def test_views_are_read_only_and_wrap_once() -> None:
    view = SandboxView(_sandbox())
    assert SandboxView.of(view) is view
    with pytest.raises(TypeError):
        view["kind"] = "Other"  # type: ignore[index]
    assert list(Conditions(None)) == [] and Conditions("not a list").find("Ready") is None


@pytest.mark.parametrize(
    ("view", "model"),
    [
        (SandboxStatusView, SandboxResourceStatus),
        (ScopeStatusView, SandboxScopeResourceStatus),
        (WarmPoolStatusView, SandboxWarmPoolResourceStatus),
    ],
)
def test_every_status_field_is_the_status_models_own(view: type, model: Any) -> None:
    """A status view reads no key its kind's status model does not define, under the model's
    own name (attribute and wire alias): a typo, or a field the model dropped, fails here."""
    by_alias = {f.alias: name for name, f in model.model_fields.items()}
    declared = field_keys(view)
    assert declared, view
    assert {key: by_alias.get(key) for key in declared.values()} == {
        key: name for name, key in declared.items()
    }


@pytest.mark.parametrize(
    ("view", "model"),
    [
        (SandboxView, SandboxResourceSpec),
        (SandboxScopeView, SandboxScopeResourceSpec),
        (SandboxWarmPoolView, SandboxWarmPoolResourceSpec),
    ],
)
def test_every_spec_field_is_the_spec_models_own(view: type, model: Any) -> None:
    aliases = {f.alias for f in model.model_fields.values()}
    declared = field_keys(view, under="spec")
    assert declared and set(declared.values()) <= aliases, (declared, aliases)


@pytest.mark.parametrize(
    ("view", "field"),
    [(EgressStatusView, "egress"), (EgressEditRefusalView, "egress_edit_refused")],
)
def test_the_nested_status_fields_are_the_models_own(view: type, field: str) -> None:
    nested = SandboxResourceStatus.model_fields[field].annotation
    model = next(a for a in nested.__args__ if a is not type(None))  # type: ignore[union-attr]
    assert set(field_keys(view).values()) <= {f.alias for f in model.model_fields.values()}
