"""maf's attached identity through ``maf_sandbox.SandboxRouter`` over
:class:`~sandbox_operator.maf.OperatorBackend` (#38 item 3), on runc, with the proxy the operator
runs terminating TLS and attaching credentials: a host ``CredentialGateway`` issues a bearer token
for the instance, the backend installs it (a Secret the Sandbox owns), and a request from the
guest to the ``authority`` origin arrives at the upstream with it while the guest, searching its
whole filesystem, environment and /proc, finds no trace of it.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import maf_sandbox as maf
import pytest
from maf_sandbox.credentials import CredentialGateway, CredentialGrant, CredentialRequest
from tests.fixtures.egress_probe import Outside
from tests.fixtures.egress_proxy import config_with_credentials, secrets_reader
from tests.fixtures.guest_programs import FIND_EVERYWHERE, GET_WITH_OWN_AUTHORIZATION
from tests.fixtures.maf_cluster import wait_published
from tests.fixtures.operator import PYTHON

from sandbox_operator.client import SandboxClient
from sandbox_operator.maf import OperatorBackend
from sandbox_operator.testing.egress import make_self_signed_cert, serve_http_in_thread

pytestmark = [pytest.mark.e2e]

HOST = "api.wild.test"  # mapped to the node's address by the proxy's hostAliases


async def test_an_authority_rule_arrives_upstream_with_the_gateways_token(
    crds: None,
    kit,
    start_operator,
    core_v1,
    api_client,
    kubeconfig: str,
    outside: Outside,
    operator_image: tuple[str, str],
    tmp_path: Path,
) -> None:
    token = f"grant-{secrets.token_hex(16)}"
    asked: list[CredentialRequest] = []
    seen: list[list[tuple[str, str]]] = []
    cert = make_self_signed_cert(tmp_path, (HOST,))
    with (
        secrets_reader(api_client) as reader,
        serve_http_in_thread(b"maf-cred-ok", tls=cert.server_context(), seen=seen) as port,
    ):

        async def provider(request: CredentialRequest) -> Sequence[CredentialGrant]:
            asked.append(request)
            return [CredentialGrant("api", f"https://{HOST}:{port}", token, time.time() + 120)]

        image = ":".join(operator_image)
        config = config_with_credentials(image, outside, port, cert.cert.read_text(), reader)
        wait_published(core_v1, kit.ns, start_operator(config))
        client = await SandboxClient.from_kubeconfig(kit.ns, kubeconfig=kubeconfig)
        try:
            gateway = CredentialGateway(provider, max_lifetime_seconds=300)
            backend = await OperatorBackend.connect(
                client, backend="runc", default_image=PYTHON, credential_gateway=gateway
            )
            assert maf.Capability.ATTACHED_IDENTITY in backend.declarations.capabilities
            assert backend.declarations.attached_identity == gateway.attached_identity
            router = maf.SandboxRouter(
                [backend],
                min_isolation=maf.Isolation.CONTAINER,
                max_identity_scope=maf.IdentityScope.PER_SANDBOX,
            )
            key = maf.SandboxKey("maf-tier", f"thread-{uuid.uuid4().hex[:8]}", "agent", "call-1")
            spec = maf.SandboxSpec(
                kind="cred",
                requires=frozenset({maf.Capability.EXEC, maf.Capability.ATTACHED_IDENTITY}),
                isolation_scope=maf.IsolationScope.CALL,
                egress=maf.Egress.ALLOWLIST,
                egress_allow=(maf.EgressRule(HOST, paths=("/ok/*",), authority="api"),),
                max_identity_scope=maf.IdentityScope.PER_SANDBOX,
                max_identity_retention_seconds=600,
            )
            try:
                sandbox = await router.acquire(key, spec)
                (request,) = asked
                assert request.audiences == {"api"} and request.instance_id
                argv = ["python3", "-I", "-c", GET_WITH_OWN_AUTHORIZATION, HOST, str(port)]
                result = await sandbox.exec(argv, working_directory=".", timeout=60)
                answer = json.loads(result.stdout)
                assert answer[:2] == [200, ""] and "maf-cred-ok" in answer[2], result
                (headers,) = seen
                assert [v for k, v in headers if k.lower() == "authorization"] == [
                    f"Bearer {token}"
                ]
                argv = ["python3", "-I", "-c", FIND_EVERYWHERE, token[::-1]]
                found = await sandbox.exec(argv, working_directory=".", timeout=180)
                assert found.stdout.strip() == "FOUND []", found
            finally:
                await router.dispose(key)
        finally:
            await client.close()
