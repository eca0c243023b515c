"""Method and path rules (`egressRules`, #38 item 2) end to end, under runc and gVisor, through the
proxy the operator runs: a Sandbox whose allowlist names `api.wild.test` for GET below `/ok/`
only sends requests from inside its pod (raw sockets to its `HTTP_PROXY`, so the exact method and
target are what the test wrote), and the proxy answers each with the rule's verdict:

- `GET /ok/x` reaches the outside server (its token comes back), also spelled `get`;
- `POST /ok/x` is refused (`MethodNotAllowed`), `GET /no` and `GET /ok/../no` and
  `GET /ok/%2e%2e/no` are refused (`PathNotAllowed`), a CONNECT tunnel to the ruled host is
  refused (`TunnelNotInspectable`), while the plain host beside it keeps its tunnel;
- each refusal is a decision in the proxy's record stream with its reason.

The outside server is the allowlist tests' (tests/fixtures/egress_probe.py), on this machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client

from sandbox_operator.egress.probe import ProbeTarget, Via
from sandbox_operator.testing.egress import make_self_signed_cert, serve_http_in_thread
from tests.fixtures.egress_probe import Outside
from tests.fixtures.egress_proxy import config_with_managed_proxy, ready_and_served
from tests.fixtures.node import exec_in
from tests.fixtures.operator import PYTHON

pytestmark = pytest.mark.e2e

#: Runs in the sandbox: each argv item is one raw request head (the proxy's address from
#: HTTP_PROXY); prints one JSON line per request: [status, X-Egress-Reason, body head].
REQUESTS_SCRIPT = r"""
import json, os, socket, sys
host, port = os.environ["HTTP_PROXY"].split("//", 1)[1].rstrip("/").rsplit(":", 1)
for raw in sys.argv[1:]:
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(raw.encode("latin-1"))
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk or (raw.startswith("CONNECT") and b"\r\n\r\n" in data + chunk):
            data += chunk
            break
        data += chunk
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    reason = next((l.split(":", 1)[1].strip() for l in lines[1:]
                   if l.lower().startswith("x-egress-reason:")), "")
    print(json.dumps([int(lines[0].split()[1]), reason, body[:200].decode("latin-1")]))
"""


def request(method: str, host: str, port: int, path: str) -> str:
    return f"{method} http://{host}:{port}{path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n"


@pytest.mark.parametrize("runtime_class", ["runc", "gvisor"])
def test_method_and_path_rules_through_the_operators_proxy(
    kit,
    start_operator,
    core_v1: client.CoreV1Api,
    outside: Outside,
    runtime_class: str,
    operator_image: tuple[str, str],
) -> None:
    config = config_with_managed_proxy(runtime_class, ":".join(operator_image), outside)
    (backend,) = config["backends"]
    backend["declarations"] = dict(backend["declarations"], egressRules=True)
    start_operator(config)
    kit.scope()
    rule = {"host": "api.wild.test", "schemes": ["http"], "methods": ["GET"], "paths": ["/ok/*"]}
    kit.sandbox(
        "ruled",
        image=PYTHON,
        requires=["exec"],
        egress="allowlist",
        egressAllow=["allowed.test"],
        egressRules=[rule],
    )
    first = ProbeTarget("allowed-connect", "allowed.test", outside.port, via=Via.CONNECT)
    obj, _ = ready_and_served(kit, core_v1, "ruled", first, outside.token)
    assert obj["status"]["admittedEgressRules"] == [rule], obj["status"]
    pod = obj["status"]["servedBy"]["name"]

    port = outside.port
    api = "api.wild.test"
    cases = {
        "get": (request("GET", api, port, "/ok/x"), 200, ""),
        "get-lower": (request("get", api, port, "/ok/x"), 200, ""),
        "post": (request("POST", api, port, "/ok/x"), 403, "MethodNotAllowed"),
        "path": (request("GET", api, port, "/no"), 403, "PathNotAllowed"),
        "dots": (request("GET", api, port, "/ok/../no"), 403, "PathNotAllowed"),
        "encoded": (request("GET", api, port, "/ok/%2e%2e/no"), 403, "PathNotAllowed"),
        "tunnel": (f"CONNECT {api}:{port} HTTP/1.1\r\n\r\n", 403, "TunnelNotInspectable"),
        "plain-tunnel": (f"CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n", 200, ""),
    }
    out = exec_in(
        core_v1,
        kit.ns,
        pod,
        "python3",
        "-I",
        "-c",
        REQUESTS_SCRIPT,
        *(c[0] for c in cases.values()),
    )
    answers = [json.loads(line) for line in out.strip().splitlines()]
    got = {name: (a[0], a[1]) for name, a in zip(cases, answers, strict=True)}
    want = {name: (c[1], c[2]) for name, c in cases.items()}
    assert got == want, out
    bodies = dict(zip(cases, (a[2] for a in answers), strict=True))
    assert outside.token in bodies["get"] and outside.token in bodies["get-lower"]
    assert outside.token not in bodies["post"] + bodies["path"] + bodies["dots"]

    # Each refusal is a decision in the proxy's stream (its JSON lines), with its reason.
    proxy_pods = core_v1.list_namespaced_pod(
        kit.ns, label_selector="app.kubernetes.io/name=sandbox-egress-proxy"
    ).items
    log = core_v1.read_namespaced_pod_log(proxy_pods[0].metadata.name, kit.ns, container="proxy")
    seen = {
        (d.get("reason"), d.get("method"))
        for d in (json.loads(line) for line in log.splitlines() if line.startswith("{"))
        if d.get("sandbox") == f"{kit.ns}/ruled" and d.get("host") == api
    }
    assert {
        ("Allowed", "GET"),
        ("MethodNotAllowed", "POST"),
        ("PathNotAllowed", "GET"),
        ("TunnelNotInspectable", "CONNECT"),
    } <= seen, seen


#: Runs in the sandbox: HTTPS through the proxy's tunnel with the default TLS context (which reads
#: SSL_CERT_FILE, the bundle the pod was given); argv: host, port, then METHOD PATH [HOST] triples
#: separated by '|'. Prints [status, X-Egress-Reason, body head] per request.
HTTPS_SCRIPT = r"""
import http.client, json, os, ssl, sys
proxy_host, proxy_port = os.environ["HTTPS_PROXY"].split("//", 1)[1].rstrip("/").rsplit(":", 1)
host, port = sys.argv[1], int(sys.argv[2])
for item in sys.argv[3:]:
    method, path, *named = item.split("|")
    conn = http.client.HTTPSConnection(proxy_host, int(proxy_port), timeout=15,
                                       context=ssl.create_default_context())
    conn.set_tunnel(host, port)
    try:
        conn.putrequest(method, path, skip_host=bool(named))
        if named:
            conn.putheader("Host", named[0])
        conn.endheaders()
        r = conn.getresponse()
        print(json.dumps([r.status, r.getheader("X-Egress-Reason") or "", r.read(200).decode()]))
    except Exception as exc:
        print(json.dumps([0, type(exc).__name__, str(exc)[:200]]))
    conn.close()
