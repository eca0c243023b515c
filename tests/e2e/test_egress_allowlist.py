"""`egress: allowlist` end to end, under runc and gVisor, with the egress proxy the OPERATOR runs:
the real operator (configured with the managed `egressProxy`, image = the operator image) creates
the namespace's proxy (ServiceAccount, Role, RoleBinding, ConfigMap, Deployment, Service, owned by
the allowlist Sandboxes), gives each sandbox `HTTPS_PROXY`/`HTTP_PROXY` = the proxy Service's
cluster IP and a NetworkPolicy to the proxy pods only, and from inside the sandbox:

- `allowed.test` answers over CONNECT, plain HTTP and HTTPS through CONNECT, `*.wild.test` matches
  `api.wild.test`;
- `denied.test` is refused with 403 `HostNotAllowed`;
- `inside.test`, allowed by name but resolving to a private address, is refused with 403
  `AddressRefused`;
- the outside server, tried directly (ignoring the proxy variables), is blocked;
- a Sandbox is Ready only once the proxy has admitted it (`status.egress.admitted`), so the
  first request after Ready is served, for the first Sandboxes of the namespace (the proxy still
  starting) and for a later one;
- the proxy records each decision (JSON lines in its pod's log) with the sandbox's id, posts
  Events and writes the `status.egress` summary on the Sandbox;
- 200 tunnels and a slowloris client from one sandbox do not keep another from being served;
- once both allowlist Sandboxes are deleted, the garbage collector removes the proxy.

The "outside" hosts are one HTTP(S) server this test starts on this machine; the proxy pod resolves
the test names through the hostAliases of the operator's `egressProxy` configuration. Nothing
leaves this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from sandbox_operator.backends.base import SandboxRef
from sandbox_operator.backends.egress_proxy import ManagedEgressProxy, ProxyError
from sandbox_operator.config import ManagedEgressProxySettings
from sandbox_operator.egress.events import COMPONENT
from sandbox_operator.egress.probe import (
    ProbeTarget,
    Via,
    expect_answered,
    expect_blocked,
    expect_proxy_refused,
    judge,
)
from sandbox_operator.testing.egress import make_self_signed_cert, serve_http_in_thread
from tests.fixtures import egress_probe as closed
from tests.fixtures.chart import template
from tests.fixtures.egress_probe import BRIDGE_GATEWAY, DEADLINE, SLACK, Outside, probe_in_pod
from tests.fixtures.egress_proxy import (
    PROXY_NAME,
    PROXY_PORT,
    PROXY_SELECTOR,
    config_with_managed_proxy,
    proxy_objects,
    ready_and_served,
)
from tests.fixtures.node import exec_in
from tests.fixtures.operator import PYTHON

pytestmark = pytest.mark.e2e

PROXY_LABELS = {
    "app.kubernetes.io/name": "sandbox-egress-proxy",
    "app.kubernetes.io/managed-by": "sandbox-operator",
    "app.kubernetes.io/component": "egress-proxy",
}


def proxy_pod_name(core: client.CoreV1Api, ns: str) -> str:
    """The running proxy pod (found by its labels; a Sandbox is Ready only once it is served,
    so there is no waiting here)."""
    pods = core.list_namespaced_pod(ns, label_selector=PROXY_SELECTOR).items
    running = [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
    assert len(running) == 1, [(p.metadata.name, p.status.phase) for p in pods]
    return str(running[0].metadata.name)


def proxy_log(core: client.CoreV1Api, ns: str) -> str:
    return str(core.read_namespaced_pod_log(proxy_pod_name(core, ns), ns, container="proxy"))


@pytest.fixture
def tls_outside(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """An HTTPS server on this machine for `allowed.test` (self-signed); (port, CA PEM)."""
    cert = make_self_signed_cert(tmp_path, ("allowed.test",))
    with serve_http_in_thread(b"tls-outside-ok", tls=cert.server_context()) as port:
        yield port, cert.cert.read_text()


def cnd_ready(obj: dict | None) -> bool:
    cond = next((c for c in ((obj or {}).get("status") or {}).get("conditions") or []
                 if c.get("type") == "Ready"), {})  # fmt: skip
    return cond.get("status") == "True"


def decisions(core: client.CoreV1Api, ns: str) -> list[dict]:
    out = []
    for line in proxy_log(core, ns).splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


@pytest.mark.parametrize("runtime_class", ["runc", "gvisor"])
def test_allowlist_through_the_operators_proxy(
    kit,
    start_operator,
    api_client: client.ApiClient,
    core_v1: client.CoreV1Api,
    outside: Outside,
    runtime_class: str,
    operator_image: tuple[str, str],
    tls_outside: tuple[int, str],
) -> None:
    tls_port, ca_pem = tls_outside
    ns = kit.ns
    image = ":".join(operator_image)
    start_operator(config_with_managed_proxy(runtime_class, image, outside, (tls_port,)))
    kit.scope()
    allow = ["allowed.test", "*.wild.test", "inside.test"]
    first = ProbeTarget("allowed-connect", "allowed.test", outside.port, via=Via.CONNECT)
    created = time.monotonic()
    for name in ("allow", "other"):
        kit.sandbox(name, image=PYTHON, requires=["exec"], egress="allowlist", egressAllow=allow)
    # A closed sandbox beside them: no part in the proxy, and no way to it.
    kit.sandbox("closed", image=PYTHON, requires=["exec"])
    # The first allowlist Sandboxes of a fresh namespace: Ready waits for the namespace's proxy
    # to start and admit them, and then the very first request is served (no retrying here).
    obj, seen = ready_and_served(kit, core_v1, "allow", first, outside.token)
    print(f"\nfirst allowlist Sandbox of the namespace Ready after {seen - created:.1f}s")
    other_obj, _ = ready_and_served(kit, core_v1, "other", first, outside.token)
    pod = kit.pod(obj["status"]["servedBy"]["name"])

    # The operator made the namespace's proxy: every object labelled, owned (not controlled) by
    # both allowlist Sandboxes, so the garbage collector removes it after the last one.
    objects = proxy_objects(api_client, ns)
    assert sorted(objects) == sorted(
        ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service"]
    ), sorted(objects)
    owners = {obj["metadata"]["uid"], other_obj["metadata"]["uid"]}
    for kind, o in objects.items():
        assert PROXY_LABELS.items() <= (o.metadata.labels or {}).items(), (kind, o.metadata.labels)
        refs = o.metadata.owner_references or []
        assert {r.uid for r in refs} == owners, (kind, refs)
        assert all(r.kind == "Sandbox" and not r.controller for r in refs), (kind, refs)
        assert all(not r.block_owner_deletion for r in refs), (kind, refs)
    assert [r.verbs for r in objects["Role"].rules if "sandboxes/status" in r.resources] == [
        ["patch"]
    ]
    proxy_pod = core_v1.read_namespaced_pod(proxy_pod_name(core_v1, ns), ns)
    assert proxy_pod.spec.runtime_class_name == runtime_class
    assert proxy_pod.spec.containers[0].image == image
    assert proxy_pod.spec.service_account_name == PROXY_NAME

    # The sandbox is given the Service's cluster IP as a number (it resolves no names), and
    # records it for recovery.
    cluster_ip = objects["Service"].spec.cluster_ip
    env = {e.name: e.value for e in pod.spec.containers[0].env or []}
    assert env.get("HTTPS_PROXY") == f"http://{cluster_ip}:{PROXY_PORT}", env
    assert env.get("HTTP_PROXY") == f"http://{cluster_ip}:{PROXY_PORT}", env
    annotation = (pod.metadata.annotations or {}).get("sandbox-operator.dev/egress-proxy")
    assert annotation == f"{cluster_ip}:{PROXY_PORT}", pod.metadata.annotations

    # The sandbox dials the cluster IP, which kube-proxy translates to the proxy pod's address
    # before kube-router's filter judges the packet: the allowlist NetworkPolicy's rule for the
    # proxy pods' labels is what lets it through. The closed sandbox, without that rule, is
    # refused both the Service address and the pod's.
    kit.wait_condition("closed", reasons=("Ready",), status="True", timeout=150)
    closed_pod = kit.pod(kit.get("closed")["status"]["servedBy"]["name"])
    (via_service, via_pod), _ = probe_in_pod(
        core_v1, ns, closed_pod.metadata.name,
        [ProbeTarget("closed-to-service", cluster_ip, PROXY_PORT),
         ProbeTarget("closed-to-pod", proxy_pod.status.pod_ip, PROXY_PORT)],
    )  # fmt: skip
    for res in (via_service, via_pod):
        assert expect_blocked(res, within=DEADLINE + SLACK).ok, res.describe()

    # A later allowlist Sandbox, the proxy already running: Ready as soon as its pod is and the
    # proxy (watching Sandboxes and pods) admitted it; served at once too.
    created = time.monotonic()
    kit.sandbox("late", image=PYTHON, requires=["exec"], egress="allowlist", egressAllow=allow)
    _, seen = ready_and_served(kit, core_v1, "late", first, outside.token)
    print(f"a later allowlist Sandbox Ready after {seen - created:.1f}s")
    kit.delete("late")
    kit.wait_gone("late", timeout=60)

    sandbox_id = f"{ns}/allow"
    port = outside.port
    targets = [
        ProbeTarget("allowed-connect", "allowed.test", port, via=Via.CONNECT),
        ProbeTarget("allowed-http", "allowed.test", port, via=Via.HTTP),
        ProbeTarget("allowed-https", "allowed.test", tls_port, via=Via.CONNECT, tls=True),
        ProbeTarget("wildcard-connect", "api.wild.test", port, via=Via.CONNECT),
        ProbeTarget("denied-connect", "denied.test", port, via=Via.CONNECT),
        ProbeTarget("denied-http", "denied.test", port, via=Via.HTTP),
        ProbeTarget("private-address", "inside.test", port, via=Via.CONNECT),
        ProbeTarget("direct-outside", outside.address, port),
        ProbeTarget("direct-gateway", BRIDGE_GATEWAY, port),
    ]
    results, _ = probe_in_pod(core_v1, ns, pod.metadata.name, targets, cadata=ca_pem)
    r = {x.name: x for x in results}
    within = DEADLINE + SLACK
    checks = [
        expect_answered(r["allowed-connect"], body_contains=outside.token),
        expect_answered(r["allowed-http"], body_contains=outside.token),
        expect_answered(r["allowed-https"], body_contains="tls-outside-ok"),
        expect_answered(r["wildcard-connect"], body_contains=outside.token),
        expect_proxy_refused(r["denied-connect"], status=403, reason="HostNotAllowed"),
        expect_proxy_refused(r["denied-http"], status=403, reason="HostNotAllowed"),
        expect_proxy_refused(r["private-address"], status=403, reason="AddressRefused"),
        expect_blocked(r["direct-outside"], within=within),
        expect_blocked(r["direct-gateway"], within=within),
    ]
    print("\n" + judge(checks))
    assert all(c.ok for c in checks), judge(checks) + "\n" + proxy_log(core_v1, ns)[-3000:]

    # The same check as a command (check-egress) against the live Sandbox.
    out = closed.check_egress_cli(
        ns, "allow", "--reachable", f"{outside.address}:{port}",
        "--allowed", f"allowed.test:{port}", "--denied", f"denied.test:{port}",
        "--body-contains", outside.token,
    )  # fmt: skip
    assert "egress allowlist" in out and "FAILED" not in out, out

    # The proxy reported admissions only once it was reachable through its Service.
    reach = [line for line in proxy_log(core_v1, ns).splitlines() if "reachable through" in line]
    print(f"proxy: {reach}")
    assert reach and "anyway" not in reach[0], reach

    # Every proxied attempt left one decision record naming the sandbox (nothing secret in it).
    seen = [(d.get("verdict"), d.get("reason"), d.get("host")) for d in decisions(core_v1, ns)
            if d.get("sandbox") == sandbox_id]  # fmt: skip
    for want in (
        ("ALLOW", "Allowed", "allowed.test"),
        ("ALLOW", "Allowed", "api.wild.test"),
        ("DENY", "HostNotAllowed", "denied.test"),
        ("DENY", "AddressRefused", "inside.test"),
    ):
        assert want in seen, (want, seen)

    # ... and surfaced on the Sandbox as Events (rate-limited, folded by host and reason).
    deadline = time.monotonic() + 20
    want = {("EgressAllowed", "allowed.test"), ("EgressDenied", "denied.test"),
            ("EgressDenied", "inside.test")}  # fmt: skip
    got: set[tuple[str, str]] = set()
    while time.monotonic() < deadline and not want <= got:
        for ev in kit.events("allow"):
            if ev.involved_object.kind == "Sandbox" and ev.source.component == COMPONENT:
                for _, host in want:
                    if f" {host}:" in (ev.message or ""):
                        got.add((ev.reason, host))
        time.sleep(1)
    assert want <= got, (want, got, [(e.reason, e.message) for e in kit.events("allow")])

    # ... and summed up in status.egress by the proxy (at most every 5 s per Sandbox).
    deadline = time.monotonic() + 30
    summary: dict[str, Any] = {}
    while time.monotonic() < deadline:
        summary = ((kit.get("allow") or {}).get("status") or {}).get("egress") or {}
        recent = summary.get("recent") or []
        if (
            summary.get("allowed", 0) >= 1
            and summary.get("denied", 0) >= 1
            and any(r.get("host") == "denied.test" and r.get("verdict") == "DENY" for r in recent)
        ):
            break
        time.sleep(1)
    else:
        raise AssertionError(f"status.egress never summed up the probes: {summary}")
    assert summary["since"] and summary["updated"], summary

    # Recovery: a proxy Service that goes away (here: deleted by hand; in real life the garbage
    # collector racing a new Sandbox) is put back by the operator with the address the running
    # sandboxes were given, and they are served again.
    core_v1.delete_namespaced_service(PROXY_NAME, ns)
    removed = time.monotonic()
    restored_ip = None
    while time.monotonic() < removed + 30:
        restored = proxy_objects(api_client, ns).get("Service")
        if restored is not None and not restored.metadata.deletion_timestamp:
            restored_ip = restored.spec.cluster_ip
            break
        time.sleep(0.5)
    restored_after = time.monotonic() - removed
    assert restored_ip == cluster_ip, (restored_ip, cluster_ip)
    # Until kube-proxy has programmed the re-created Service (its endpoints follow), the address
    # refuses connections: a short outage, bounded here.
    while True:
        (again,), _ = probe_in_pod(core_v1, ns, pod.metadata.name, [first])
        if expect_answered(again).ok or time.monotonic() > removed + 30:
            break
        time.sleep(0.5)
    assert expect_answered(again, body_contains=outside.token).ok, again.describe()
    print(f"proxy Service restored after {restored_after:.1f}s at the same address; "
          f"served again after {time.monotonic() - removed:.1f}s")  # fmt: skip
    assert cnd_ready(kit.get("allow")), kit.get("allow")

    # Load: 200 concurrent tunnels and a slowloris client from one sandbox; another sandbox is
    # served meanwhile, the slow client is cut at the header deadline, every tunnel answers.
    other = kit.pod(kit.get("other")["status"]["servedBy"]["name"])
    result: dict[str, Any] = {}

    def load() -> None:
        argv = ["python3", "-c", LOAD_SCRIPT, f"allowed.test:{port}", "200", "6"]
        result["out"] = exec_in(core_v1, ns, pod.metadata.name, *argv)

    worker = threading.Thread(target=load)
    started = time.monotonic()
    worker.start()
    time.sleep(4)  # the tunnels are open and held, the slowloris client is still sending
    (meanwhile,), _ = probe_in_pod(core_v1, ns, other.metadata.name, [first])
    probed_at = time.monotonic() - started
    worker.join(120)
    stats = json.loads(result["out"].strip().splitlines()[-1])
    print(f"load: {stats}; other sandbox {meanwhile.describe()} at +{probed_at:.1f}s")
    assert expect_answered(meanwhile, body_contains=outside.token).ok, meanwhile.describe()
    assert meanwhile.seconds < 2, meanwhile.describe()
    assert stats["established"] == 200 and stats["answered"] == 200, stats
    assert stats["slowloris"].startswith("HTTP/1.1 408"), stats

    # One allowlist Sandbox gone: the proxy stays for the other, which no longer shares it.
    kit.delete("allow")
    kit.wait_gone("allow", timeout=60)
    other_uid = other_obj["metadata"]["uid"]
    deadline = time.monotonic() + 30
    while True:
        objects = proxy_objects(api_client, ns)
        assert len(objects) == 6, f"proxy objects went with the first Sandbox: {sorted(objects)}"
        uids = {k: {r.uid for r in o.metadata.owner_references or []} for k, o in objects.items()}
        if all(u == {other_uid} for u in uids.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert all(u == {other_uid} for u in uids.values()), uids
    (still,), _ = probe_in_pod(core_v1, ns, other.metadata.name, [first])
    assert expect_answered(still, body_contains=outside.token).ok, still.describe()

    # Once the last allowlist Sandbox is gone, the garbage collector removes the proxy.
    kit.delete("other")
    kit.wait_gone("other", timeout=60)
    gone_at = time.monotonic()
    deadline = gone_at + 60
    left = proxy_objects(api_client, ns)
    while left and time.monotonic() < deadline:
        time.sleep(1)
        left = proxy_objects(api_client, ns)
    assert not left, f"proxy objects not garbage-collected within 60 s: {sorted(left)}"
    print(f"proxy objects garbage-collected {time.monotonic() - gone_at:.1f}s after the Sandboxes")
    pods_left = deadline + 60
    while core_v1.list_namespaced_pod(ns, label_selector=PROXY_SELECTOR).items:
        assert time.monotonic() < pods_left, "proxy pod still present"
        time.sleep(1)


def _operator_role(namespace: str, tmp_path: Path, managed_proxy: bool) -> dict[str, Any]:
    """The chart's namespaced operator Role for `namespace` (helm template, no cluster)."""
    values: dict[str, Any] = {"watchNamespaces": [namespace]}
    if managed_proxy:
        values["config"] = {"egressProxy": {}}
    path = tmp_path / f"values-{int(managed_proxy)}.yaml"
    path.write_text(yaml.safe_dump(values))
    roles = [
        o for o in template(values_files=[path])
        if o["kind"] == "Role" and o["metadata"]["namespace"] == namespace
        and not o["metadata"]["name"].endswith("-agent")
    ]  # fmt: skip
    assert len(roles) == 1, roles
    return roles[0]


