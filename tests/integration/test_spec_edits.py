"""Spec edits after creation, at the API server: every field admission or the pod depends on is
refused with a 422 naming it and saying what to do; the lifetime stays editable. On a Ready
Sandbox (its pod on no node, reported Ready by the test as a kubelet would:
tests/fixtures/nodeless.py) the refused edits leave the pod and the status as they were, and a
lifetime edit is judged on the next pass and takes effect."""

from __future__ import annotations

import pytest

from tests.fixtures.faults import runc_config
from tests.fixtures.nodeless import off_node, serve
from tests.fixtures.spec_edits import (
    CREATED_WITH,
    MUTABLE_EDITS,
    assert_every_fixed_field_is_refused,
    assert_table_covers_the_crd,
    try_patch,
)

pytestmark = pytest.mark.integration


def test_the_edit_table_names_every_spec_field() -> None:
    assert_table_covers_the_crd()


def test_every_spec_field_but_the_lifetime_is_fixed_at_creation(kit) -> None:
    kit.scope()
    kit.sandbox("s", **CREATED_WITH)
    assert_every_fixed_field_is_refused(kit.custom, kit.ns, "s")
    for field, value in MUTABLE_EDITS.items():
        assert try_patch(kit.custom, kit.ns, "s", field, value) is None, field
    obj = kit.get("s")
    assert obj is not None and obj["spec"]["lifetime"]["ttlSeconds"] == 7200
    # The lifetime edit changed the spec; suspended: false and resets: 0 are their defaults, so
    # no change.
    assert obj["metadata"]["generation"] == 2
    # Metadata stays the caller's to change.
    kit.custom.patch_namespaced_custom_object(
        "sandbox-operator.dev",
        "v1alpha1",
        kit.ns,
        "sandboxes",
        "s",
        {"metadata": {"annotations": {"example.com/note": "fine"}}},
    )


def test_a_ready_sandbox_refuses_spec_edits_and_takes_lifetime_edits(kit, start_operator):
    start_operator(off_node(runc_config(resyncSeconds=2)))
    kit.scope()
    kit.sandbox("s", **CREATED_WITH)
    ready = serve(kit, "s", timeout=90)
    pod_uid = kit.pod("s").metadata.uid

    assert_every_fixed_field_is_refused(kit.custom, kit.ns, "s")
    still = kit.get("s")
    assert still is not None
    assert still["status"]["observedGeneration"] == ready["metadata"]["generation"]
    assert kit.condition(still, "Ready")["status"] == "True"
    assert kit.pod("s").metadata.uid == pod_uid

    # The lifetime is the caller's to change: shortening it ends the sandbox.
    lifetime = {"ttlSeconds": 3, "idleTimeoutSeconds": 3}
    assert try_patch(kit.custom, kit.ns, "s", "lifetime", lifetime) is None
    obj = kit.wait_condition("s", reasons=("Expired",), timeout=60)
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"] == 2
