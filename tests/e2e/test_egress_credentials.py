"""Credentials at the egress hop (#38 item 3) end to end on runc, through the proxy the operator
runs: a Sandbox's rule for `api.wild.test` over https names Secret `api-token`; the proxy (its
ServiceAccount bound by the operator to a Secrets reader ClusterRole) attaches its value as
`Authorization: Bearer ...` to the request the guest sends (replacing the guest's own), and the
HTTPS server on this machine receives it. The guest then searches its whole filesystem, its
environment and every process's environment and arguments under /proc: no trace of the token;
nor is there one in the proxy's log, the Sandbox's status or the namespace's Events. Deleting the
Secret makes the next request a refusal (`CredentialMissing`), never one sent without it.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from sandbox_operator.egress.probe import ProbeTarget, Via
from sandbox_operator.testing.egress import make_self_signed_cert, serve_http_in_thread
from tests.fixtures.egress_probe import Outside
from tests.fixtures.egress_proxy import config_with_credentials, ready_and_served, secrets_reader
from tests.fixtures.guest_programs import FIND_EVERYWHERE, GET_WITH_OWN_AUTHORIZATION
from tests.fixtures.node import exec_in
from tests.fixtures.operator import PYTHON

pytestmark = pytest.mark.e2e


@pytest.fixture
def reader(api_client: client.ApiClient) -> Iterator[str]:
    with secrets_reader(api_client) as name:
        yield name


def test_the_upstream_gets_the_bearer_token_and_the_guest_finds_no_trace_of_it(
    kit,
    start_operator,
    core_v1: client.CoreV1Api,
    outside: Outside,
    operator_image: tuple[str, str],
    reader: str,
    tmp_path: Path,
) -> None:
    token = f"tok-{secrets.token_hex(16)}"
    core_v1.create_namespaced_secret(
        kit.ns,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="api-token"), string_data={"token": token}
        ),
    )
    cert = make_self_signed_cert(tmp_path, ("api.wild.test",))
    seen: list[list[tuple[str, str]]] = []
    with serve_http_in_thread(b"cred-upstream-ok", tls=cert.server_context(), seen=seen) as port:
        image = ":".join(operator_image)
        config = config_with_credentials(image, outside, port, cert.cert.read_text(), reader)
        start_operator(config)
        kit.scope()
        credential = {"secretName": "api-token", "key": "token"}
        rule = {"host": "api.wild.test", "schemes": ["https"], "methods": ["GET"],
                "paths": ["/ok/*"], "credential": credential}  # fmt: skip
        kit.sandbox("cred", image=PYTHON, requires=["exec"], egress="allowlist",
                    egressAllow=["allowed.test"], egressRules=[rule])  # fmt: skip
        first = ProbeTarget("allowed-connect", "allowed.test", outside.port, via=Via.CONNECT)
        obj, _ = ready_and_served(kit, core_v1, "cred", first, outside.token)
        pod = obj["status"]["servedBy"]["name"]

        def get() -> list[object]:
            argv = ["python3", "-I", "-c", GET_WITH_OWN_AUTHORIZATION, "api.wild.test", str(port)]
            out: list[object] = json.loads(exec_in(core_v1, kit.ns, pod, *argv).strip())
            return out

        answer = get()
        assert answer[:2] == [200, ""] and "cred-upstream-ok" in str(answer[2]), answer
        (headers,) = seen
        assert [v for k, v in headers if k.lower() == "authorization"] == [f"Bearer {token}"]
        assert token not in json.dumps(answer)

        search = exec_in(core_v1, kit.ns, pod, "python3", "-I", "-c", FIND_EVERYWHERE, token[::-1])
        assert search.strip() == "FOUND []", search

        # Deleted: the next request is refused (once the proxy's cached read ends), never sent.
        core_v1.delete_namespaced_secret("api-token", kit.ns)
        deadline, answered = time.monotonic() + 30, 1
        while (answer := get())[0] == 200 and time.monotonic() < deadline:
            answered += 1
            time.sleep(1)
        assert answer[:2] == [403, "CredentialMissing"], answer
        assert token not in json.dumps(answer)
        assert len(seen) == answered  # the refused request never reached the upstream

    # Nowhere an observer reads: the proxy's log, the Sandbox (status included), the Events.
    proxy_pods = core_v1.list_namespaced_pod(
        kit.ns, label_selector="app.kubernetes.io/name=sandbox-egress-proxy"
    ).items
    log = core_v1.read_namespaced_pod_log(proxy_pods[0].metadata.name, kit.ns, container="proxy")
    events = core_v1.list_namespaced_event(kit.ns).to_str()
    assert "CredentialMissing" in log
    for where in (log, json.dumps(kit.get("cred")), events):
        assert token not in where