"""


@pytest.mark.parametrize("runtime_class", ["runc", "gvisor"])
def test_https_rules_inside_tls_the_operators_proxy_terminates(
    kit,
    start_operator,
    core_v1: client.CoreV1Api,
    outside: Outside,
    runtime_class: str,
    operator_image: tuple[str, str],
    tmp_path: Path,
) -> None:
    """#38 item 1: the proxy terminates TLS for a host whose rule names https (its CA mounted in
    the pod and trusted through SSL_CERT_FILE), judges the request inside, and re-originates
    verified TLS to the upstream (an HTTPS server on this machine, its certificate from a test
    CA the proxy is told to trust)."""
    cert = make_self_signed_cert(tmp_path, ("api.wild.test",))
    with serve_http_in_thread(b"tls-upstream-ok", tls=cert.server_context()) as tls_port:
        config = config_with_managed_proxy(
            runtime_class, ":".join(operator_image), outside, (tls_port,)
        )
        (backend,) = config["backends"]
        backend["declarations"] = dict(
            backend["declarations"], egressRules=True, egressRulesHttps=True
        )
        config["egressProxy"]["config"]["interception"] = {
            "enabled": True,
            "extraUpstreamRoots": cert.cert.read_text(),
        }
        start_operator(config)
        kit.scope()
        rule = {"host": "api.wild.test", "schemes": ["https"], "methods": ["GET"],
                "paths": ["/ok/*"]}  # fmt: skip
        kit.sandbox("tls", image=PYTHON, requires=["exec"], egress="allowlist",
                    egressAllow=["allowed.test"], egressRules=[rule])  # fmt: skip
        first = ProbeTarget("allowed-connect", "allowed.test", outside.port, via=Via.CONNECT)
        obj, _ = ready_and_served(kit, core_v1, "tls", first, outside.token)
        pod = obj["status"]["servedBy"]["name"]
        here = f"api.wild.test:{tls_port}"
        cases = {
            "get": ("GET|/ok/x", 200, ""),
            "get-lower": ("get|/ok/x", 200, ""),
            "post": ("POST|/ok/x", 403, "MethodNotAllowed"),
            "path": ("GET|/no", 403, "PathNotAllowed"),
            "dots": ("GET|/ok/../no", 403, "PathNotAllowed"),
            "encoded": ("GET|/ok/%2e%2e/no", 403, "PathNotAllowed"),
            "other-host": ("GET|/ok/x|allowed.test", 403, "HostMismatch"),
            "same-host": (f"GET|/ok/x|{here}", 200, ""),
        }
        argv = ["python3", "-I", "-c", HTTPS_SCRIPT, "api.wild.test", str(tls_port)]
        out = exec_in(core_v1, kit.ns, pod, *argv, *(c[0] for c in cases.values()))
        answers = [json.loads(line) for line in out.strip().splitlines()]
        got = {name: (a[0], a[1]) for name, a in zip(cases, answers, strict=True)}
        assert got == {name: (c[1], c[2]) for name, c in cases.items()}, out
        assert all("tls-upstream-ok" in a[2] for a in answers if a[0] == 200), out

        # The key is in the proxy's Secret, mounted in the proxy pod; never in the sandbox's.
        sandbox_pod = core_v1.read_namespaced_pod(pod, kit.ns)
        assert not any(v.secret for v in sandbox_pod.spec.volumes or []), sandbox_pod.spec.volumes
        listing = exec_in(core_v1, kit.ns, pod, "sh", "-c", "ls /etc/sandbox-egress-ca/")
        assert sorted(listing.split()) == ["bundle.crt", "ca.crt"], listing
