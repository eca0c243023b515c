"""maf's method rules through ``maf_sandbox.SandboxRouter`` over
:class:`~sandbox_operator.maf.OperatorBackend` (#38 items 1 and 2), on runc, with the egress proxy
the operator runs terminating TLS: maf's own ``assert_egress_methods_conformance`` (a GET-only rule
lets GET through and refuses POST to the same HTTPS host, against an all-methods control), and a
path rule. The guests have no curl (issue #38 item 6), so the subjects ask with the guest's
``python3`` and its default TLS context (which reads SSL_CERT_FILE, the bundle the pod was given).
The upstream is an HTTPS server on this machine answering GET and POST, its certificate from a
test CA the proxy is told to trust.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import ssl
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import maf_sandbox as maf
import pytest
from maf_sandbox import conformance
from tests.fixtures.egress_probe import Outside
from tests.fixtures.egress_proxy import config_with_managed_proxy
from tests.fixtures.operator import PYTHON

from sandbox_operator.client import SandboxClient
from sandbox_operator.contract.published import PUBLISHED_CONFIGMAP
from sandbox_operator.maf import OperatorBackend
from sandbox_operator.testing.egress import make_self_signed_cert

pytestmark = [pytest.mark.e2e]

HOST = "api.wild.test"  # mapped to the node's address by the proxy's hostAliases

#: In the guest: argv METHOD URL; exit 0 and "2xx" when the request completed with 2xx.
REACH = r"""
import sys, urllib.request
method, url = sys.argv[1], sys.argv[2]
req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
try:
    with urllib.request.urlopen(req, timeout=15) as r:
        print("2xx" if 200 <= r.status < 300 else r.status)
except Exception as exc:
    print(type(exc).__name__, getattr(exc, "code", ""), getattr(exc, "headers", {}) and
          exc.headers.get("X-Egress-Reason"))
"""


class PythonHttpSubject:
    """maf's ``EgressMethodsSubject`` over the guest's python3 (maf's own one needs curl)."""

    def __init__(self, sandbox: maf.Sandbox, capabilities: frozenset[maf.Capability]) -> None:
        self.sandbox = sandbox
        self.capabilities = capabilities
        self.last = ""

    async def http_reaches(self, method: str, url: str, *, timeout: float) -> bool:  # noqa: ASYNC109 (maf's protocol)
        result = await self.sandbox.exec(
            ["python3", "-I", "-c", REACH, method, url], working_directory=".", timeout=timeout
        )
        self.last = result.stdout.strip() + result.stderr.strip()[-300:]
        return result.exit_code == 0 and result.stdout.strip() == "2xx"


@contextlib.contextmanager
def https_upstream(tmp: Path) -> Iterator[tuple[int, str]]:
    """An HTTPS server on every address of this machine answering GET and POST with 200;
    (port, its certificate PEM)."""
    cert = make_self_signed_cert(tmp, (HOST,))

    class Handler(http.server.BaseHTTPRequestHandler):
        def _ok(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        do_GET = do_POST = _ok

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
    server.daemon_threads = True
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert.cert, cert.key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1]), cert.cert.read_text()
    finally:
        server.shutdown()


async def test_maf_method_and_path_rules_through_the_operators_tls_hop(
    crds: None,
    kit,
    start_operator,
    core_v1,
    kubeconfig: str,
    outside: Outside,
    operator_image: tuple[str, str],
    tmp_path: Path,
) -> None:
    with https_upstream(tmp_path) as (port, upstream_pem):
        config = config_with_managed_proxy("runc", ":".join(operator_image), outside, (port,))
        (entry,) = config["backends"]
        entry["declarations"] = dict(entry["declarations"], egressRules=True, egressRulesHttps=True)
        config["egressProxy"]["config"]["interception"] = {
            "enabled": True,
            "extraUpstreamRoots": upstream_pem,
        }
        start_operator(config)
        for _ in range(200):  # the operator publishes its backends at start
            with contextlib.suppress(Exception):
                core_v1.read_namespaced_config_map(PUBLISHED_CONFIGMAP, kit.ns)
                break
            await asyncio.sleep(0.3)
        client = await SandboxClient.from_kubeconfig(kit.ns, kubeconfig=kubeconfig)
        try:
            backend = await OperatorBackend.connect(client, backend="runc", default_image=PYTHON)
            declared = backend.declarations
            assert {maf.Capability.EGRESS_METHODS, maf.Capability.EGRESS_PATHS} <= (
                declared.capabilities
            ), declared
            router = maf.SandboxRouter([backend], min_isolation=maf.Isolation.CONTAINER)
            key = maf.SandboxKey("maf-tier", f"thread-{uuid.uuid4().hex[:8]}", "agent")

            def spec(kind: str, rule: maf.EgressRule) -> maf.SandboxSpec:
                return maf.SandboxSpec(
                    kind=kind,
                    requires=frozenset({maf.Capability.EXEC}),
                    egress=maf.Egress.ALLOWLIST,
                    egress_allow=(rule,),
                )

            caps = declared.capabilities
            try:
                scoped = PythonHttpSubject(
                    await router.acquire(
                        key, spec("scoped", maf.EgressRule(HOST, methods=("GET",)))
                    ),
                    caps,
                )
                control = PythonHttpSubject(
                    await router.acquire(key, spec("control", maf.EgressRule(HOST, paths=("/*",)))),
                    caps,
                )
                url = f"https://{HOST}:{port}/ok"
                results = await conformance.run_egress_methods_probes(
                    scoped, control, allowed_url=url
                )
                assert all(r.passed for r in results), (results, scoped.last, control.last)

                paths = PythonHttpSubject(
                    await router.acquire(key, spec("paths", maf.EgressRule(HOST, paths=("/ok",)))),
                    caps,
                )
                assert await paths.http_reaches("GET", url, timeout=30), paths.last
                assert not await paths.http_reaches("GET", f"{url}/../no", timeout=30)
                assert not await paths.http_reaches("GET", f"https://{HOST}:{port}/no", timeout=30)
                assert "PathNotAllowed" in paths.last, paths.last
            finally:
                await router.dispose(key)
        finally:
            await client.close()
