"""Spec edits after creation, at the API server: every field admission or the pod depends on is
refused with a 422 naming it and saying what to do; the lifetime stays editable."""

from __future__ import annotations

import pytest

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
    # The lifetime edit changed the spec; suspended: false is its default, so no change.
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
