"""The egress conformance suite over a local (unenclosed) sandbox: it passes for what the local
process really can do (unrestricted; allowlist through the real proxy) and catches a sandbox that
claims `closed` but reaches a server."""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from collections.abc import AsyncIterator

import pytest

from sandbox_operator.conformance.egress import check_egress
from sandbox_operator.contract import Capability
from sandbox_operator.egress import EgressProxy, StaticResolver
from sandbox_operator.egress.probe import ProbeTarget
from sandbox_operator.testing.egress import (
    LocalServer,
    loopback_proxy_config,
    serve_http_in_thread,
    start_http_server,
)
from sandbox_operator.testing.fakes import local_sandbox

pytestmark = pytest.mark.skipif(shutil.which("python3") is None, reason="needs python3")


@pytest.fixture
async def upstream() -> AsyncIterator[LocalServer]:
    server = await start_http_server(body=lambda head: b"upstream-ok\n")
    yield server
    await server.close()


async def test_unrestricted_passes(upstream: LocalServer) -> None:
    sbx = local_sandbox(egress="unrestricted")
    report = await check_egress(
        sbx, reachable=[ProbeTarget("up", "127.0.0.1", upstream.port)], body_contains="upstream-ok"
    )
    assert report.ok, report.failures
    assert report.passed == ["unrestricted_reaches"]


async def test_closed_claim_that_is_not_enforced_fails(upstream: LocalServer) -> None:
    sbx = local_sandbox()  # egress defaults to closed; a local process encloses nothing
    report = await check_egress(sbx, reachable=[ProbeTarget("up", "127.0.0.1", upstream.port)])
    assert report.failed == ["closed_reaches_nothing"]
    assert "answered" in report.failures[0].detail


async def test_closed_without_targets_proves_nothing() -> None:
    report = await check_egress(local_sandbox(), reachable=[])
    assert "closed_reaches_nothing" in report.failed


async def test_skipped_without_exec() -> None:
    sbx = local_sandbox(requires=frozenset({Capability.FILES_IN}))
    report = await check_egress(sbx, reachable=[])
    assert report.ok and report.skipped


async def test_allowlist_through_the_real_proxy(upstream: LocalServer) -> None:
    cfg = loopback_proxy_config("ns/local", ("allowed.test",), upstream.port)
    resolver = StaticResolver({"allowed.test": ["127.0.0.1"], "denied.test": ["127.0.0.1"]})
    proxy = EgressProxy(cfg, resolver=resolver)
    await proxy.start()
    try:
        sbx = local_sandbox(egress="allowlist", egress_allow=["allowed.test"])
        report = await check_egress(
            sbx,
            reachable=[ProbeTarget("up", "127.0.0.1", upstream.port)],
            allowed=[ProbeTarget("allowed", "allowed.test", upstream.port)],
            denied=[ProbeTarget("denied", "denied.test", upstream.port)],
            proxy=f"127.0.0.1:{proxy.port}",
            body_contains="upstream-ok",
        )
    finally:
        await proxy.stop()
    # Everything the proxy decides passes; the direct route is open on a local process (no
    # NetworkPolicy here), and the suite says so.
    assert report.passed == [
        "allowed_answers_over_connect",
        "allowed_answers_over_http",
        "denied_refused_with_403",
    ], report.failures
    assert report.failed == ["direct_route_blocked"]


def test_serve_http_in_thread_answers_the_methods_it_is_given() -> None:
    """The test kit's threaded server: GET only by default (POST gets 501), and POST with its
    body read when asked (an origin a method rule's test needs)."""

    def status(port: int, method: str) -> int:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/", data=b"x" * 10, method=method)
        try:
            with urllib.request.urlopen(req, timeout=5) as answer:
                assert answer.read() == b"body"
                return int(answer.status)
        except urllib.error.HTTPError as refused:
            return refused.code

    with serve_http_in_thread(b"body", host="127.0.0.1") as port:
        assert (status(port, "GET"), status(port, "POST")) == (200, 501)
    with serve_http_in_thread(b"body", host="127.0.0.1", methods=("GET", "POST")) as port:
        assert (status(port, "GET"), status(port, "POST"), status(port, "PUT")) == (200, 200, 501)
