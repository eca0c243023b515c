"""Method and path rules at the egress proxy (#38 item 2), over real loopback sockets.

The upstream records every byte it receives, so each bypass attempt (another case of a verb, dot
segments, percent-encoded dots, a second request pipelined behind a judged one or to another
Host, an Upgrade, HTTP/2, a CONNECT tunnel to a ruled host) is shown to reach nothing it should
not, and each refusal to be a numbered decision with its reason.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

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
)
from sandbox_operator.egress.hostmatch import HostPattern
from sandbox_operator.egress.requestrules import RequestRule, judge
from sandbox_operator.testing.egress import open_from, proxy_request, read_reply_head

SB = "127.0.0.2"
RESOLVER = StaticResolver(
    {n: ["127.0.0.1"] for n in ("api.test", "other.test", "x.a.wild.test", "free.test")}
)


@dataclass
class Recorder:
    """An upstream that answers 200 to one request and keeps every byte it was sent."""

    port: int = 0
    received: list[bytes] = field(default_factory=list)
    server: asyncio.Server | None = None

    @property
    def seen(self) -> bytes:
        return b"".join(self.received)


@pytest.fixture
async def recorder() -> AsyncIterator[Recorder]:
    rec = Recorder()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            rec.received.append(head)
            # Whatever else arrives within a moment (a body, a pipelined request) is recorded.
            with_more = True
            while with_more:
                try:
                    async with asyncio.timeout(0.3):
                        more = await reader.read(65536)
                except TimeoutError:
                    break
                with_more = bool(more)
                rec.received.append(more)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
        finally:
            writer.close()

    rec.server = await asyncio.start_server(handle, "127.0.0.1", 0)
    rec.port = rec.server.sockets[0].getsockname()[1]
    yield rec
    rec.server.close()
    await rec.server.wait_closed()


@pytest.fixture
async def records() -> list[Decision]:
    return []


RULES = [
    {"host": "api.test", "methods": ["GET", "HEAD"], "paths": ["/v1/*", "/health"]},
    {"host": "*.wild.test", "methods": ["POST"]},
]


@pytest.fixture
async def proxy(recorder: Recorder, records: list[Decision]) -> AsyncIterator[EgressProxy]:
    sandbox = SandboxEgress(
        id="ns/a",
        allow=("other.test", "free.test"),
        rules=RULES,  # type: ignore[arg-type]
        sourceIPs=(ipaddress.ip_address(SB),),  # type: ignore[call-arg]
    )
    config = ProxyConfig.model_validate(
        {
            "listenHost": "127.0.0.1",
            "listenPort": 0,
            "allowedPorts": [80, 443, recorder.port],
            "admittedNetworks": ["127.0.0.1/32"],
            "limits": {"headerTimeoutSeconds": 1, "connectTimeoutSeconds": 2},
            "sandboxes": [sandbox],
        }
    )
    p = EgressProxy(config, sink=CallbackSink(records.append), resolver=RESOLVER)
    await p.start()
    yield p
    await p.stop()


async def send(proxy: EgressProxy, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reply = await proxy_request(proxy.port, raw, source=SB)
    return reply.status, reply.headers, reply.body


def req(method: str, url: str, *extra: str) -> bytes:
    host = url.split("/", 3)[2]
    lines = [f"{method} {url} HTTP/1.1", f"Host: {host}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def last(records: list[Decision]) -> Decision:
    return records[-1]


# ---- the pure judgement ----------------------------------------------------------------------


def rule(methods: tuple[str, ...] | None, paths: tuple[str, ...] | None) -> RequestRule:
    return RequestRule(HostPattern.parse("api.test"), frozenset(methods or ()) or None, paths)


@pytest.mark.parametrize(
    ("method", "target", "reason"),
    [
        ("GET", "/v1/models?x=1", DecisionReason.ALLOWED),
        ("GET", "/v1/", DecisionReason.ALLOWED),
        ("GET", "/health", DecisionReason.ALLOWED),
        ("GET", "/v1", DecisionReason.PATH_NOT_ALLOWED),  # a prefix is below /v1/, not /v1
        ("GET", "/health/x", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "/v10/x", DecisionReason.PATH_NOT_ALLOWED),
        ("POST", "/v1/x", DecisionReason.METHOD_NOT_ALLOWED),
        ("GET", "/v1/../admin", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "/v1/./x", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "/v1/..;/admin", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "/v1/%2e%2e/admin", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "/v1/%2E%2e/admin", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "/v1/.%2e/admin", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "/v1%2f..%2fadmin", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "/v1/..\\admin", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "/v1/%5c..%5cadmin", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "/v1/a%00", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "*", DecisionReason.PATH_NOT_ALLOWED),
    ],
)
def test_judge_a_request_against_the_rules(
    method: str, target: str, reason: DecisionReason
) -> None:
    assert judge((rule(("GET",), ("/v1/*", "/health")),), method, target) is reason


def test_one_of_several_rules_for_a_host_is_enough() -> None:
    rules = (rule(("GET",), ("/read/*",)), rule(("POST",), ("/write",)))
    assert judge(rules, "POST", "/write") is DecisionReason.ALLOWED
    assert judge(rules, "GET", "/read/x") is DecisionReason.ALLOWED
    assert judge(rules, "POST", "/read/x") is DecisionReason.PATH_NOT_ALLOWED
    assert judge(rules, "PUT", "/write") is DecisionReason.METHOD_NOT_ALLOWED


# ---- through the proxy -----------------------------------------------------------------------


async def test_an_allowed_request_reaches_the_upstream(
    proxy: EgressProxy, recorder: Recorder, records: list[Decision]
) -> None:
    status, _, body = await send(proxy, req("GET", f"http://api.test:{recorder.port}/v1/models"))
    assert (status, body) == (200, b"ok")
    assert recorder.seen.startswith(b"GET /v1/models HTTP/1.1\r\n")
    assert last(records).verdict is Verdict.ALLOW and last(records).method == "GET"


@pytest.mark.parametrize(
    ("method", "path", "reason"),
    [
        ("POST", "/v1/models", DecisionReason.METHOD_NOT_ALLOWED),
        ("post", "/v1/models", DecisionReason.METHOD_NOT_ALLOWED),
        ("pOsT", "/v1/models", DecisionReason.METHOD_NOT_ALLOWED),
        ("DELETE", "/health", DecisionReason.METHOD_NOT_ALLOWED),
        ("GET", "/admin", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "/v1/../admin", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "/v1/%2e%2e/admin", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "/v1/%2E%2E/admin", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "/v1/..%2fadmin", DecisionReason.PATH_NOT_ALLOWED),
    ],
)
async def test_a_forbidden_request_is_refused_with_its_reason_and_reaches_nothing(
    proxy: EgressProxy,
    recorder: Recorder,
    records: list[Decision],
    method: str,
    path: str,
    reason: DecisionReason,
) -> None:
    status, headers, body = await send(proxy, req(method, f"http://api.test:{recorder.port}{path}"))
    assert status == 403 and headers["x-egress-reason"] == str(reason)
    assert path.encode() not in body  # the answer names the reason, not what was asked
    assert recorder.received == []
    decision = last(records)
    assert decision.verdict is Verdict.DENY and decision.reason is reason
    assert decision.method == method.upper() and decision.host == "api.test"
    assert [r.seq for r in records] == sorted(r.seq for r in records)


async def test_a_lower_case_allowed_verb_goes_upstream_in_its_canonical_case(
    proxy: EgressProxy, recorder: Recorder
) -> None:
    status, _, _ = await send(proxy, req("get", f"http://api.test:{recorder.port}/health"))
    assert status == 200
    assert recorder.seen.startswith(b"GET /health HTTP/1.1\r\n")


async def test_a_pipelined_second_request_never_reaches_the_upstream(
    proxy: EgressProxy, recorder: Recorder
) -> None:
    first = req("GET", f"http://api.test:{recorder.port}/health")
    smuggled = req("POST", f"http://api.test:{recorder.port}/admin", "Content-Length: 0")
    other_host = b"DELETE /x HTTP/1.1\r\nHost: other.test\r\n\r\n"
    status, _, _ = await send(proxy, first + smuggled + other_host)
    assert status == 200
    assert b"POST" not in recorder.seen and b"DELETE" not in recorder.seen
    assert b"other.test" not in recorder.seen


async def test_a_body_is_forwarded_exactly_and_nothing_after_it(
    proxy: EgressProxy, recorder: Recorder
) -> None:
    url = f"http://x.a.wild.test:{recorder.port}/upload"
    body = b"POST /admin HTTP/1.1\r\n\r\n"  # a body that looks like a request is only a body
    after = b"DELETE /y HTTP/1.1\r\nHost: other.test\r\n\r\n"
    raw = req("POST", url, f"Content-Length: {len(body)}") + body + after
    status, _, _ = await send(proxy, raw)
    assert status == 200
    assert recorder.seen.endswith(body) and b"DELETE" not in recorder.seen


async def test_a_chunked_body_is_forwarded_to_its_last_chunk_and_nothing_after_it(
    proxy: EgressProxy, recorder: Recorder
) -> None:
    url = f"http://x.a.wild.test:{recorder.port}/upload"
    chunks = b"5\r\nhello\r\n0\r\n\r\n"
    after = b"DELETE /y HTTP/1.1\r\n\r\n"
    status, _, _ = await send(
        proxy, req("POST", url, "Transfer-Encoding: chunked") + chunks + after
    )
    assert status == 200
    assert recorder.seen.endswith(chunks) and b"DELETE" not in recorder.seen


@pytest.mark.parametrize(
    "framing",
    [
        ("Content-Length: 3", "Transfer-Encoding: chunked"),
        ("Content-Length: 3", "Content-Length: 4"),
        ("Transfer-Encoding: gzip, chunked",),
        ("Content-Length: -1",),
    ],
)
async def test_ambiguous_body_framing_is_refused(
    proxy: EgressProxy, recorder: Recorder, framing: tuple[str, ...]
) -> None:
    status, headers, _ = await send(
        proxy, req("GET", f"http://api.test:{recorder.port}/health", *framing)
    )
    assert status == 400 and headers["x-egress-reason"] == "BadRequest"
    assert recorder.received == []


async def test_an_upgrade_gets_the_rules_verdict_and_is_never_forwarded(
    proxy: EgressProxy, recorder: Recorder, records: list[Decision]
) -> None:
    upgrade = ("Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13")
    status, headers, _ = await send(
        proxy, req("GET", f"http://api.test:{recorder.port}/admin", *upgrade)
    )
    assert status == 403 and headers["x-egress-reason"] == "PathNotAllowed"
    status, _, _ = await send(proxy, req("GET", f"http://api.test:{recorder.port}/v1/ws", *upgrade))
    assert status == 200
    assert b"upgrade" not in recorder.seen.lower()
    h2c = ("Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAAQ")
    await send(proxy, req("GET", f"http://api.test:{recorder.port}/health", *h2c))
    assert b"h2c" not in recorder.seen.lower() and b"http2-settings" not in recorder.seen.lower()


async def test_http2_prior_knowledge_is_refused(proxy: EgressProxy, recorder: Recorder) -> None:
    status, headers, _ = await send(proxy, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    assert status == 400 and headers["x-egress-reason"] == "BadRequest"
    assert recorder.received == []


async def test_a_tunnel_to_a_ruled_host_is_refused_before_anything_is_resolved(
    proxy: EgressProxy, recorder: Recorder, records: list[Decision]
) -> None:
    reader, writer = await open_from("127.0.0.1", proxy.port, SB)
    writer.write(f"CONNECT api.test:{recorder.port} HTTP/1.1\r\nHost: api.test\r\n\r\n".encode())
    status, headers = await read_reply_head(reader)
    writer.close()
    assert status == 403 and headers["x-egress-reason"] == "TunnelNotInspectable"
    assert last(records).reason is DecisionReason.NOT_INSPECTABLE and last(records).address is None
    assert recorder.received == []


async def test_a_plain_host_keeps_its_tunnel_and_a_wildcard_does_not_widen_a_rule(
    recorder: Recorder,
) -> None:
    # other.test is a plain entry: CONNECT still tunnels. A plain "*.test" beside a rule for
    # api.test does not let api.test through for what the rule refuses.
    sandbox = SandboxEgress(
        id="ns/a",
        allow=("*.test",),
        rules=[{"host": "api.test", "methods": ["GET"]}],  # type: ignore[list-item]
        sourceIPs=(ipaddress.ip_address(SB),),  # type: ignore[call-arg]
    )
    config = ProxyConfig.model_validate(
        {
            "listenHost": "127.0.0.1",
            "listenPort": 0,
            "allowedPorts": [recorder.port],
            "admittedNetworks": ["127.0.0.1/32"],
            "sandboxes": [sandbox],
        }
    )
    async with EgressProxy(config, resolver=RESOLVER) as p:
        reply = await proxy_request(
            p.port, f"CONNECT other.test:{recorder.port} HTTP/1.1\r\n\r\n".encode(), source=SB
        )
        assert reply.status == 200
        reply.close()
        reply = await proxy_request(
            p.port, req("POST", f"http://api.test:{recorder.port}/x"), source=SB
        )
        assert reply.status == 403 and reply.headers["x-egress-reason"] == "MethodNotAllowed"
        reply = await proxy_request(
            p.port, f"CONNECT api.test:{recorder.port} HTTP/1.1\r\n\r\n".encode(), source=SB
        )
        assert reply.status == 403 and reply.headers["x-egress-reason"] == "TunnelNotInspectable"


def test_a_rule_the_proxy_config_cannot_hold_is_refused() -> None:
    for bad in (
        {"host": "api.test", "methods": ["get"]},
        {"host": "api.test", "paths": ["/a/../b"]},
        {"host": "api.test:8080", "methods": ["GET"]},
    ):
        with pytest.raises(ValueError):
            SandboxEgress(
                id="ns/a",
                rules=[bad],  # type: ignore[list-item]
                sourceIPs=(ipaddress.ip_address(SB),),  # type: ignore[call-arg]
            )
