"""The egress probe script, run as a real subprocess on this machine (127.0.0.0/8 only) against
local servers and the real proxy: every outcome it can report, and its deadline."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Sequence

import pytest

from sandbox_operator.egress import EgressProxy, StaticResolver
from sandbox_operator.egress.probe import (
    Outcome,
    ProbeOutputError,
    ProbeTarget,
    Via,
    expect_answered,
    expect_blocked,
    expect_proxy_refused,
    judge,
    parse_results,
    run_probe,
)
from sandbox_operator.testing.egress import LocalServer, loopback_proxy_config, start_http_server

RESOLVER = StaticResolver(
    {"allowed.test": ["127.0.0.1"], "denied.test": ["127.0.0.1"], "inside.test": ["127.0.0.9"]}
)


async def local_execute(argv: Sequence[str]) -> str:
    """Run the probe here, as a sandbox would, with no proxy variables set."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv[1:], env=env, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    return out.decode()


@pytest.fixture
async def upstream() -> AsyncIterator[LocalServer]:
    server = await start_http_server(body=lambda head: b"upstream-ok\n")
    yield server
    await server.close()


@pytest.fixture
async def proxy(upstream: LocalServer) -> AsyncIterator[EgressProxy]:
    cfg = loopback_proxy_config("ns/probe", ("allowed.test", "inside.test"), upstream.port)
    p = EgressProxy(cfg, resolver=RESOLVER)
    await p.start()
    yield p
    await p.stop()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_direct_answers_and_refusals(upstream: LocalServer) -> None:
    targets = [
        ProbeTarget("up", "127.0.0.1", upstream.port),
        ProbeTarget("closed-port", "127.0.0.1", free_port()),
    ]
    up, closed = await run_probe(local_execute, targets, timeout=2)
    assert expect_answered(up, body_contains="upstream-ok").ok, up.describe()
    assert up.status == 200
    assert closed.outcome is Outcome.REFUSED
    assert expect_blocked(closed, within=1).ok


async def test_silent_server_times_out_within_the_deadline() -> None:
    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await reader.read()
        writer.close()

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        (r,) = await run_probe(local_execute, [ProbeTarget("silent", "127.0.0.1", port)], timeout=1)
    finally:
        server.close()
    assert r.outcome is Outcome.TIMEOUT and 0.9 <= r.seconds < 2, r.describe()


async def test_through_the_proxy(proxy: EgressProxy, upstream: LocalServer) -> None:
    p = f"127.0.0.1:{proxy.port}"
    targets = [
        ProbeTarget("connect-allowed", "allowed.test", upstream.port, via=Via.CONNECT, proxy=p),
        ProbeTarget("http-allowed", "allowed.test", upstream.port, via=Via.HTTP, proxy=p),
        ProbeTarget("connect-denied", "denied.test", upstream.port, via=Via.CONNECT, proxy=p),
        ProbeTarget("http-denied", "denied.test", upstream.port, via=Via.HTTP, proxy=p),
        ProbeTarget("inside", "inside.test", upstream.port, via=Via.CONNECT, proxy=p),
        ProbeTarget("no-proxy", "allowed.test", upstream.port, via=Via.CONNECT),
    ]
    results = await run_probe(local_execute, targets, timeout=3)
    ca, ha, cd, hd, inside, none = results
    checks = [
        expect_answered(ca, body_contains="upstream-ok"),
        expect_answered(ha, body_contains="upstream-ok"),
        expect_proxy_refused(cd, status=403, reason="HostNotAllowed"),
        expect_proxy_refused(hd, status=403, reason="HostNotAllowed"),
        expect_proxy_refused(inside, status=403, reason="AddressRefused"),
    ]
    assert all(c.ok for c in checks), judge(checks)
    assert none.outcome is Outcome.NO_PROXY


def test_missing_report_is_an_error() -> None:
    targets = [ProbeTarget("a", "127.0.0.1"), ProbeTarget("b", "127.0.0.1")]
    line = '{"name": "a", "outcome": "refused", "seconds": 0.1}\n'
    with pytest.raises(ProbeOutputError) as info:
        parse_results(line + "python3: not found\n", targets)
    assert info.value.missing == ["b"]


async def test_tls_through_a_connect_tunnel(proxy: EgressProxy) -> None:
    from sandbox_operator.testing.egress import self_signed_cert

    async with self_signed_cert(("allowed.test",)) as cert:
        server = await start_http_server(
            ssl_context=cert.server_context(), body=lambda head: b"tls-ok\n"
        )
        proxy.reconfigure(
            proxy.config.model_copy(
                update={"allowed_ports": (*proxy.config.allowed_ports, server.port)}
            )
        )
        try:
            target = ProbeTarget(
                "tls", "allowed.test", server.port, via=Via.CONNECT,
                proxy=f"127.0.0.1:{proxy.port}", tls=True,
            )  # fmt: skip
            untrusted = ProbeTarget(
                "untrusted", "allowed.test", server.port, via=Via.CONNECT,
                proxy=f"127.0.0.1:{proxy.port}", tls=True,
            )  # fmt: skip
            (ok,) = await run_probe(
                local_execute, [target], timeout=3, cadata=cert.cert.read_text()
            )
            (bad,) = await run_probe(local_execute, [untrusted], timeout=3)
        finally:
            await server.close()
    assert expect_answered(ok, body_contains="tls-ok").ok, ok.describe()
    assert bad.outcome is Outcome.ERROR and bad.detail.startswith("TLS"), bad.describe()
