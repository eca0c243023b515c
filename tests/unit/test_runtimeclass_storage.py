"""The runtime-class backend's persistent work volume (``spec.storage``) and suspend / resume:
the PersistentVolumeClaim it makes, the pod that mounts it, what suspend deletes (the pod only),
and every disposal path taking the claim along. No cluster: a fake API records the calls."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from sandbox_operator import labels as lbl
from sandbox_operator import naming
from sandbox_operator.backends.base import (
    SandboxRef,
    StartupError,
    Suspendable,
    TransientError,
    suspends,
)
from sandbox_operator.backends.runtimeclass import (
    CLAIM,
    WORK_VOLUME,
    build_pod,
    build_work_volume_claim,
    foreign_claim,
)
from sandbox_operator.contract import ConditionReason
from sandbox_operator.reconcile import pool as pools
from sandbox_operator.reconcile.views import Views
from sandbox_operator.views import ObjectView
from tests.fixtures.runtimeclass import KEY, NAME, NS, UID, FakeApi, backend, driver, request

# ---- pure builders ------------------------------------------------------------------------------


def test_the_work_volume_claim_is_labelled_owned_and_sized_by_the_spec() -> None:
    req = request()
    claim = build_work_volume_claim(req)
    meta = claim["metadata"]
    assert claim["kind"] == "PersistentVolumeClaim" and claim["apiVersion"] == "v1"
    assert meta["name"] == naming.work_volume_name(NAME) == f"{NAME}-work"
    assert meta["namespace"] == NS
    assert meta["labels"] == dict(req.labels)  # found by the same selectors as the pod
    assert meta["labels"][lbl.CONVERSATION_LABEL] == lbl.conversation_value("tenant", "t1")
    (owner,) = meta["ownerReferences"]
    assert owner["kind"] == "Sandbox" and owner["uid"] == UID and owner["controller"] is True
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "2Gi"}},
        "storageClassName": "sandbox-local",
    }
    # No class named: the field is left out, so the cluster's default class serves it.
    default = build_work_volume_claim(request({"size": "1Gi", "accessMode": "ReadWriteOncePod"}))
    assert "storageClassName" not in default["spec"]
    assert default["spec"]["accessModes"] == ["ReadWriteOncePod"]
    with pytest.raises(ValueError):
        build_work_volume_claim(request(None))


def _volumes(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod["spec"]["volumes"]}


def _mounts(pod: dict[str, Any]) -> dict[str, str]:
    (container,) = pod["spec"]["containers"]
    return {m["name"]: m["mountPath"] for m in container["volumeMounts"]}


def test_the_pod_mounts_the_claim_at_the_work_dir_and_keeps_tmp_an_empty_dir() -> None:
    pod = build_pod(request(workDir="/workspace"), backend())
    volumes = _volumes(pod)
    assert volumes[WORK_VOLUME] == {
        "name": WORK_VOLUME,
        "persistentVolumeClaim": {"claimName": naming.work_volume_name(NAME)},
    }
    assert "emptyDir" in volumes["tmp"]
    assert _mounts(pod) == {WORK_VOLUME: "/workspace", "tmp": "/tmp"}
    # Without storage: the work dir stays an emptyDir, as before.
    plain = build_pod(request(None, workDir="/workspace"), backend())
    assert "emptyDir" in _volumes(plain)[WORK_VOLUME]
    assert "persistentVolumeClaim" not in json.dumps(plain)
    # Everything else of the pod is the same.
    for p in (pod, plain):
        del p["spec"]["volumes"]
    assert pod == plain


def test_a_claim_of_another_sandbox_or_being_deleted_is_foreign() -> None:
    def claim(uid: str, deleting: bool = False) -> ObjectView:
        meta: dict[str, Any] = {"name": "c", "ownerReferences": [{"uid": uid}]}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return ObjectView({"metadata": meta})

    assert foreign_claim(claim(UID), UID) == ""
    assert "another Sandbox" in foreign_claim(claim("uid-old"), UID)
    assert "being deleted" in foreign_claim(claim(UID, deleting=True), UID)


# ---- the driver against a fake API --------------------------------------------------------------


POD_NAME = naming.pod_name(NAME)
CLAIM_NAME = naming.work_volume_name(NAME)


async def test_ensure_makes_the_policy_then_the_claim_then_the_pod_that_mounts_it() -> None:
    fake = FakeApi()
    views = Views()
    d = driver(fake, views=views)
    served = await d.ensure(request())
    assert served.kind == "Pod" and served.name == POD_NAME
    assert [c[:2] for c in fake.calls] == [
        ("create", "NetworkPolicy"),
        ("create", CLAIM),
        ("create", "Pod"),
    ]
    assert views.persistent_volume_claims.get(NS, CLAIM_NAME) is not None  # its own write seen
    pod = fake.objects[("Pod", NS, POD_NAME)]
    assert _volumes(pod)[WORK_VOLUME]["persistentVolumeClaim"]["claimName"] == CLAIM_NAME
    # Resume: the pod is gone, the claim and policy are seen: only a pod is created.
    del fake.objects[("Pod", NS, POD_NAME)]
    views.pods.remove(NS, POD_NAME)
    fake.calls.clear()
    assert (await d.resume(request())).name == POD_NAME
    assert fake.calls == [("create", "Pod", POD_NAME)]


async def test_ensure_without_storage_makes_no_claim() -> None:
    fake = FakeApi()
    await driver(fake, views=Views()).ensure(request(None))
    assert fake.names(CLAIM) == set()


@pytest.mark.parametrize("with_views", [True, False], ids=["views", "no-views"])
@pytest.mark.parametrize("case", ["other-owner", "deleting"])
async def test_a_claim_of_an_earlier_sandbox_holds_the_key(with_views: bool, case: str) -> None:
    """A claim under the sandbox's name that is not its own (or is going away) is KeyUnclean,
    and no pod is made on it."""
    fake = FakeApi()
    fake.put(CLAIM, CLAIM_NAME, owner="uid-old" if case == "other-owner" else UID,
             deleting=case == "deleting")  # fmt: skip
    d = driver(fake, views=Views() if with_views else None)
    with pytest.raises(StartupError) as raised:
        await d.ensure(request())
    assert raised.value.reason == ConditionReason.KEY_UNCLEAN
    assert CLAIM_NAME in raised.value.message
    assert fake.names("Pod") == set()


async def test_a_claim_refused_by_the_api_server_is_a_startup_failure() -> None:
    fake = FakeApi()
    d = driver(fake, views=Views())

    async def refuse(*args: Any, **kw: Any) -> Any:
        exc = ApiException(status=403, reason="Forbidden")
        exc.body = json.dumps({"message": "persistentvolumeclaims is forbidden"})
        raise exc

    fake.create_namespaced_persistent_volume_claim = refuse  # type: ignore[attr-defined]
    with pytest.raises(StartupError) as raised:
        await d.ensure(request())
    assert raised.value.reason == ConditionReason.STARTUP_FAILED
    assert "HTTP 403" in raised.value.message and "forbidden" in raised.value.message
    assert fake.names("Pod") == set()


#: A per-Sandbox NetworkPolicy, as versions before one policy per backend and egress mode made
#: (labelled like the pod): still deleted with its Sandbox.
LEGACY_POLICY = naming.pod_name(NAME)


def _populated() -> FakeApi:
    fake = FakeApi()
    fake.put("Pod", POD_NAME)
    fake.put("NetworkPolicy", LEGACY_POLICY)
    fake.put(CLAIM, CLAIM_NAME)
    return fake


async def test_the_driver_declares_suspend() -> None:
    d = driver(FakeApi())
    assert isinstance(d, Suspendable) and suspends(d)


async def test_suspend_deletes_the_pod_only() -> None:
    fake = _populated()
    views = Views()
    d = driver(fake, views=views)
    ref = SandboxRef(NS, NAME, UID)
    remaining = await d.suspend(ref)
    assert [(o.kind, o.name) for o in remaining] == [("Pod", POD_NAME)]
    assert [c for c in fake.calls if c[0] == "delete"] == [("delete", "Pod", POD_NAME)]
    assert fake.names(CLAIM) == {CLAIM_NAME}
    assert fake.names("NetworkPolicy") == {LEGACY_POLICY}
    # The pod terminating (seen in the view): still reported, not deleted again.
    terminating = fake.put("Pod", POD_NAME, deleting=True)
    terminating["metadata"]["resourceVersion"] = "2"  # a change is a new version
    views.pods.upsert(terminating)
    fake.calls.clear()
    remaining = await d.suspend(ref)
    assert [o.deleting for o in remaining] == [True] and fake.calls == []
    # Gone: suspended, nothing else touched.
    views.pods.remove(NS, POD_NAME)
    assert await d.suspend(ref) == []
    assert fake.calls == []
    assert len(views.persistent_volume_claims) == 1 and len(views.network_policies) == 1


async def test_suspend_without_views_waits_for_the_pod_and_keeps_the_rest() -> None:
    fake = _populated()
    d = driver(fake)
    assert await d.suspend(SandboxRef(NS, NAME, UID)) == []
    assert fake.names("Pod") == set()
    assert fake.names(CLAIM) == {CLAIM_NAME}
    assert fake.names("NetworkPolicy") == {LEGACY_POLICY}


async def test_a_refused_suspend_is_transient() -> None:
    fake = _populated()
    d = driver(fake, views=Views())

    async def refuse(*args: Any, **kw: Any) -> Any:
        raise ApiException(status=500, reason="Error")

    fake.delete_namespaced_pod = refuse  # type: ignore[attr-defined]
    with pytest.raises(TransientError):
        await d.suspend(SandboxRef(NS, NAME, UID))


async def test_watched_disposal_deletes_the_claim_too() -> None:
    fake = _populated()
    views = Views()
    d = driver(fake, views=views)
    remaining = await d.request_disposal(SandboxRef(NS, NAME, UID))
    assert {o.kind for o in remaining} == {"Pod", "NetworkPolicy", CLAIM}
    assert fake.objects == {}
    assert ("delete", CLAIM, CLAIM_NAME) in fake.calls
    # What the views hold of a sandbox includes its claim (disposal waits for its deletion).
    assert [k for k, _ in views.children(NS, NAME)] == ["Pod", "NetworkPolicy", CLAIM]


async def test_dispose_without_views_deletes_and_waits_for_the_claim() -> None:
    fake = _populated()
    await driver(fake).dispose(SandboxRef(NS, NAME, UID))
    assert fake.objects == {}
    deletes = [c[1] for c in fake.calls if c[0] == "delete"]
    # The pod first (it holds the claim), then what else carries the sandbox's label.
    assert deletes == ["Pod", CLAIM, "NetworkPolicy"]


async def test_a_conversation_purge_deletes_its_claims_by_label() -> None:
    fake = _populated()
    other = fake.put(CLAIM, "sbx-other-work", labels={lbl.MANAGED_BY_LABEL: "someone"})
    await driver(fake, views=Views()).request_conversation_disposal(NS, "tenant", "t1")
    collections = [c[1] for c in fake.calls if c[0] == "delete_collection"]
    assert collections == ["Pod", "NetworkPolicy", CLAIM]
    selector = fake.calls[-1][2]
    assert lbl.CONVERSATION_LABEL in selector and f"{lbl.BACKEND_LABEL}=gvisor" in selector
    assert list(fake.objects.values()) == [other]


async def test_a_conversation_purge_without_per_sandbox_policies_deletes_no_policies() -> None:
    """Today's NetworkPolicies are the namespace's, per backend and egress mode, and no
    conversation's: with none of an older version in the views, no policy call is made."""
    fake = FakeApi()
    fake.put("Pod", POD_NAME)
    fake.put(CLAIM, CLAIM_NAME)
    await driver(fake, views=Views()).request_conversation_disposal(NS, "tenant", "t1")
    assert [c[1] for c in fake.calls if c[0] == "delete_collection"] == ["Pod", CLAIM]