async def _ensure_as(kubeconfig: str, user: str, namespace: str, owner: SandboxRef) -> Any:
    """ManagedEgressProxy.ensure, with the API calls made as `user` (impersonated)."""
    from kubernetes_asyncio import client as aclient
    from kubernetes_asyncio import config as aconfig

    cfg = aclient.Configuration()
    await aconfig.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    async with aclient.ApiClient(cfg) as api:
        api.set_default_header("Impersonate-User", user)
        proxy = ManagedEgressProxy(ManagedEgressProxySettings(image="unused.invalid/x:1"), api)
        return await proxy.ensure(namespace, owner)


@pytest.mark.parametrize("variant", ["chart-with-proxy", "without-events-patch", "chart-without"])
def test_the_charts_rbac_lets_the_operator_create_the_proxy(
    kit, kubeconfig: str, api_client: client.ApiClient, tmp_path: Path, variant: str
) -> None:
    """With the chart's Role (config.egressProxy set) the operator's own calls create the proxy:
    RBAC's escalation check admits the proxy's Role because the operator holds every permission
    in it. Without the events patch grant the same Role is refused as an escalation, and the
    chart without the proxy section grants nothing of it."""
    managed_proxy = variant != "chart-without"
    ns = kit.ns
    role = _operator_role(ns, tmp_path, managed_proxy)
    role["metadata"] = {"name": "operator-under-test", "namespace": ns}
    if variant == "without-events-patch":
        patch_events = {"apiGroups": [""], "resources": ["events"], "verbs": ["patch"]}
        assert patch_events in role["rules"]
        role["rules"].remove(patch_events)
    rbac = client.RbacAuthorizationV1Api(api_client)
    client.CoreV1Api(api_client).create_namespaced_service_account(
        ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="operator-under-test"))
    )
    rbac.create_namespaced_role(ns, role)
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "operator-under-test"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": "operator-under-test"},
            "subjects": [{"kind": "ServiceAccount", "name": "operator-under-test",
                          "namespace": ns}],
        },
    )  # fmt: skip
    # A real owner (no operator runs here: it stays a bare object).
    sbx = kit.sandbox("owner", image=PYTHON, egress="allowlist", egressAllow=["a.test"])
    owner = SandboxRef(ns, "owner", sbx["metadata"]["uid"])
    user = f"system:serviceaccount:{ns}:operator-under-test"
    time.sleep(1)  # RBAC changes reach the authorizer's cache
    if variant == "chart-with-proxy":
        address = asyncio.run(_ensure_as(kubeconfig, user, ns, owner))
        assert address.port == 3128 and address.ip
        kinds = proxy_objects(api_client, ns)
        assert len(kinds) == 6, sorted(kinds)
        # Least privilege: the grants are by name; any other object is refused.
        with pytest.raises(ApiException) as err:
            client.CoreV1Api(_impersonating(api_client, user)).create_namespaced_config_map(
                ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="other"))
            )
        assert err.value.status == 403
    else:
        with pytest.raises(ProxyError) as refused:
            asyncio.run(_ensure_as(kubeconfig, user, ns, owner))
        message = refused.value.message
        assert refused.value.permanent and "HTTP 403" in message, message
        if variant == "without-events-patch":
            assert message.startswith("egress proxy Role "), message
            assert "does not hold every permission" in message, message  # escalation check
            assert '"events"' in message and '"patch"' in message, message
            assert sorted(proxy_objects(api_client, ns)) == ["ServiceAccount"]
        else:
            assert "lacks the grants for the egress proxy" in message, message
            assert not proxy_objects(api_client, ns)


