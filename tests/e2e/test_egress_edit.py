"""Egress edits on a live Sandbox (#38 item 5) end to end, on runc, through the proxy the
operator runs: one running Sandbox whose allowlist names `allowed.test` is refused `denied.test`;
the client's `edit_egress` widens it, and the very next request reaches `denied.test`; it then
narrows it to `denied.test` alone, and the next request to `allowed.test` is refused while a
CONNECT tunnel to `allowed.test` opened before the narrowing (idle, its server waiting) is closed
by the proxy. The pod is the same throughout (no restart, no new pod).

The outside server is the allowlist tests' (tests/fixtures/egress_probe.py), on this machine.
"""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client

from sandbox_operator.client import SyncSandboxClient
from sandbox_operator.egress.probe import ProbeTarget, Via
from tests.fixtures.egress_probe import Outside
from tests.fixtures.egress_proxy import config_with_managed_proxy, ready_and_served
from tests.fixtures.node import exec_in
from tests.fixtures.operator import PYTHON

pytestmark = pytest.mark.e2e

#: Runs in the sandbox: GET each URL in argv through HTTP_PROXY (urllib reads it); one JSON line
#: per URL: [status, X-Egress-Reason, body head].
GET_SCRIPT = r"""
import json, sys, urllib.error, urllib.request
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, timeout=15) as r:
            print(json.dumps([r.status, "", r.read(200).decode()]))
    except urllib.error.HTTPError as e:
        print(json.dumps([e.code, e.headers.get("X-Egress-Reason") or "", ""]))
"""

#: Runs in the sandbox, in the background: opens a CONNECT tunnel to argv[1] and holds it idle,
#: writing "open <status line>" and, when the tunnel ends, "closed" to argv[2] (in the work
#: directory: the root filesystem is read-only).
TUNNEL_SCRIPT = r"""
import os, socket, sys
host, port = os.environ["HTTP_PROXY"].split("//", 1)[1].rstrip("/").rsplit(":", 1)
out = open(sys.argv[2], "w", buffering=1)
s = socket.create_connection((host, int(port)), timeout=600)
s.sendall(f"CONNECT {sys.argv[1]} HTTP/1.1\r\nHost: {sys.argv[1]}\r\n\r\n".encode())
out.write("open " + s.recv(4096).split(b"\r\n", 1)[0].decode() + "\n")
while s.recv(4096):
    pass
out.write("closed\n")
"""


def test_an_edit_widens_and_narrows_a_running_sandbox(
    kit,
    start_operator,
    core_v1: client.CoreV1Api,
    outside: Outside,
    operator_image: tuple[str, str],
    kubeconfig: str,
) -> None:
    start_operator(config_with_managed_proxy("runc", ":".join(operator_image), outside))
    kit.scope()
    kit.sandbox(
        "edited", image=PYTHON, requires=["exec"], egress="allowlist", egressAllow=["allowed.test"]
    )
    first = ProbeTarget("allowed-connect", "allowed.test", outside.port, via=Via.CONNECT)
    obj, _ = ready_and_served(kit, core_v1, "edited", first, outside.token)
    pod = obj["status"]["servedBy"]["name"]
    pod_uid = kit.pod("edited").metadata.uid
    allowed, denied = (f"http://{h}:{outside.port}/" for h in ("allowed.test", "denied.test"))

    def get(*urls: str) -> list[tuple[int, str, bool]]:
        out = exec_in(core_v1, kit.ns, pod, "python3", "-I", "-c", GET_SCRIPT, *urls)
        answers = [json.loads(line) for line in out.strip().splitlines()]
        return [(a[0], a[1], outside.token in a[2]) for a in answers]

    assert get(allowed, denied) == [(200, "", True), (403, "HostNotAllowed", False)]

    with SyncSandboxClient.from_kubeconfig(kit.ns, kubeconfig=kubeconfig) as c:
        # Widening: denied.test is reached on the very next request.
        c.edit_egress("edited", allow=["allowed.test", "denied.test"], timeout=60)
        assert get(denied) == [(200, "", True)]

        # A tunnel to allowed.test, open and idle while the allowlist is narrowed.
        exec_in(core_v1, kit.ns, pod, "sh", "-c",
                f"python3 -I -c '{TUNNEL_SCRIPT}' allowed.test:{outside.port} /workspace/tunnel "
                "</dev/null >/dev/null 2>&1 &")  # fmt: skip
        state = ""
        deadline = time.monotonic() + 30
        while "open" not in state and time.monotonic() < deadline:
            state = exec_in(core_v1, kit.ns, pod, "sh", "-c", "cat /workspace/tunnel 2>/dev/null")
            time.sleep(0.3)
        assert state.startswith("open HTTP/1.1 200"), state
        time.sleep(1)
        assert "closed" not in exec_in(core_v1, kit.ns, pod, "cat", "/workspace/tunnel")

        # Narrowing: allowed.test is refused on the next request, and its open tunnel is closed.
        c.edit_egress("edited", allow=["denied.test"], timeout=60)
        assert get(allowed, denied) == [(403, "HostNotAllowed", False), (200, "", True)]
        deadline = time.monotonic() + 10
        while "closed" not in state and time.monotonic() < deadline:
            state = exec_in(core_v1, kit.ns, pod, "cat", "/workspace/tunnel")
            time.sleep(0.3)
        assert "closed" in state, state

    status = (kit.get("edited") or {}).get("status") or {}
    assert status["admittedEgressAllow"] == ["denied.test"]
    assert status["egressPolicy"]["generation"] == status["egress"]["policyGeneration"] == 3
    assert kit.pod("edited").metadata.uid == pod_uid  # the same pod throughout
    edits = kit.events_until(
        "edited", lambda evs: [e.reason for e in evs].count("EgressEdited") >= 2
    )
    assert [e.reason for e in edits].count("EgressEdited") == 2
