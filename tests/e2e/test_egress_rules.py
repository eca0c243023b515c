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

import pytest
from kubernetes import client

from sandbox_operator.egress.probe import ProbeTarget, Via
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
