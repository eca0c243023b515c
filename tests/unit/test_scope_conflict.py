"""One conversation, one SandboxScope (no cluster): the oldest SandboxScope naming a scope and
threadId holds it, a later one is refused (ScopeConflict) and so are its Sandboxes, and deleting
a scope disposes only the Sandboxes that name it, never another scope's with the same labels."""

from __future__ import annotations

from typing import Any

from sandbox_operator import labels as lbl
from sandbox_operator.client import errors
from sandbox_operator.contract import ConditionReason
from sandbox_operator.reconcile import compute
from sandbox_operator.reconcile.views import Views
from sandbox_operator.views import SandboxScopeView
from tests.fixtures.reconcile import (
    NS,
    SPEC,
    cond,
    finalize_sandbox,
    reconcile_sandbox,
    reconcile_scope,
    runtime,
)


def scope_obj(name: str, created: str, thread: str = "t", rv: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": "sandbox-operator.dev/v1alpha1",
        "kind": "SandboxScope",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "creationTimestamp": created,
        },
        "spec": {"scope": "s", "threadId": thread},
    }


# ---- the views: who holds a conversation -------------------------------------------------------


def test_the_oldest_scope_naming_a_conversation_holds_it() -> None:
    views = Views()
    views.scopes.upsert(scope_obj("later", "2026-01-01T00:00:02Z"))
    views.scopes.upsert(scope_obj("first", "2026-01-01T00:00:01Z"))
    views.scopes.upsert(scope_obj("elsewhere", "2026-01-01T00:00:00Z", thread="t2"))
    assert views.conversation_scopes(NS, "first") == ["first", "later"]
    assert views.conversation_scopes(NS, "elsewhere") == ["elsewhere"]
    assert views.conversation_holder(NS, "first") is None
    assert views.conversation_holder(NS, "later") == "first"
    assert views.conversation_holder(NS, "elsewhere") is None
    assert views.conversation_holder(NS, "missing") is None
    # Held while being deleted (its purge may still dispose by the conversation's labels) ...
    deleting = scope_obj("first", "2026-01-01T00:00:01Z", rv="2")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    views.scopes.upsert(deleting)
    assert views.conversation_holder(NS, "later") == "first"
    # ... and passed on once it is gone.
    views.scopes.remove(NS, "first")
    assert views.conversation_holder(NS, "later") is None
    assert views.conversation_scopes(NS, "later") == ["later"]


def test_created_in_the_same_second_the_name_decides_and_a_spec_edit_moves_the_index() -> None:
    views = Views()
    views.scopes.upsert(scope_obj("b", "2026-01-01T00:00:01Z"))
    views.scopes.upsert(scope_obj("a", "2026-01-01T00:00:01Z"))
    assert views.conversation_holder(NS, "b") == "a"
    views.scopes.upsert(scope_obj("b", "2026-01-01T00:00:01Z", thread="other", rv="2"))
    assert views.conversation_holder(NS, "b") is None
    assert views.conversation_scopes(NS, "a") == ["a"]


def test_a_scope_of_a_held_conversation_resolves_to_a_scope_conflict() -> None:
    obj = SandboxScopeView(scope_obj("later", "2026-01-01T00:00:02Z"))
    free = compute.resolve_scope(obj, "later", NS)
    assert free.spec is not None
    held = compute.resolve_scope(obj, "later", NS, conversation_holder="first")
    assert held.spec is None and held.reason == ConditionReason.SCOPE_CONFLICT
    assert "'first'" in held.problem
    assert compute.resolve_scope(None, "gone", NS).reason == ConditionReason.SCOPE_NOT_FOUND


def test_the_client_maps_scope_conflict_to_its_own_error() -> None:
    assert ConditionReason.SCOPE_CONFLICT.value == "ScopeConflict"
    assert errors.acquire_error_for("ScopeConflict") is errors.SandboxScopeConflict
    assert issubclass(errors.SandboxScopeConflict, errors.SandboxAcquireError)


# ---- the reconcilers over fakes -----------------------------------------------------------------


