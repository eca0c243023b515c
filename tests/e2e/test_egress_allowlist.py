"""`egress: allowlist` end to end, under runc and gVisor: the egress proxy runs as a pod in the
sandbox's namespace, the real operator gives the sandbox `HTTPS_PROXY`/`HTTP_PROXY` and a
NetworkPolicy to the proxy only, and from inside the sandbox:

- `allowed.test` answers over CONNECT and over plain HTTP, `*.wild.test` matches `api.wild.test`;
- `denied.test` is refused with 403 `HostNotAllowed`;
- `inside.test`, allowed by name but resolving to a private address, is refused with 403
  `AddressRefused`;
- the outside server, tried directly (ignoring the proxy variables), is blocked;
- the proxy records each decision (JSON lines) with the sandbox's id.

The proxy pod runs this checkout's code (hostPath, read-only) on the python image; its
configuration file (written by this test, as a controller would) maps the sandbox's pod IP to
its allowlist. The "outside" hosts are one HTTP server this test starts on this machine; the
proxy pod resolves the test names through hostAliases. Nothing leaves this machine.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from sandbox_operator.egress.kube import COMPONENT
from sandbox_operator.egress.probe import (
    ProbeTarget,
    Via,
    expect_answered,
    expect_blocked,
    expect_proxy_refused,
    judge,
)
from sandbox_operator.egress.testing import make_self_signed_cert
from tests.e2e import test_egress_closed as closed
from tests.e2e.test_cluster_node import exec_in
from tests.e2e.test_egress_closed import BRIDGE_GATEWAY, DEADLINE, SLACK, Outside, probe_in_pod
from tests.fixtures.operator import DECLARATIONS, PYTHON, REPO, local_config

pytestmark = pytest.mark.e2e

outside = closed.outside  # the fixture: an HTTP server on this machine

PROXY_PORT = 3128
PROXY_LABELS = {"app.kubernetes.io/name": "egress-proxy"}
SITE_PACKAGES = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"


def proxy_pod(
    core: client.CoreV1Api, ns: str, runtime_class: str, outside: Outside, config_dir: Path
) -> client.V1Pod:
    site = SITE_PACKAGES / "site-packages"
    mounts = {
        "src": (REPO / "src", "/opt/src"),
        "site": (site, "/opt/site"),
        "cfg": (config_dir, "/cfg"),
    }
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="egress-proxy", labels=PROXY_LABELS),
        spec=client.V1PodSpec(
            runtime_class_name=runtime_class,
            restart_policy="Never",
            termination_grace_period_seconds=0,
            service_account_name="egress-proxy",
            host_aliases=[
                client.V1HostAlias(
                    ip=outside.address, hostnames=["allowed.test", "api.wild.test", "denied.test"]
                ),
                # allowed by name, but a private address (the pod bridge's gateway)
                client.V1HostAlias(ip=BRIDGE_GATEWAY, hostnames=["inside.test"]),
            ],
            volumes=[
                client.V1Volume(name=k, host_path=client.V1HostPathVolumeSource(path=str(src)))
                for k, (src, _) in mounts.items()
            ],
            containers=[
                client.V1Container(
                    name="proxy",
                    image=PYTHON,
                    image_pull_policy="Never",
                    command=["python3", "-m", "sandbox_operator.egress", "--config",
                             "/cfg/proxy.yaml", "--reload-seconds", "0.5",
                             "--kube-namespace", ns],
                    env=[client.V1EnvVar(name="PYTHONPATH", value="/opt/src:/opt/site")],
                    ports=[client.V1ContainerPort(container_port=PROXY_PORT)],
                    volume_mounts=[
                        client.V1VolumeMount(name=k, mount_path=dst, read_only=True)
                        for k, (_, dst) in mounts.items()
                    ],
                )
            ],
        ),
    )  # fmt: skip
    core.create_namespaced_pod(ns, pod)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        current: client.V1Pod = core.read_namespaced_pod("egress-proxy", ns)
        if current.status.phase == "Running" and current.status.pod_ip:
            return current
        assert current.status.phase not in ("Failed", "Succeeded"), current.status
        time.sleep(0.5)
    raise AssertionError("egress proxy pod not running")


def proxy_rbac(api: client.ApiClient, ns: str) -> None:
    """What the proxy needs to keep its table and post Events, in its namespace only."""
    client.CoreV1Api(api).create_namespaced_service_account(
        ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="egress-proxy"))
    )
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(
        ns,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="egress-proxy"),
            rules=[
                client.V1PolicyRule(
                    api_groups=["sandbox-operator.dev"], resources=["sandboxes"],
                    verbs=["get", "list"],
                ),
                client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["get", "list"]),
                client.V1PolicyRule(api_groups=[""], resources=["events"], verbs=["create"]),
            ],
        ),
    )  # fmt: skip
    rbac.create_namespaced_role_binding(
        ns,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="egress-proxy"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="egress-proxy"
            ),
            subjects=[
                client.RbacV1Subject(kind="ServiceAccount", name="egress-proxy", namespace=ns)
            ],
        ),
    )


@pytest.fixture
def tls_outside(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """An HTTPS server on this machine for `allowed.test` (self-signed); (port, CA PEM)."""
    cert = make_self_signed_cert(tmp_path, ("allowed.test",))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"tls-outside-ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
    server.socket = cert.server_context().wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], cert.cert.read_text()
    finally:
        server.shutdown()
        server.server_close()


def write_proxy_config(
    config_dir: Path, outside: Outside, sandboxes: list[dict], extra_ports: tuple[int, ...] = ()
) -> None:
    cfg = {
        "listenHost": "0.0.0.0",
        "listenPort": PROXY_PORT,
        "allowedPorts": [80, 443, outside.port, *extra_ports],
        # The test's outside server lives on the node's address: admit exactly that one.
        "admittedNetworks": [f"{outside.address}/32"],
        "limits": {"connectTimeoutSeconds": 5, "headerTimeoutSeconds": 2},
        "sandboxes": sandboxes,
    }
    tmp = config_dir / ".proxy.yaml.tmp"
    tmp.write_text(yaml.safe_dump(cfg))
    tmp.replace(config_dir / "proxy.yaml")


def config_with_proxy(runtime_class: str, proxy_ip: str) -> dict:
    isolation = "hardened_container" if runtime_class == "gvisor" else "container"
    declarations = dict(DECLARATIONS, egressModes=["closed", "allowlist"])
    return local_config(
        floor="container",
        selection="fixed",
        pinned=runtime_class,
        backends=[
            {
                "name": runtime_class,
                "type": "runtimeClass",
                "runtimeClassName": runtime_class,
                "isolation": isolation,
                "declarations": declarations,
                "egressProxy": {
                    "url": f"http://{proxy_ip}:{PROXY_PORT}",
                    "port": PROXY_PORT,
                    "podSelector": PROXY_LABELS,
                    "namespaceSelector": None,
                },
            }
        ],
    )


def decisions(core: client.CoreV1Api, ns: str) -> list[dict]:
    text = core.read_namespaced_pod_log("egress-proxy", ns, container="proxy")
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


@pytest.mark.parametrize("runtime_class", ["runc", "gvisor"])
def test_allowlist_through_the_proxy_pod(
    kit,
    start_operator,
    core_v1: client.CoreV1Api,
    outside: Outside,
    runtime_class: str,
    tmp_path: Path,
    tls_outside: tuple[int, str],
) -> None:
    tls_port, ca_pem = tls_outside
    ns = kit.ns
    config_dir = tmp_path / "proxy-config"
    config_dir.mkdir()
    config_dir.chmod(0o755)
    write_proxy_config(config_dir, outside, [], (tls_port,))
    proxy_rbac(core_v1.api_client, ns)
    proxy = proxy_pod(core_v1, ns, runtime_class, outside, config_dir)

    start_operator(config_with_proxy(runtime_class, proxy.status.pod_ip))
    kit.scope()
    allow = ["allowed.test", "*.wild.test", "inside.test"]
    for name in ("allow", "other"):
        kit.sandbox(name, image=PYTHON, requires=["exec"], egress="allowlist", egressAllow=allow)
    kit.wait_condition("other", reasons=("Ready",), status="True", timeout=150)
    obj = kit.wait_condition("allow", reasons=("Ready",), status="True", timeout=150)
    pod = kit.pod(obj["status"]["servedBy"]["name"])
    env = {e.name: e.value for e in pod.spec.containers[0].env or []}
    assert env.get("HTTPS_PROXY") == f"http://{proxy.status.pod_ip}:{PROXY_PORT}", env
    # The proxy keeps its own table (--kube-namespace): wait until it serves this sandbox.
    sandbox_id = f"{ns}/allow"
    first = ProbeTarget("allowed-connect", "allowed.test", outside.port, via=Via.CONNECT)
    deadline = time.monotonic() + 30
    while True:
        (res,), _ = probe_in_pod(core_v1, ns, pod.metadata.name, [first])
        if expect_answered(res).ok or time.monotonic() > deadline:
            break
        time.sleep(1)

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
    assert all(c.ok for c in checks), (
        judge(checks) + "\n" + core_v1.read_namespaced_pod_log("egress-proxy", ns)[-3000:]
    )

    # The same check as a command (check-egress) against the live Sandbox.
    out = closed.check_egress_cli(
        ns, "allow", "--reachable", f"{outside.address}:{port}",
        "--allowed", f"allowed.test:{port}", "--denied", f"denied.test:{port}",
        "--body-contains", outside.token,
    )  # fmt: skip
    assert "egress allowlist" in out and "FAILED" not in out, out

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
