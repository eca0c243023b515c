"""The egress proxy over real sockets, on 127.0.0.0/8 only.

Names are resolved by a StaticResolver (never system DNS); every name maps to a loopback
address. Different sandboxes are told apart by binding the client to 127.0.0.2 / 127.0.0.3.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox_operator.egress import (
    CallbackSink,
    Decision,
    DecisionReason,
    EgressProxy,
    ProxyConfig,
    SandboxEgress,
    StaticResolver,
    Verdict,
    token_digest,
)
from sandbox_operator.testing.egress import (
    LocalServer,
    connect_through,
    get_through,
    open_from,
    proxy_request,
    read_reply_head,
    self_signed_cert,
    start_echo_server,
    start_http_server,
)

SB_A = "127.0.0.2"  # source address of sandbox "ns/a"
SB_B = "127.0.0.3"  # source address of sandbox "ns/b"

RESOLVER = StaticResolver(
    {
        "allowed.test": ["127.0.0.1"],
        "api.wild.test": ["127.0.0.1"],
        "deep.api.wild.test": ["127.0.0.1"],
        "wild.test": ["127.0.0.1"],
        "denied.test": ["127.0.0.1"],
        "b-only.test": ["127.0.0.1"],
        # a name whose only address is outside the admitted 127.0.0.1/32
        "inside.test": ["127.0.0.9"],
        # first address refused, second admitted: the proxy must skip to the second
        "mixed.test": ["127.0.0.9", "127.0.0.1"],
    }
)


def sandbox(sid: str, ip: str, allow: tuple[str, ...], token: str | None = None) -> SandboxEgress:
    return SandboxEgress(
        id=sid,
        allow=allow,
        sourceIPs=(ipaddress.ip_address(ip),),  # type: ignore[call-arg]
        tokenSHA256=token_digest(token) if token else None,
    )


def config(upstream_ports: tuple[int, ...] = (), **overrides: object) -> ProxyConfig:
    data: dict[str, object] = {
        "listenHost": "127.0.0.1",
        "listenPort": 0,
        "allowedPorts": [80, 443, *upstream_ports],
        # Only 127.0.0.1 is admitted: 127.0.0.9 stands in for "an internal address".
        "admittedNetworks": ["127.0.0.1/32"],
        "limits": {
            "headerTimeoutSeconds": 0.5,
            "connectTimeoutSeconds": 2,
            "idleTimeoutSeconds": 5,
            "maxHeaderBytes": 4096,
        },
        "sandboxes": [
            sandbox("ns/a", SB_A, ("allowed.test", "*.wild.test", "mixed.test", "inside.test")),
            sandbox("ns/b", SB_B, ("b-only.test",)),
        ],
    }
    data.update(overrides)
    return ProxyConfig.model_validate(data)


@pytest.fixture
async def upstream() -> AsyncIterator[LocalServer]:
    server = await start_http_server(
        body=lambda head: b"upstream saw: " + head.split(b"\r\n", 1)[0] + b"\n"
    )
    yield server
    await server.close()


@pytest.fixture
async def echo() -> AsyncIterator[LocalServer]:
    server = await start_echo_server()
    yield server
    await server.close()


@pytest.fixture
async def records() -> list[Decision]:
    return []


@pytest.fixture
async def proxy(
    upstream: LocalServer, echo: LocalServer, records: list[Decision]
) -> AsyncIterator[EgressProxy]:
    p = EgressProxy(
        config((upstream.port, echo.port)), sink=CallbackSink(records.append), resolver=RESOLVER
    )
    await p.start()
    yield p
    await p.stop()


async def test_connect_tls_to_allowed_host() -> None:
    async with self_signed_cert(("allowed.test",)) as cert:
        tls_server = await start_http_server(ssl_context=cert.server_context())
        p = EgressProxy(config((tls_server.port,)), resolver=RESOLVER)
        await p.start()
        try:
            reply = await connect_through(p.port, f"allowed.test:{tls_server.port}", source=SB_A)
            assert reply.status == 200
            await reply.writer.start_tls(cert.client_context(), server_hostname="allowed.test")
            reply.writer.write(
                b"GET /x HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n"
            )
            status, _ = await read_reply_head(reply.reader)
            body = await reply.reader.read()
            assert status == 200 and body == b"hello from upstream\n"
            reply.close()
        finally:
            await p.stop()
            await tls_server.close()
        [allow] = p.decisions.records()
        assert allow.verdict is Verdict.ALLOW and allow.sandbox == "ns/a"
        assert (allow.host, allow.port, allow.address) == (
            "allowed.test",
            tls_server.port,
            "127.0.0.1",
        )


async def test_connect_tunnel_relays_bytes_both_ways(proxy: EgressProxy, echo: LocalServer) -> None:
    reply = await connect_through(proxy.port, f"allowed.test:{echo.port}", source=SB_A)
    assert reply.status == 200
    for chunk in (b"ping", b"x" * 200_000):
        reply.writer.write(chunk)
        assert await reply.reader.readexactly(len(chunk)) == chunk
    reply.writer.write_eof()
    assert await reply.reader.read() == b""
    reply.close()


async def test_plain_http_forwarded_in_origin_form(
    proxy: EgressProxy, upstream: LocalServer
) -> None:
    reply = await get_through(
        proxy.port,
        f"http://allowed.test:{upstream.port}/path?q=1",
        source=SB_A,
        extra_headers="Proxy-Authorization: Bearer not-forwarded\r\nProxy-Connection: x\r\n",
    )
    assert reply.status == 200
    assert reply.body == b"upstream saw: GET /path?q=1 HTTP/1.1\n"
    [head] = upstream.heads
    low = head.lower()
    assert f"host: allowed.test:{upstream.port}".encode() in low
    assert b"proxy-authorization" not in low and b"proxy-connection" not in low
    assert b"connection: close" in low
    reply.close()


async def test_denied_host_gets_403_with_reason(
    proxy: EgressProxy, upstream: LocalServer, records: list[Decision]
) -> None:
    for request in (
        f"CONNECT denied.test:{upstream.port} HTTP/1.1\r\n\r\n",
        f"GET http://denied.test:{upstream.port}/ HTTP/1.1\r\n\r\n",
        f"CONNECT b-only.test:{upstream.port} HTTP/1.1\r\n\r\n",  # on ns/b's list, not ns/a's
    ):
        reply = await proxy_request(proxy.port, request.encode(), source=SB_A)
        assert reply.status == 403
        assert reply.headers["x-egress-reason"] == "HostNotAllowed"
        assert b"HostNotAllowed" in reply.body and b"not on this sandbox's allowlist" in reply.body
        reply.close()
    assert upstream.connections == 0
    assert [(r.verdict, r.reason, r.host) for r in records] == [
        (Verdict.DENY, DecisionReason.HOST_NOT_ALLOWED, "denied.test"),
        (Verdict.DENY, DecisionReason.HOST_NOT_ALLOWED, "denied.test"),
        (Verdict.DENY, DecisionReason.HOST_NOT_ALLOWED, "b-only.test"),
    ]
    # the same host is fine for the sandbox that lists it
    reply = await get_through(proxy.port, f"http://b-only.test:{upstream.port}/", source=SB_B)
    assert reply.status == 200
    reply.close()


async def test_port_not_allowed(proxy: EgressProxy) -> None:
    reply = await connect_through(proxy.port, "allowed.test:22", source=SB_A)
    assert reply.status == 403 and reply.headers["x-egress-reason"] == "PortNotAllowed"
    reply.close()


async def test_connect_default_port_is_443(proxy: EgressProxy, records: list[Decision]) -> None:
    # nothing listens on 127.0.0.1:443 here, so the allowed attempt is UNREACHABLE
    reply = await proxy_request(proxy.port, b"CONNECT allowed.test HTTP/1.1\r\n\r\n", source=SB_A)
    assert reply.status in (502, 504)
    [rec] = records
    assert (rec.port, rec.verdict) == (443, Verdict.UNREACHABLE)
    assert rec.reason in (DecisionReason.CONNECT_FAILED, DecisionReason.CONNECT_TIMEOUT)
    reply.close()


async def test_allowed_name_resolving_to_refused_address(
    proxy: EgressProxy, upstream: LocalServer, records: list[Decision]
) -> None:
    reply = await get_through(proxy.port, f"http://inside.test:{upstream.port}/", source=SB_A)
    assert reply.status == 403 and reply.headers["x-egress-reason"] == "AddressRefused"
    assert b"127.0.0.9" not in reply.body  # the client is not told internal addresses
    reply.close()
    [rec] = records
    assert (rec.verdict, rec.reason, rec.address) == (
        Verdict.DENY,
        DecisionReason.ADDRESS_REFUSED,
        "127.0.0.9",
    )
    assert upstream.connections == 0


async def test_refused_address_skipped_checked_address_used(
    proxy: EgressProxy, upstream: LocalServer, records: list[Decision]
) -> None:
    reply = await get_through(proxy.port, f"http://mixed.test:{upstream.port}/", source=SB_A)
    assert reply.status == 200
    reply.close()
    assert records[-1].address == "127.0.0.1"


async def test_default_config_refuses_loopback(upstream: LocalServer) -> None:
    cfg = config((upstream.port,), admittedNetworks=[])
    async with EgressProxy(cfg, resolver=RESOLVER) as p:
        reply = await get_through(p.port, f"http://allowed.test:{upstream.port}/", source=SB_A)
        assert reply.status == 403 and reply.headers["x-egress-reason"] == "AddressRefused"
        # IP literals are checked too
        reply2 = await connect_through(p.port, f"127.0.0.1:{upstream.port}", source=SB_A)
        assert reply2.status == 403
    assert upstream.connections == 0


async def test_wildcard_matching(proxy: EgressProxy, upstream: LocalServer) -> None:
    for host, status in (("api.wild.test", 200), ("deep.api.wild.test", 200), ("wild.test", 403)):
        reply = await get_through(proxy.port, f"http://{host}:{upstream.port}/", source=SB_A)
        assert reply.status == status, host
        reply.close()


async def test_unresolvable_name_is_unreachable(proxy: EgressProxy) -> None:
    cfg = config()
    cfg = cfg.model_copy(update={"sandboxes": (sandbox("ns/a", SB_A, ("nowhere.test",)),)})
    proxy.reconfigure(cfg)
    reply = await connect_through(proxy.port, "nowhere.test:443", source=SB_A)
    assert reply.status == 502 and reply.headers["x-egress-reason"] == "ResolveFailed"
    [rec] = proxy.decisions.records()
    assert rec.verdict is Verdict.UNREACHABLE


async def test_unknown_sandbox_and_removal(proxy: EgressProxy, upstream: LocalServer) -> None:
    reply = await get_through(
        proxy.port, f"http://allowed.test:{upstream.port}/", source="127.0.0.4"
    )
    assert reply.status == 403 and reply.headers["x-egress-reason"] == "UnknownSandbox"
    assert proxy.decisions.summary("ns/a") == {"ALLOW": 0, "DENY": 0, "UNREACHABLE": 0}
    reply = await get_through(proxy.port, f"http://allowed.test:{upstream.port}/", source=SB_A)
    assert proxy.decisions.summary("ns/a")["ALLOW"] == 1
    assert proxy.remove_sandbox("ns/a")
    assert proxy.decisions.summary("ns/a")["ALLOW"] == 0  # counters go with the sandbox
    reply = await get_through(proxy.port, f"http://allowed.test:{upstream.port}/", source=SB_A)
    assert reply.status == 403 and reply.headers["x-egress-reason"] == "UnknownSandbox"
    proxy.upsert_sandbox(sandbox("ns/a", SB_A, ("allowed.test",)))
    reply = await get_through(proxy.port, f"http://allowed.test:{upstream.port}/", source=SB_A)
    assert reply.status == 200


async def test_token_identity(upstream: LocalServer) -> None:
    cfg = config(
        (upstream.port,),
        identity="sourceIPAndToken",
        sandboxes=[
            sandbox("ns/a", SB_A, ("allowed.test",), token="tok-a"),
            sandbox("ns/b", SB_B, ("allowed.test",), token="tok-b"),
        ],
    )
    url = f"http://allowed.test:{upstream.port}/"
    basic_a = "Proxy-Authorization: Basic " + base64.b64encode(b"x:tok-a").decode() + "\r\n"
    async with EgressProxy(cfg, resolver=RESOLVER) as p:
        reply = await get_through(p.port, url, source=SB_A)
        assert reply.status == 407 and "proxy-authenticate" in reply.headers
        reply = await get_through(p.port, url, source=SB_B, extra_headers=basic_a)
        assert reply.status == 403 and reply.headers["x-egress-reason"] == "IdentityMismatch"
        reply = await get_through(p.port, url, source=SB_A, extra_headers=basic_a)
        assert reply.status == 200
        dumped = json.dumps([d.as_dict() for d in p.decisions.records()])
    assert "tok-a" not in dumped and base64.b64encode(b"x:tok-a").decode() not in dumped


async def test_header_too_large(proxy: EgressProxy) -> None:
    big = b"CONNECT allowed.test:443 HTTP/1.1\r\nX-Pad: " + b"a" * 8000 + b"\r\n\r\n"
    reply = await proxy_request(proxy.port, big, source=SB_A)
    assert reply.status == 431 and reply.headers["x-egress-reason"] == "HeaderTooLarge"
    [rec] = proxy.decisions.records()
    assert rec.sandbox == "ns/a" and rec.verdict is Verdict.DENY


async def test_bad_request(proxy: EgressProxy) -> None:
    reply = await proxy_request(proxy.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", source=SB_A)
    assert reply.status == 400 and reply.headers["x-egress-reason"] == "BadRequest"


async def test_slowloris_is_cut_and_does_not_block_others(
    proxy: EgressProxy, upstream: LocalServer
) -> None:
    loop = asyncio.get_running_loop()
    slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    slow_writer.write(b"CONNECT allowed.test:443 HTTP/1.1\r\n")

    async def dribble() -> None:
        try:
            for _ in range(20):  # one byte every 100 ms: would take 2 s, the limit is 0.5 s
                slow_writer.write(b"X")
                await slow_writer.drain()
                await asyncio.sleep(0.1)
        except OSError:
            pass

    dribbler = asyncio.create_task(dribble())
    started = loop.time()
    # while the slow client dribbles, others are served promptly
    for _ in range(5):
        reply = await get_through(proxy.port, f"http://allowed.test:{upstream.port}/", source=SB_A)
        assert reply.status == 200
        reply.close()
    assert loop.time() - started < 0.5
    status, headers = await asyncio.wait_for(read_reply_head(slow_reader), 2)
    assert status == 408 and headers["x-egress-reason"] == "HeaderTimeout"
    assert loop.time() - started < 1.5
    dribbler.cancel()
    slow_writer.close()


async def test_idle_tunnel_is_closed(echo: LocalServer) -> None:
    cfg = config((echo.port,), limits={"idleTimeoutSeconds": 0.3})
    async with EgressProxy(cfg, resolver=RESOLVER) as p:
        reply = await connect_through(p.port, f"allowed.test:{echo.port}", source=SB_A)
        assert reply.status == 200
        reply.writer.write(b"hi")
        assert await reply.reader.readexactly(2) == b"hi"
        assert await asyncio.wait_for(reply.reader.read(), 3) == b""  # closed by the proxy
        reply.close()


@pytest.mark.slow
async def test_200_concurrent_tunnels(proxy: EgressProxy, echo: LocalServer) -> None:
    n = 200
    replies = await asyncio.gather(
        *(connect_through(proxy.port, f"allowed.test:{echo.port}", source=SB_A) for _ in range(n))
    )
    assert all(r.status == 200 for r in replies)
    assert proxy.active_connections("ns/a") == n
    # sandbox b is not starved while a holds 200 tunnels
    other = await connect_through(proxy.port, f"b-only.test:{echo.port}", source=SB_B)
    assert other.status == 200
    other.close()

    async def roundtrip(i: int) -> bytes:
        msg = f"msg-{i}\n".encode()
        replies[i].writer.write(msg)
        return await replies[i].reader.readexactly(len(msg))

    got = await asyncio.gather(*(roundtrip(i) for i in range(n)))
    assert got == [f"msg-{i}\n".encode() for i in range(n)]
    for r in replies:
        r.close()
    allows = [d for d in proxy.decisions.records("ns/a") if d.verdict is Verdict.ALLOW]
    assert len(allows) == n


async def test_per_sandbox_connection_cap(echo: LocalServer) -> None:
    cfg = config((echo.port,), limits={"maxConnectionsPerSandbox": 2})
    async with EgressProxy(cfg, resolver=RESOLVER) as p:
        held = [
            await connect_through(p.port, f"allowed.test:{echo.port}", source=SB_A)
            for _ in range(2)
        ]
        extra = await connect_through(p.port, f"allowed.test:{echo.port}", source=SB_A)
        assert extra.status == 503 and extra.headers["x-egress-reason"] == "TooManyConnections"
        other = await connect_through(p.port, f"b-only.test:{echo.port}", source=SB_B)
        assert other.status == 200
        for r in (*held, other):
            r.close()


async def test_per_client_cap_counts_connections_still_sending_heads(
    upstream: LocalServer,
) -> None:
    cfg = config((upstream.port,), limits={"maxConnectionsPerClient": 2})
    async with EgressProxy(cfg, resolver=RESOLVER) as p:
        slow = [await open_from("127.0.0.1", p.port, SB_A) for _ in range(2)]
        for _, writer in slow:
            writer.write(b"CONNECT allowed.test:443 HTTP/1.1\r\n")  # head never finished
        await asyncio.sleep(0.05)
        extra = await get_through(p.port, f"http://allowed.test:{upstream.port}/", source=SB_A)
        assert extra.status == 503 and extra.headers["x-egress-reason"] == "TooManyConnections"
        other = await get_through(p.port, f"http://b-only.test:{upstream.port}/", source=SB_B)
        assert other.status == 200
        for _, writer in slow:
            writer.close()


async def test_decision_records_shape(
    proxy: EgressProxy, upstream: LocalServer, records: list[Decision]
) -> None:
    await get_through(
        proxy.port, f"http://allowed.test:{upstream.port}/secret-path?token=abc", source=SB_A
    )
    await connect_through(proxy.port, "denied.test:443", source=SB_A)
    assert [r.seq for r in records] == [1, 2]
    allow, deny = (r.as_dict() for r in records)
    assert allow["verdict"] == "ALLOW" and allow["reason"] == "Allowed"
    assert allow["sandbox"] == "ns/a" and allow["method"] == "GET" and allow["client"] == SB_A
    assert allow["time"].endswith("Z")
    assert deny["verdict"] == "DENY" and deny["host"] == "denied.test" and deny["port"] == 443
    text = json.dumps([allow, deny])
    assert "secret-path" not in text and "token=abc" not in text
    assert proxy.decisions.summary("ns/a") == {"ALLOW": 1, "DENY": 1, "UNREACHABLE": 0}
    assert [r.seq for r in proxy.decisions.records(after_seq=1)] == [2]
    assert records[1].summary() == "DENY CONNECT denied.test:443: HostNotAllowed"


async def test_failing_sink_does_not_break_proxy(upstream: LocalServer) -> None:
    def boom(_: Decision) -> None:
        raise RuntimeError("sink down")

    sink = CallbackSink(boom)
    async with EgressProxy(config((upstream.port,)), sink=sink, resolver=RESOLVER) as p:
        reply = await get_through(p.port, f"http://allowed.test:{upstream.port}/", source=SB_A)
        assert reply.status == 200
    assert sink.errors == 1


async def test_entry_point_runs_reloads_and_logs_decisions(
    tmp_path: Path, upstream: LocalServer
) -> None:
    cfg_path = tmp_path / "egress.yaml"
    ready = tmp_path / "ready"
    cfg_path.write_text(
        "listenHost: 127.0.0.1\nlistenPort: 0\nadmittedNetworks: [127.0.0.1/32]\n"
        f"allowedPorts: [{upstream.port}]\n"
        "sandboxes:\n  - id: ns/a\n    sourceIPs: [127.0.0.2]\n    allow: [localhost]\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sandbox_operator.egress", "--config", str(cfg_path),
        "--ready-file", str(ready), "--reload-seconds", "0.2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        for _ in range(300):
            if ready.exists():
                break
            await asyncio.sleep(0.05)
        port = int(ready.read_text())
        url = f"http://localhost:{upstream.port}/"
        reply = await get_through(port, url, source=SB_A)  # system resolver: localhost
        assert reply.status == 200
        reply = await get_through(port, url, source=SB_B)
        assert reply.status == 403
        # reload: give ns/b the same allowlist
        cfg_path.write_text(
            cfg_path.read_text()
            + "  - id: ns/b\n    sourceIPs: [127.0.0.3]\n    allow: [localhost]\n"
        )
        for _ in range(50):
            reply = await get_through(port, url, source=SB_B)
            reply.close()
            if reply.status == 200:
                break
            await asyncio.sleep(0.2)
        assert reply.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(proc.communicate(), 10)
    assert proc.returncode == 0, err.decode()
    lines = [json.loads(line) for line in out.decode().splitlines()]
    verdicts = [(d["sandbox"], d["verdict"]) for d in lines]
    assert verdicts[:2] == [("ns/a", "ALLOW"), (None, "DENY")]
    assert verdicts[-1] == ("ns/b", "ALLOW")