def two_scopes() -> tuple[Any, Any, Any]:
    rt, kube, driver = runtime()
    kube.add("sandboxscopes", "conv", {"scope": "s", "threadId": "t"})
    kube.add("sandboxscopes", "dup", {"scope": "s", "threadId": "t"})
    kube.objs[("sandboxscopes", "conv")]["metadata"]["creationTimestamp"] = "2026-01-01T00:00:01Z"
    kube.objs[("sandboxscopes", "dup")]["metadata"]["creationTimestamp"] = "2026-01-01T00:00:02Z"
    return rt, kube, driver


async def test_the_later_scope_and_its_sandboxes_are_refused_naming_the_holder() -> None:
    rt, kube, driver = two_scopes()
    kube.add("sandboxes", "a", SPEC)
    kube.add("sandboxes", "b", {**SPEC, "scopeRef": "dup", "agentDir": "agents/b"})
    await reconcile_sandbox(rt, NS, "a")
    await reconcile_sandbox(rt, NS, "b")
    await reconcile_scope(rt, NS, "conv")
    await reconcile_scope(rt, NS, "dup")
    assert cond(kube, "conv", "Ready", "sandboxscopes")["status"] == "True"
    refused = cond(kube, "dup", "Ready", "sandboxscopes")
    assert refused["status"] == "False" and refused["reason"] == "ScopeConflict"
    assert "'conv'" in refused["message"]
    assert ("dup", "Warning", "ScopeConflict") in kube.events
    assert cond(kube, "a", "Admitted")["status"] == "True"
    admitted = cond(kube, "b", "Admitted")
    assert admitted["status"] == "False" and admitted["reason"] == "ScopeConflict"
    assert "'conv'" in admitted["message"]
    assert "b" not in driver.pods
    # Refused before it got the conversation's labels: no purge of the holder can take it.
    assert lbl.CONVERSATION_LABEL not in kube.objs[("sandboxes", "b")]["metadata"]["labels"]

    # The holder goes (its purge takes only its own); then the later scope holds the conversation
    # and its Sandbox is admitted.
    scope = kube.objs[("sandboxscopes", "conv")]
    scope["metadata"]["deletionTimestamp"] = "2099-01-01T00:00:00Z"
    await reconcile_scope(rt, NS, "conv")
    assert not kube.objs[("sandboxes", "b")]["metadata"].get("deletionTimestamp")
    await finalize_sandbox(rt, NS, "a")
    assert await reconcile_scope(rt, NS, "conv") is None
    assert ("sandboxscopes", "conv") not in kube.objs
    await reconcile_scope(rt, NS, "dup")
    assert cond(kube, "dup", "Ready", "sandboxscopes")["status"] == "True"
    await reconcile_sandbox(rt, NS, "b")
    assert cond(kube, "b", "Admitted")["status"] == "True"
    assert "b" in driver.pods


async def test_deleting_the_refused_scope_leaves_the_holders_ready_sandbox_alone() -> None:
    rt, kube, driver = two_scopes()
    kube.add("sandboxes", "a", SPEC)
    kube.add("sandboxes", "b", {**SPEC, "scopeRef": "dup", "agentDir": "agents/b"})
    await reconcile_sandbox(rt, NS, "a")
    await reconcile_sandbox(rt, NS, "b")
    await reconcile_scope(rt, NS, "dup")
    kube.objs[("sandboxscopes", "dup")]["metadata"]["deletionTimestamp"] = "2099-01-01T00:00:00Z"
    await reconcile_scope(rt, NS, "dup")
    # The refused Sandbox carries no finalizer (nothing was made for it): deleted, it is gone.
    assert ("sandboxes", "b") not in kube.objs
    assert not kube.objs[("sandboxes", "a")]["metadata"].get("deletionTimestamp")
    assert await reconcile_scope(rt, NS, "dup") is None
    assert ("sandboxscopes", "dup") not in kube.objs
    assert "a" in driver.pods and ("sandboxes", "a") in kube.objs
    purge = kube.gone[("sandboxscopes", "dup")]["status"]["lastPurge"]
    assert purge["disposed"] == 1


