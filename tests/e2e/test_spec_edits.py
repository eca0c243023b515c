"""Spec edits on a Ready Sandbox: refused at the API server for every field admission or the pod
depends on (the running pod and the status stay as they were), while a lifetime edit is judged
on the next pass and takes effect."""

from __future__ import annotations

import pytest

from tests.fixtures.operator import DECLARATIONS, local_config
from tests.fixtures.spec_edits import CREATED_WITH, assert_every_fixed_field_is_refused, try_patch

pytestmark = pytest.mark.e2e


def only(runtime_class: str, isolation: str):
    backend = {
        "name": runtime_class,
        "type": "runtimeClass",
        "runtimeClassName": runtime_class,
        "isolation": isolation,
        "declarations": DECLARATIONS,
        "pod": {"terminationGracePeriodSeconds": 1},
    }
    return local_config(
        floor="container", selection="fixed", pinned=runtime_class, backends=[backend]
    )


@pytest.mark.parametrize(
    ("runtime_class", "isolation"), [("runc", "container"), ("gvisor", "hardened_container")]
)
def test_a_ready_sandbox_refuses_spec_edits_and_takes_lifetime_edits(
    kit, start_operator, runtime_class, isolation
):
    start_operator(only(runtime_class, isolation))
    kit.scope()
    kit.sandbox("s", **CREATED_WITH)
    ready = kit.wait_condition("s", reasons=("Ready",), status="True", timeout=90)
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
