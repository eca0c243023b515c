"""What an agent may write on its Sandboxes, read defensively (issue 13, finding 4), no cluster:
the last-activity stamp, annotations near the size limit, a foreign finalizer holding a deleted
Sandbox, kopf's progress kept nowhere, and the chart's sandboxMetadataPolicy in step with the
operator's labels and annotations. The cluster counterparts are in
tests/integration/test_agent_metadata.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sandbox_operator import labels as lbl
from sandbox_operator.reconcile.handlers import NoDiffBase, NoProgress
from sandbox_operator.reconcile.metadata import annotations_fit
from sandbox_operator.reconcile.runtime import FINALIZER
from sandbox_operator.reconcile.slim import ANNOTATIONS_SIZE
from sandbox_operator.reconcile.views import Views
from sandbox_operator.views import MetaView
from tests.fixtures.chart import template
from tests.fixtures.reconcile import NS, SPEC, cond, finalize_sandbox, reconcile_sandbox

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


# ---- last-activity --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-12-01T11:59:00Z", datetime(2026, 12, 1, 11, 59, tzinfo=UTC)),
        ("2026-12-01T11:59:00.250Z", datetime(2026, 12, 1, 11, 59, 0, 250000, tzinfo=UTC)),
        ("2026-12-01T13:59:00+02:00", datetime(2026, 12, 1, 11, 59, tzinfo=UTC)),
        ("2026-12-01T11:59:00", datetime(2026, 12, 1, 11, 59, tzinfo=UTC)),  # naive: UTC
        ("2026-12-01T12:00:30Z", NOW),  # a little ahead (a clock running fast): now
        ("2026-12-01T12:05:00Z", None),  # further ahead: not believed
        ("9999-12-31T23:59:59Z", None),
        ("9999-12-31T23:59:59-23:59", None),
        ("0001-01-01T00:00:00+05:00", None),  # before datetime.min in UTC
        ("0001-01-01T00:00:00Z", datetime(1, 1, 1, tzinfo=UTC)),  # harmless: Ready is later
        ("garbage", None),
        ("", None),
        (None, None),
        (12345, None),
        ("2026-12-01T11:59:00Z" + " " * 100, None),
    ],
)
def test_last_activity_is_read_defensively(value: Any, expected: datetime | None) -> None:
    got = lbl.read_last_activity(value, NOW)
    assert got == expected
    if got is not None:
        assert got.tzinfo is not None
        got + timedelta(days=7)  # the idle-deadline arithmetic never overflows


def test_annotations_size_counts_bytes_as_the_api_server_does() -> None:
    assert lbl.annotations_size({"a/b": "xyz"}) == 6
    assert lbl.annotations_size({"k": "é"}) == 3
    assert lbl.annotations_size(None) == 0


# ---- annotations near the limit -------------------------------------------------------------


def _sandbox(annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "sandbox-operator.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {
            "name": "a",
            "namespace": NS,
            "uid": "u",
            "resourceVersion": "1",
            "annotations": annotations,
        },
        "spec": {"scopeRef": "conv"},
    }


def test_the_views_keep_the_annotations_size_only_when_it_is_large() -> None:
    views = Views()
    small = views.put_sandbox(_sandbox({"example.com/a": "x" * 1000}))
    assert ANNOTATIONS_SIZE not in small["metadata"]
    big = {"example.com/filler": "x" * 200_000, lbl.LAST_ACTIVITY_ANNOTATION: "garbage"}
    obj = _sandbox(big)
    obj["metadata"]["resourceVersion"] = "2"
    held = views.put_sandbox(obj)
    assert held["metadata"][ANNOTATIONS_SIZE] == lbl.annotations_size(big)
    assert len(repr(held)) < 1_000  # the bulk itself is not kept


def test_key_annotations_are_left_out_when_they_would_not_fit() -> None:
    def fit(meta: dict[str, Any], adding: dict[str, str]) -> bool:
        return annotations_fit(MetaView(meta), adding)

    adding = {lbl.CALL_ANNOTATION: "c" * 100}
    assert fit({}, adding)
    near = lbl.ANNOTATIONS_LIMIT_BYTES - 16
    assert not fit({ANNOTATIONS_SIZE: near}, adding)
    room = lbl.ANNOTATIONS_LIMIT_BYTES - lbl.annotations_size(adding)
    assert fit({ANNOTATIONS_SIZE: room}, adding)
    # replacing a value of the same size takes no room
    same = {"annotations": {lbl.CALL_ANNOTATION: "d" * 100}, ANNOTATIONS_SIZE: near}
    assert fit(same, adding)


async def test_a_full_object_is_labelled_and_taken_on_without_the_key_annotations(world) -> None:
    rt, kube, driver = world
    kube.add("sandboxes", "full", SPEC)
    filler = "x" * (lbl.ANNOTATIONS_LIMIT_BYTES - 40)
    kube.objs[("sandboxes", "full")]["metadata"]["annotations"] = {"e/f": filler}
    await reconcile_sandbox(rt, NS, "full")
    meta = kube.objs[("sandboxes", "full")]["metadata"]
    assert FINALIZER in meta["finalizers"] and meta["labels"][lbl.KEY_LABEL]
    assert set(meta["annotations"]) == {"e/f"}
    assert cond(kube, "full", "Admitted")["status"] == "True"
    assert "full" in driver.pods
    await finalize_sandbox(rt, NS, "full")
    assert ("sandboxes", "full") not in kube.objs


async def test_a_refused_metadata_patch_is_retried_without_the_annotations(world) -> None:
    rt, kube, _ = world
    patches: list[dict[str, Any]] = []
    real = kube.patch_metadata

    class Invalid(Exception):
        status = 422

    async def patch_metadata(plural, ns, name, labels=None, annotations=None, **kw):
        patches.append({"labels": labels, "annotations": annotations})
        if annotations:
            raise Invalid("metadata.annotations: Too long: must have at most 262144 bytes")
        return await real(plural, ns, name, labels, annotations, **kw)

    kube.patch_metadata = patch_metadata  # type: ignore[method-assign]
    kube.add("sandboxes", "s", SPEC)
    await reconcile_sandbox(rt, NS, "s")
    # Refused with the annotations, then made without them (a later pass, which the admission
    # write brings for an unwatched driver, asks once more and takes the refusal as final).
    assert [bool(p["annotations"]) for p in patches][:2] == [True, False]
    assert [p for p in patches[2:] if not p["annotations"]] == []
    assert FINALIZER in kube.objs[("sandboxes", "s")]["metadata"]["finalizers"]
    assert cond(kube, "s", "Admitted")["status"] == "True"


# ---- a foreign finalizer --------------------------------------------------------------------


async def test_a_let_go_sandbox_held_by_a_foreign_finalizer_holds_no_key(world) -> None:
    rt, kube, driver = world
    kube.add("sandboxes", "first", SPEC)
    await reconcile_sandbox(rt, NS, "first")
    first = kube.objs[("sandboxes", "first")]["metadata"]
    first["finalizers"] = [*first["finalizers"], "example.com/hold"]
    kube.add("sandboxes", "second", SPEC)  # same key, another name
    await kube.delete_sandbox(NS, "first")
    await reconcile_sandbox(rt, NS, "second")  # "first" still has its pod and our finalizer
    assert cond(kube, "second", "Admitted")["reason"] == "KeyUnclean"
    woken: list[str] = []
    rt.enqueue_sandbox = lambda ns, name, *a, **k: woken.append(name)  # type: ignore[method-assign]
    await finalize_sandbox(rt, NS, "first")
    assert kube.objs[("sandboxes", "first")]["metadata"]["finalizers"] == ["example.com/hold"]
    assert woken == ["second"]  # no DELETED event comes for "first": the key is woken here
    await reconcile_sandbox(rt, NS, "second")
    assert cond(kube, "second", "Admitted")["status"] == "True"
    assert "second" in driver.pods


async def test_a_deleted_sandbox_still_ours_holds_its_key(world) -> None:
    rt, kube, _ = world
    kube.add("sandboxes", "first", SPEC)
    await reconcile_sandbox(rt, NS, "first")
    first = kube.objs[("sandboxes", "first")]["metadata"]
    first["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # deleted, not disposed yet
    kube.add("sandboxes", "second", SPEC)
    await reconcile_sandbox(rt, NS, "second")
    assert cond(kube, "second", "Admitted")["reason"] == "KeyUnclean"


# ---- kopf keeps nothing on the object --------------------------------------------------------


def test_kopf_reads_no_progress_and_no_diff_base_from_the_object() -> None:
    body = {"metadata": {"annotations": {"kopf.zalando.org/x": "{", "sandbox-operator.dev/y": "{"}}}
    progress = NoProgress()
    assert progress.fetch(key="sandbox_changed", body=body) is None
    progress.store(key="k", record={}, body=body, patch={})
    progress.purge(key="k", body=body, patch={})
    progress.touch(body=body, patch={}, value="v")
    assert progress.clear(essence={"a": 1}) == {"a": 1}
    assert NoDiffBase().fetch(body=body) is None


# ---- the chart's admission policy ------------------------------------------------------------


def _policy(values: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    objs = template(values)
    (policy,) = [
        o
        for o in objs
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"].endswith("-metadata")
    ]
    (binding,) = [
        o
        for o in objs
        if o["kind"] == "ValidatingAdmissionPolicyBinding"
        and o["metadata"]["name"].endswith("-metadata")
    ]
    return policy, binding


def test_the_metadata_policy_is_off_by_default() -> None:
    assert not [o for o in template() if o["metadata"]["name"].endswith("-sandbox-metadata")]


def test_the_metadata_policy_exempts_the_operator_and_names_what_the_client_writes() -> None:
    policy, binding = _policy(
        {"sandboxMetadataPolicy.enabled": "true", "sandboxMetadataPolicy.operatorUsers[0]": "ops"}
    )
    match = policy["spec"]["matchConditions"][0]["expression"]
    assert "system:serviceaccount:sandbox-operator-system:so-sandbox-operator" in match
    assert '"ops"' in match
    exprs = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    key = type("K", (), {"scope": "s", "thread_id": "t", "agent_dir": "a", "call_id": "c"})()
    for name in lbl.key_annotations(key):
        assert f'"{name}"' in exprs["badAnnotations"]
    for name in lbl.key_labels(key, "python"):
        if name.startswith(f"{lbl.GROUP}/"):
            assert f'"{name}"' in exprs["badLabels"]
    assert f'"{lbl.LAST_ACTIVITY_ANNOTATION}"' in exprs["badAnnotations"]
    assert f'"{lbl.GROUP}/' in exprs["badAnnotations"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert "matchResources" not in binding["spec"]  # every namespace the operator serves


def test_the_metadata_policy_binds_to_the_watched_namespaces() -> None:
    _, binding = _policy({"sandboxMetadataPolicy.enabled": "true", "watchNamespaces[0]": "agents"})
    (expr,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert expr["values"] == ["agents"]
