"""One conversation, one SandboxScope, on a real API server (the pods on no node: the test plays
the kubelet's part, tests/fixtures/nodeless.py).

Two SandboxScopes with the same scope and threadId in a namespace would be one conversation to
the labels every object carries. The later one is refused (``Ready=False, ScopeConflict``
naming the older), and so are its Sandboxes; deleting either scope disposes only the Sandboxes
that name it.
"""

from __future__ import annotations

import time

import pytest

from sandbox_operator import naming
from tests.fixtures.faults import runc_config
from tests.fixtures.nodeless import off_node, serve

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def module_operator_config():
    """Both tests share one runc operator (``module_kit``), its pods on no node."""
    return off_node(runc_config(resyncSeconds=30))


def _conflict_setup(kit):
    """``conv`` with a Ready Sandbox ``a``; ``dup`` (same scope and threadId) refused, with a
    refused Sandbox ``b``."""
    kit.scope("conv")
    kit.wait_condition("conv", "Ready", status="True", plural="sandboxscopes", timeout=30)
    kit.sandbox("a", scope_ref="conv")
    serve(kit, "a", timeout=90)
    kit.scope("dup")  # the same scope "tenant-a" and threadId "thread-1"
    dup = kit.wait_condition(
        "dup", "Ready", reasons=("ScopeConflict",), status="False", plural="sandboxscopes"
    )
    assert "'conv'" in kit.condition(dup)["message"], kit.condition(dup)
    kit.sandbox("b", scope_ref="dup")
    b = kit.wait_condition("b", "Admitted", reasons=("ScopeConflict",), status="False")
    assert "'conv'" in kit.condition(b, "Admitted")["message"]
    assert kit.pod("b") is None


def _stays_ready(kit, name: str, seconds: float = 5) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert (kit.condition(kit.get(name)) or {}).get("status") == "True", kit.get(name)
        assert kit.pod(name) is not None
        time.sleep(1)


def test_deleting_the_refused_scope_leaves_the_holders_ready_sandbox_alone(module_kit):
    kit = module_kit
    _conflict_setup(kit)
    kit.delete("dup", "sandboxscopes")
    kit.wait_gone("dup", "sandboxscopes", timeout=60)
    kit.wait_gone("b", timeout=30)  # its own Sandbox went with it
    _stays_ready(kit, "a")
    assert [p.metadata.name for p in kit.pods()] == [naming.pod_name("a")]
    assert (kit.condition(kit.get("conv", "sandboxscopes")) or {}).get("status") == "True"


def test_deleting_the_holder_hands_the_conversation_to_the_waiting_scope(module_kit):
    kit = module_kit
    _conflict_setup(kit)
    kit.delete("conv", "sandboxscopes")
    kit.wait_gone("conv", "sandboxscopes", timeout=60)
    assert kit.get("a") is None
    # The waiting scope holds the conversation now, and its Sandbox starts ...
    kit.wait_condition("dup", "Ready", status="True", plural="sandboxscopes", timeout=30)
    serve(kit, "b", timeout=90)
    # ... and nothing of the old holder's purge reaches it.
    _stays_ready(kit, "b")
    assert [p.metadata.name for p in kit.pods()] == [naming.pod_name("b")]