@pytest.mark.parametrize("with_views", [True, False], ids=["views", "no-views"])
async def test_listings_by_key_and_scope_include_claims(with_views: bool) -> None:
    fake = FakeApi()
    fake.put(CLAIM, CLAIM_NAME, owner="uid-old")  # an earlier sandbox's, left behind
    d = driver(fake, views=Views() if with_views else None)
    (found,) = await d.list_by_key(NS, KEY)
    assert (found.kind, found.name, found.owner_uid) == (CLAIM, CLAIM_NAME, "uid-old")
    (by_scope,) = await d.list_by_scope(NS, "tenant", "t1")
    assert by_scope.kind == CLAIM
    await d.dispose_object(found)
    assert fake.names(CLAIM) == set()


def test_the_views_count_claims_of_a_conversation() -> None:
    fake = _populated()
    views = Views()
    driver(fake, views=views)
    value = lbl.conversation_value("tenant", "t1")
    assert views.count_by_label(NS, lbl.CONVERSATION_LABEL, value) == 3
    views.pods.remove(NS, POD_NAME)
    views.network_policies.remove(NS, LEGACY_POLICY)
    assert views.count_by_label(NS, lbl.CONVERSATION_LABEL, value) == 1  # the purge waits for it


async def test_a_claims_deletion_wakes_its_sandbox_and_leaves_the_view() -> None:
    from sandbox_operator.reconcile import handlers

    views = Views()
    claim = _populated().objects[(CLAIM, NS, CLAIM_NAME)]
    views.persistent_volume_claims.upsert(claim)
    woken: list[tuple[str, str, bool]] = []

    class Rt:
        views_from_events = True  # past kopf's listing: the event handler keeps the view

        def __init__(self) -> None:
            self.views = views

        def enqueue_sandbox(self, ns: str, name: str, delay: float = 0, *, urgent: bool = False):
            woken.append((ns, name, urgent))

    class Memo:
        runtime = Rt()

    await handlers.persistent_volume_claim_event(type="MODIFIED", body=claim, memo=Memo())
    assert woken == [] and len(views.persistent_volume_claims) == 1
    await handlers.persistent_volume_claim_event(type="DELETED", body=claim, memo=Memo())
    assert woken == [(NS, NAME, True)]
    assert len(views.persistent_volume_claims) == 0