def _impersonating(api: client.ApiClient, user: str) -> client.ApiClient:
    imp = client.ApiClient(api.configuration)
    imp.set_default_header("Impersonate-User", user)
    return imp


LOAD_SCRIPT = r"""
import json, os, socket, sys, time
proxy = os.environ["HTTPS_PROXY"].split("://", 1)[-1].rstrip("/")
ph, pp = proxy.rsplit(":", 1)
target, n, hold = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
slow = socket.create_connection((ph, int(pp)), timeout=10)
slow.sendall(b"CONNECT allo")  # and nothing more: a slowloris head
t0 = time.monotonic()
socks, errors = [], 0
for _ in range(n):
    try:
        s = socket.create_connection((ph, int(pp)), timeout=10)
        s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
        socks.append(s)
    except OSError:
        errors += 1
established = 0
for s in socks:
    data = b""
    while b"\r\n\r\n" not in data:
        c = s.recv(4096)
        if not c:
            break
        data += c
    if data.split(b"\r\n", 1)[0].split(b" ")[1:2] == [b"200"]:
        established += 1
opened = time.monotonic() - t0
time.sleep(max(0.0, hold - opened))
answered = 0
for s in socks:
    try:
        s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            c = s.recv(4096)
            if not c:
                break
            data += c
        if b" 200 " in data.split(b"\r\n", 1)[0]:
            answered += 1
    except OSError:
        pass
    s.close()
slow.settimeout(1)
try:
    cut = slow.recv(4096)
except OSError:
    cut = b""
print(json.dumps({"established": established, "answered": answered, "errors": errors,
                  "opened_seconds": round(opened, 2),
                  "slowloris": cut.split(b"\r\n", 1)[0].decode("latin-1")}))
"""
