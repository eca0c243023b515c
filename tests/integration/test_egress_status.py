"""status.egress against a real API server: the proxy's summary is stored as written (the CRD's
schema keeps it: the API server prunes status fields it does not know; `admitted` too, written
at once when the proxy admits the sandbox), the operator's merge
patches of its own status fields leave it alone and the other way round, the CRD refuses a
malformed summary, and a deleted Sandbox ends its summary quietly.

No operator and no node are needed: the Sandbox's pod is never scheduled, and its IP is set by
hand to 127.0.0.2, so that a real client on this machine bound to that address is "the
sandbox" to a real EgressProxy whose table the real KubeEgressController keeps from the API.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from sandbox_operator.contract import GROUP, VERSION
from sandbox_operator.egress import EgressProxy, ProxyConfig, StaticResolver
from sandbox_operator.egress.decisions import Decision, DecisionReason, Verdict
from sandbox_operator.egress.kube import KubeEgressController, kube_api_client
from sandbox_operator.reconcile.kube import Kube
from sandbox_operator.testing.egress import (
    LocalServer,
    connect_through,
    get_through,
    start_http_server,
)
from tests.fixtures.operator import Kit

pytestmark = pytest.mark.integration

SANDBOX_IP = "127.0.0.2"
POD = "egress-status-pod"


def unscheduled_pod_with_ip(core: client.CoreV1Api, namespace: str) -> None:
    """A pod no node will run (nothing matches its selector), with a hand-set pod IP."""
    core.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": POD},
            "spec": {
                "nodeSelector": {"sandbox-operator.dev/no-such-node": "true"},
                "containers": [{"name": "c", "image": "busybox:1.36"}],
            },
        },
    )
    core.patch_namespaced_pod_status(
        POD, namespace, {"status": {"podIP": SANDBOX_IP, "podIPs": [{"ip": SANDBOX_IP}]}}
    )


@pytest.fixture
async def upstream() -> AsyncIterator[LocalServer]:
    server = await start_http_server(body=lambda head: b"ok\n")
    yield server
    await server.close()


@pytest.fixture
async def async_api(kubeconfig: str) -> AsyncIterator[Any]:
    api = await kube_api_client(kubeconfig)  # the proxy's own way in, given the test cluster's file
    yield api
    await api.close()


def condition(reason: str) -> dict[str, Any]:
    return {
        "type": "Ready",
        "status": "False",
        "reason": reason,
        "message": "set by the test, as the operator would",
        "lastTransitionTime": datetime.now(UTC)
        .isoformat(timespec="seconds")
        .replace("+00:00", "Z"),
    }


async def test_status_egress_is_stored_and_kept_beside_the_operators_status(
    kit: Kit,
    core_v1: client.CoreV1Api,
    namespace: str,
    upstream: LocalServer,
    async_api: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    unscheduled_pod_with_ip(core_v1, namespace)
    kit.sandbox("s1", egress="allowlist", egressAllow=["allowed.test"])
    kit.sandbox("closed1")  # egress closed: never in the table, never summarised
    operator = Kube(async_api)  # the operator's own status writer (merge patches)
    served = {"servedBy": {"kind": "Pod", "name": POD, "namespace": namespace}}
    # What admission records of an allowlist sandbox: the hosts the proxy enforces.
    admitted_allow = {"s1": {"admittedEgressAllow": ["allowed.test"]}, "closed1": {}}
    for name in ("s1", "closed1"):
        status = {**served, **admitted_allow[name]}
        assert await operator.patch_status("sandboxes", namespace, name, status, None)

    controller = KubeEgressController(async_api, namespace, summary_interval=0.5)
    config = ProxyConfig.model_validate(
        {
            "listenHost": "127.0.0.1",
            "allowedPorts": [80, 443, upstream.port],
            "admittedNetworks": ["127.0.0.1/32"],
        }
    )
    resolver = StaticResolver({"allowed.test": ["127.0.0.1"], "denied.test": ["127.0.0.1"]})
    sid = f"{namespace}/s1"
    async with EgressProxy(config, sink=controller, resolver=resolver) as proxy:
        controller.proxy = proxy
        await controller.sync_once()
        assert proxy.table.ids() == [sid]
        # Admitted: reported at once, before any decision, and kept by the API server (the
        # operator's Ready waits for exactly this field).
        await controller.flush_summaries()
        assert controller.summaries_written == 1
        obj = kit.get("s1")
        assert obj is not None
        admitted = obj["status"]["egress"]
        assert admitted["admitted"] == (controller.summary_status(sid) or {})["admitted"]
        assert (admitted["allowed"], admitted["denied"], admitted["recent"]) == (0, 0, [])
        await asyncio.sleep(0.6)  # the summary interval after that write passes
        reply = await get_through(
            proxy.port,
            f"http://allowed.test:{upstream.port}/private/path?token=sekrit-query",
            source=SANDBOX_IP,
            extra_headers="Authorization: Bearer sekrit-token\r\n",
        )
        assert reply.status == 200
        reply = await connect_through(proxy.port, "denied.test:443", source=SANDBOX_IP)
        assert reply.status == 403
        await controller.flush_summaries()
        assert controller.summaries_written == 2

        # Stored exactly as written: nothing pruned, nothing added.
        expected = controller.summary_status(sid)
        assert expected is not None
        obj = kit.get("s1")
        assert obj is not None
        stored = obj["status"]["egress"]
        assert stored == {**expected, "updated": stored["updated"]}
        assert stored["admitted"] == admitted["admitted"]
        updated = datetime.fromisoformat(stored["updated"])
        assert abs(datetime.now(UTC) - updated) < timedelta(minutes=1)
        assert (stored["allowed"], stored["denied"], stored["unreachable"]) == (1, 1, 0)
        assert [
            (r["verdict"], r["reason"], r["method"], r["host"], r["port"]) for r in stored["recent"]
        ] == [
            ("ALLOW", "Allowed", "GET", "allowed.test", upstream.port),
            ("DENY", "HostNotAllowed", "CONNECT", "denied.test", 443),
        ]
        assert "sekrit" not in str(obj["status"]) and "127.0.0" not in str(stored)
        closed = kit.get("closed1")
        assert closed is not None and "egress" not in closed["status"]

        # The operator's merge patch of its own fields leaves status.egress alone ...
        patched = await operator.patch_status(
            "sandboxes",
            namespace,
            "s1",
            {"conditions": [condition("Provisioning")], "observedGeneration": 1},
            obj["metadata"]["resourceVersion"],
        )
        assert patched is not None
        obj = kit.get("s1")
        assert obj is not None
        assert obj["status"]["egress"] == stored
        assert obj["status"]["conditions"][0]["reason"] == "Provisioning"

        # ... and the proxy's next summary leaves the operator's fields alone.
        await connect_through(proxy.port, "denied.test:443", source=SANDBOX_IP)
        await controller.flush_summaries()
        assert controller.summaries_written == 2  # within the interval: held back
        await asyncio.sleep(0.6)  # the interval passes
        await controller.flush_summaries()
        assert controller.summaries_written == 3
        obj = kit.get("s1")
        assert obj is not None
        assert obj["status"]["egress"]["denied"] == 2
        assert len(obj["status"]["egress"]["recent"]) == 3
        assert obj["status"]["conditions"][0]["reason"] == "Provisioning"
        assert obj["status"]["servedBy"]["name"] == POD

        # The Sandbox goes away: the next write is a 404, which ends the summary quietly.
        kit.delete("s1")
        kit.wait_gone("s1", timeout=30)
        controller.emit(
            Decision(
                99,
                datetime.now(UTC),
                Verdict.DENY,
                DecisionReason.HOST_NOT_ALLOWED,
                sid,
                "denied.test",
                443,
                "CONNECT",
            )
        )
        await asyncio.sleep(0.6)
        with caplog.at_level(logging.WARNING, logger="sandbox_operator.egress"):
            await controller.flush_summaries()
        assert controller.summary_status(sid) is None
        assert [r for r in caplog.records if r.name.startswith("sandbox_operator.egress")] == []
        assert controller.summaries_written == 3


async def test_crd_refuses_a_malformed_summary(kit: Kit, namespace: str, async_api: Any) -> None:
    """The bounds of the schema hold at the API server, not only in the model."""
    from kubernetes_asyncio import client as aclient
    from kubernetes_asyncio.client.exceptions import ApiException

    kit.sandbox("s2", egress="allowlist", egressAllow=["allowed.test"])
    custom = aclient.CustomObjectsApi(async_api)
    now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    record = {"time": now, "verdict": "DENY", "reason": "HostNotAllowed", "host": "d.test"}

    async def patch(egress: dict[str, Any]) -> int:
        body = {"status": {"egress": {"since": now, "updated": now, **egress}}}
        try:
            await custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                "sandboxes",
                "s2",
                body,
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            return int(exc.status)
        return 200

    assert await patch({"denied": 1, "recent": [record]}) == 200
    assert await patch({"recent": [record] * 11}) == 422
    assert await patch({"recent": [{**record, "verdict": "MAYBE"}]}) == 422
    assert await patch({"recent": [{**record, "reason": "has space"}]}) == 422
    assert await patch({"denied": -1}) == 422
    obj = kit.get("s2")
    assert obj is not None
    assert obj["status"]["egress"]["denied"] == 1
    assert obj["status"]["egress"]["recent"] == [record]  # status has no defaults