async def test_a_sandbox_with_storage_is_never_served_from_a_warm_pool() -> None:
    """No pool pod mounts a sandbox's own volume: the claim is skipped (starts cold) without
    looking at any pool, and no pool is reported exhausted."""
    claim = await pools.claim_warm_pod(None, request(), "gvisor")  # type: ignore[arg-type]
    assert claim.served_by is None and claim.exhausted == ()


def test_the_sandbox_view_keeps_what_suspension_is_judged_by() -> None:
    """The reconciler reads a Sandbox's status from the views: why and since when it is
    suspended, and the counts it increments, must be there (else every pass would suspend it
    afresh, and an idle-suspended one could never tell a use newer than its suspension)."""
    from sandbox_operator.reconcile.slim import slim_sandbox
    from sandbox_operator.views import SandboxView

    status = {
        "suspendedBy": "idle",
        "suspendedAt": "2026-01-01T00:00:00Z",
        "resumedAt": "2025-12-31T00:00:00Z",
        "suspendCount": 2,
        "resumeCount": 1,
        "kopf": {"progress": {}},
    }
    obj = {"metadata": {"name": NAME, "namespace": NS, "uid": UID}, "spec": {}, "status": status}
    kept = slim_sandbox(SandboxView(obj))["status"]
    assert kept == {k: v for k, v in status.items() if k != "kopf"}


