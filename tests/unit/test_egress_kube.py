"""KubeEgressController with a fake API (unit level): Events are folded by (verdict, reason,
host, port), rate-limited per Sandbox, and only for sandboxes it admitted; the table follows
the allowlist Sandboxes and their pod IPs."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from sandbox_operator.egress import DecisionReason, EgressProxy, ProxyConfig, Verdict
from sandbox_operator.egress.decisions import Decision
from sandbox_operator.egress.kube import KubeEgressController


class FakeCustom:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    async def list_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
        return {"items": self.items}


class FakeCore:
    def __init__(self, pods: dict[str, str]) -> None:
        self.pods = pods
        self.events: list[dict[str, Any]] = []

    async def read_namespaced_pod(self, name: str, ns: str) -> Any:
        if name not in self.pods:
            raise LookupError(name)
        return SimpleNamespace(
            status=SimpleNamespace(pod_ip=self.pods[name]),
            metadata=SimpleNamespace(deletion_timestamp=None),
        )

    async def create_namespaced_event(self, ns: str, body: dict[str, Any]) -> None:
        self.events.append(body)


def sandbox(
    name: str, egress: str = "allowlist", allow: tuple[str, ...] = ("a.test",)
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": {"egress": egress, "egressAllow": list(allow)},
        "status": {"servedBy": {"kind": "Pod", "name": name}},
    }


def controller(
    items: list[dict[str, Any]], pods: dict[str, str], **kw: Any
) -> KubeEgressController:
    c = KubeEgressController(None, "ns", **kw)
    c.custom = FakeCustom(items)  # type: ignore[assignment]
    c.core = FakeCore(pods)  # type: ignore[assignment]
    c.proxy = EgressProxy(ProxyConfig.model_validate({"listenHost": "127.0.0.1"}))
    return c


def decision(sandbox: str, host: str, verdict: Verdict = Verdict.DENY) -> Decision:
    reason = DecisionReason.ALLOWED if verdict is Verdict.ALLOW else DecisionReason.HOST_NOT_ALLOWED
    return Decision(1, datetime.now(UTC), verdict, reason, sandbox, host, 443, "CONNECT")


async def test_table_follows_allowlist_sandboxes() -> None:
    items = [sandbox("a"), sandbox("closed", egress="closed"), sandbox("nopod")]
    c = controller(items, {"a": "10.244.0.7", "closed": "10.244.0.8"})
    await c.sync_once()
    assert c.proxy is not None
    assert c.proxy.table.ids() == ["ns/a"]
    items[0]["spec"]["egressAllow"] = ["b.test"]
    await c.sync_once()
    entry = c.proxy.table.get("ns/a")
    assert entry is not None
    items.clear()
    await c.sync_once()
    assert c.proxy.table.ids() == []


async def test_events_folded_and_rate_limited() -> None:
    c = controller([sandbox("a")], {"a": "10.244.0.7"}, burst=2, interval=1000)
    await c.sync_once()
    for _ in range(5):
        c.emit(decision("ns/a", "denied.test"))
    c.emit(decision("ns/a", "ok.test", Verdict.ALLOW))
    c.emit(decision("ns/a", "third.test"))
    c.emit(decision("ns/other", "x.test"))  # not a sandbox this proxy serves: no Event
    await c.flush_events()
    events = c.core.events  # type: ignore[attr-defined]
    assert len(events) == 2  # the burst
    first, second = events
    assert first["reason"] == "EgressDenied" and first["count"] == 5
    assert "denied.test:443" in first["message"] and "(x5)" in first["message"]
    assert first["involvedObject"] == {
        "apiVersion": "sandbox-operator.dev/v1alpha1",
        "kind": "Sandbox",
        "name": "a",
        "namespace": "ns",
        "uid": "uid-a",
    }
    assert second["reason"] == "EgressAllowed" and second["type"] == "Normal"
    await c.flush_events()  # no tokens left: third.test waits
    assert len(events) == 2
