"""One NetworkPolicy per namespace, backend and egress mode (issue 26 item 3): made once for a
burst of Sandboxes, never called for again while the views hold it as it should be, replaced
when it differs (an edit, a changed proxy), and made again when deleted under live pods (the
watch event's upkeep, ``reconcile/egress_policies.py``), not when no pod needs it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from sandbox_operator import labels as lbl
from sandbox_operator.backends.runtimeclass import RuntimeClassDriver, build_egress_policy
from sandbox_operator.config import parse_config
from sandbox_operator.contract import Egress
from sandbox_operator.reconcile.egress_policies import keep_egress_policy
from sandbox_operator.reconcile.runtime import Runtime
from sandbox_operator.reconcile.views import Views
from sandbox_operator.views import ObjectView
from tests.fixtures.backends import gvisor_backend

NS = "ns"
NAME = "sandbox-egress-gvisor-closed"


class Answer:
    """A raw answer, as ``call_json`` reads it."""

    def __init__(self, body: Any) -> None:
        self.status, self.reason, self._data = 200, "OK", json.dumps(body).encode()

    async def read(self) -> bytes:
        return self._data

    def release(self) -> None:
        pass


class FakeNetworking:
    """NetworkingV1Api's policy calls over a dict, each recorded; it answers as the API server
    does (empty lists dropped, a fresh resourceVersion). ``slow``: creates wait for it."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.rv = 0
        self.slow: asyncio.Event | None = None

    def _stored(self, body: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj = json.loads(json.dumps(body))
        obj["spec"] = {k: v for k, v in obj["spec"].items() if v != []}
        obj["metadata"].update(uid=f"uid-{obj['metadata']['name']}", resourceVersion=str(self.rv))
        self.objects[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
        return obj

    async def create_namespaced_network_policy(
        self, ns: str, body: dict[str, Any], _preload_content: bool = True
    ) -> Any:
        self.calls.append(("create", body["metadata"]["name"]))
        if self.slow is not None:
            await self.slow.wait()
        if (ns, body["metadata"]["name"]) in self.objects:
            raise ApiException(status=409, reason="Conflict")
        return Answer(self._stored(body))

    async def replace_namespaced_network_policy(
        self, name: str, ns: str, body: dict[str, Any], _preload_content: bool = True
    ) -> Any:
        self.calls.append(("replace", name))
        have = self.objects[(ns, name)]
        if body["metadata"].get("resourceVersion") != have["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        return Answer(self._stored(body))


class FakeApiClient:
    def sanitize_for_serialization(self, obj: Any) -> Any:
        return obj


def setup() -> tuple[RuntimeClassDriver, FakeNetworking, Views]:
    views = Views()
    driver = RuntimeClassDriver(gvisor_backend(), FakeApiClient())
    net = FakeNetworking()
    driver._net = net
    driver.use_views(views.pods, views.network_policies, views.persistent_volume_claims)
    return driver, net, views


async def test_a_burst_in_a_new_namespace_creates_the_policy_once_and_then_never_calls() -> None:
    driver, net, views = setup()
    net.slow = asyncio.Event()
    burst = [asyncio.create_task(driver.ensure_egress_policy(NS, Egress.CLOSED)) for _ in range(40)]
    await asyncio.sleep(0.01)
    net.slow.set()
    await asyncio.gather(*burst)
    assert net.calls == [("create", NAME)]
    assert views.network_policies.get(NS, NAME) is not None
    # The views hold it as it should be (empty lists dropped by the server): no call at all.
    for _ in range(10):
        await driver.ensure_egress_policy(NS, Egress.CLOSED)
    assert net.calls == [("create", NAME)]
    # Another mode is another policy.
    await driver.ensure_egress_policy(NS, Egress.UNRESTRICTED)
    assert net.calls[-1] == ("create", "sandbox-egress-gvisor-unrestricted")


async def test_a_policy_that_differs_is_replaced() -> None:
    driver, net, views = setup()
    await driver.ensure_egress_policy(NS, Egress.CLOSED)
    edited = json.loads(json.dumps(net.objects[(NS, NAME)]))
    edited["spec"]["egress"] = [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]
    net.rv += 1
    edited["metadata"]["resourceVersion"] = str(net.rv)
    net.objects[(NS, NAME)] = edited
    views.network_policies.upsert(edited)  # the watch brings the edit
    assert not driver.egress_policy_current(ObjectView(edited))
    await driver.ensure_egress_policy(NS, Egress.CLOSED)
    assert net.calls[-1] == ("replace", NAME)
    assert "egress" not in net.objects[(NS, NAME)]["spec"]  # closed again
    assert driver.egress_policy_current(views.network_policies.get(NS, NAME) or ObjectView({}))


def _runtime(driver: RuntimeClassDriver, views: Views) -> Runtime:
    config, _ = parse_config(
        {
            "hostPolicy": {"minIsolation": "hardened_container"},
            "backends": [gvisor_backend().model_dump(by_alias=True, exclude_none=True)],
        }
    )
    rt = Runtime(config=config, kube=None, drivers={"gvisor": driver})  # type: ignore[arg-type]
    rt.views = views
    return rt


def _pod(name: str, egress: str, *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-{name}",
        "resourceVersion": "1",
        "labels": lbl.egress_policy_labels("gvisor", egress),
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {}, "status": {}}


async def test_deleted_under_live_pods_it_is_made_again_and_not_otherwise() -> None:
    driver, net, views = setup()
    rt = _runtime(driver, views)
    await driver.ensure_egress_policy(NS, Egress.CLOSED)
    gone = net.objects.pop((NS, NAME))
    views.network_policies.remove(NS, NAME)
    # No pod of its backend and mode (one of another mode, one being deleted): left gone.
    views.pods.upsert(_pod("sbx-open", "unrestricted"))
    views.pods.upsert(_pod("sbx-leaving", "closed", deleting=True))
    await keep_egress_policy(rt, "DELETED", ObjectView(gone))
    assert (NS, NAME) not in net.objects and net.calls == [("create", NAME)]
    # A live pod it confines: made again at once.
    views.pods.upsert(_pod("sbx-live", "closed"))
    await keep_egress_policy(rt, "DELETED", ObjectView(gone))
    assert (NS, NAME) in net.objects and net.calls[-1] == ("create", NAME)


async def test_an_edited_policy_is_put_back_at_its_event_and_others_are_left_alone() -> None:
    driver, net, views = setup()
    rt = _runtime(driver, views)
    await driver.ensure_egress_policy(NS, Egress.CLOSED)
    edited = json.loads(json.dumps(net.objects[(NS, NAME)]))
    edited["spec"]["podSelector"] = {"matchLabels": {lbl.BACKEND_LABEL: "gvisor", "x": "y"}}
    net.rv += 1
    edited["metadata"]["resourceVersion"] = str(net.rv)
    net.objects[(NS, NAME)] = edited
    views.network_policies.upsert(edited)
    await keep_egress_policy(rt, "MODIFIED", ObjectView(edited))
    assert net.calls[-1] == ("replace", NAME)
    calls = len(net.calls)
    # Its own answer's event: as it should be, nothing more.
    await keep_egress_policy(rt, "MODIFIED", ObjectView(net.objects[(NS, NAME)]))
    # A pool's deny-all and a policy of a backend not configured here: not judged.
    pool_policy = {"metadata": {"name": "p", "namespace": NS, "labels": {lbl.POOL_LABEL: "p"}}}
    await keep_egress_policy(rt, "DELETED", ObjectView(pool_policy))
    foreign = build_egress_policy(
        NS, Egress.CLOSED, gvisor_backend().model_copy(update={"name": "kata"})
    )
    await keep_egress_policy(rt, "DELETED", ObjectView(foreign))
    assert len(net.calls) == calls