@pytest.mark.parametrize("with_views", [True, False], ids=["views", "no-views"])
@pytest.mark.parametrize("forged", [False, True], ids=["made-by-the-backend", "forged"])
async def test_a_pod_at_the_sandbox_s_name_is_adopted_only_when_confined_as_made(
    with_views: bool, forged: bool
) -> None:
    """#28 item 1: the pod name is taken and the pod names this Sandbox as its owner (anyone
    who can read the Sandbox's uid can write that). It is adopted only when it is the pod the
    backend makes; otherwise KeyUnclean names the first field that differs."""
    fake = FakeApi()
    pod = build_pod(request(None), backend())
    pod["metadata"].update(uid="pod-uid", resourceVersion="1")
    if forged:
        pod["spec"]["runtimeClassName"] = "runc"
        pod["spec"]["automountServiceAccountToken"] = True
    fake.objects[("Pod", NS, POD_NAME)] = pod
    d = driver(fake, views=Views() if with_views else None)
    if not forged:
        served = await d.ensure(request(None))
        assert served.name == POD_NAME
        return
    with pytest.raises(StartupError) as raised:
        await d.ensure(request(None))
    assert raised.value.reason == ConditionReason.KEY_UNCLEAN
    assert "spec.runtimeClassName" in raised.value.message
    assert "never adopted" in raised.value.message


@pytest.mark.parametrize(
    "owner_name, owner_kind, says",
    [
        (NAME, "Sandbox", "a previous Sandbox named"),
        ("box", "Sandbox", "this Sandbox's name is that Sandbox's pod name"),
        ("p", "SandboxWarmPool", "owned by SandboxWarmPool/p"),
    ],
)
async def test_a_pod_name_held_by_something_else_is_explained_as_it_is(
    owner_name: str, owner_kind: str, says: str
) -> None:
    """#28 item 6: a Sandbox named like another Sandbox's pod waited at KeyUnclean with a message
    that called the other "a previous one". The message says which case it is."""
    fake = FakeApi()
    pod = fake.put("Pod", POD_NAME, owner="uid-other")
    pod["metadata"]["ownerReferences"] = [
        {"kind": owner_kind, "name": owner_name, "uid": "uid-other"}
    ]
    with pytest.raises(StartupError) as raised:
        await driver(fake, views=Views()).ensure(request(None))
    assert raised.value.reason == ConditionReason.KEY_UNCLEAN
    assert says in raised.value.message, raised.value.message