async def test_sandboxes_of_two_scopes_under_the_same_labels_go_only_with_their_own_scope() -> None:
    """Two scopes whose Sandboxes both carry the conversation's labels (admitted before the
    conflict was refused): deleting either disposes only the Sandboxes naming it."""
    rt, kube, driver = two_scopes()
    kube.add("sandboxes", "a", SPEC)
    kube.add("sandboxes", "b", {**SPEC, "agentDir": "agents/b"})
    await reconcile_sandbox(rt, NS, "a")
    await reconcile_sandbox(rt, NS, "b")
    kube.objs[("sandboxes", "b")]["spec"]["scopeRef"] = "dup"  # as an older operator left it
    await reconcile_scope(rt, NS, "conv")
    await reconcile_scope(rt, NS, "dup")
    labels = kube.objs[("sandboxes", "b")]["metadata"]["labels"]
    conversation = lbl.conversation_value("s", "t")
    assert labels[lbl.CONVERSATION_LABEL] == conversation
    assert kube.objs[("sandboxes", "a")]["metadata"]["labels"][lbl.CONVERSATION_LABEL] == (
        conversation
    )
    kube.objs[("sandboxscopes", "conv")]["metadata"]["deletionTimestamp"] = "2099-01-01T00:00:00Z"
    await reconcile_scope(rt, NS, "conv")
    await finalize_sandbox(rt, NS, "a")
    assert await reconcile_scope(rt, NS, "conv") is None
    assert ("sandboxscopes", "conv") not in kube.objs
    assert ("sandboxes", "b") in kube.objs
    assert not kube.objs[("sandboxes", "b")]["metadata"].get("deletionTimestamp")
    assert "b" in driver.pods and "a" not in driver.pods


async def test_the_holders_deletion_wakes_the_waiting_scope_and_its_sandboxes() -> None:
    from types import SimpleNamespace

    from sandbox_operator.reconcile import handlers

    rt, _, _ = runtime()
    sandboxes: list[str] = []
    scopes: list[str] = []
    rt.enqueue_sandbox = lambda ns, name, delay=0.0, urgent=False: sandboxes.append(name)  # type: ignore[method-assign]
    rt.enqueue_scope = lambda ns, name, delay=0.0: scopes.append(name)  # type: ignore[method-assign]
    memo = SimpleNamespace(runtime=rt)
    holder = scope_obj("first", "2026-01-01T00:00:01Z")
    await handlers.scope_view(body=holder, memo=memo)
    await handlers.scope_view(body=scope_obj("later", "2026-01-01T00:00:02Z"), memo=memo)
    await handlers.scope_view(
        body=scope_obj("other", "2026-01-01T00:00:00Z", thread="x"), memo=memo
    )
    waiting = {
        "metadata": {"namespace": NS, "name": "b", "uid": "ub", "resourceVersion": "3"},
        "spec": {**SPEC, "scopeRef": "later"},
    }
    await handlers.sandbox_view(body=waiting, memo=memo)
    assert rt.views.conversation_holder(NS, "later") == "first"
    scopes.clear()
    await handlers.scope_event(type="DELETED", body=holder, memo=memo)
    assert rt.views.conversation_holder(NS, "later") is None
    assert scopes == ["later"] and sandboxes == ["b"]


async def test_the_holders_deletion_wakes_the_waiting_scope_after_a_404_dropped_it() -> None:
    """A purge's last status write can be answered 404 (the scope went with its finalizer) and
    drop the holder from the views before its DELETED event comes: that event still wakes the
    waiting scope (from the deleted body's own spec), not only the resync (CI, 2026-12-07)."""
    from types import SimpleNamespace

    from sandbox_operator.reconcile import handlers

    rt, _, _ = runtime()
    scopes: list[str] = []
    rt.enqueue_sandbox = lambda ns, name, delay=0.0, urgent=False: None  # type: ignore[method-assign]
    rt.enqueue_scope = lambda ns, name, delay=0.0: scopes.append(name)  # type: ignore[method-assign]
    memo = SimpleNamespace(runtime=rt)
    holder = scope_obj("first", "2026-01-01T00:00:01Z")
    await handlers.scope_view(body=holder, memo=memo)
    await handlers.scope_view(body=scope_obj("later", "2026-01-01T00:00:02Z"), memo=memo)
    rt.views.scopes.remove(NS, "first", holder["metadata"]["uid"])  # the 404's doing
    scopes.clear()
    await handlers.scope_event(type="DELETED", body=holder, memo=memo)
    assert scopes == ["later"]
