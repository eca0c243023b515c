"""HTTPS to a host with method and path rules: TLS terminated at the proxy (#38 item 1), over real
loopback sockets.

The guest trusts only the proxy's CA; the upstream has its own certificate, which the proxy
verifies. The upstream records every byte it decrypts, so each bypass attempt inside the tunnel
(another case of a verb, dot segments, percent-encoded dots, a second request on the kept-alive
connection or to another Host, an Upgrade, HTTP/2 by ALPN or preface) is shown to reach nothing
it should not, and each refusal to be a decision with its reason.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
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
    Verdict,
)
from sandbox_operator.egress.interception import InterceptionCA
from sandbox_operator.testing.egress import (
    SelfSignedCert,
    open_from,
    read_reply_head,
)
from tests.fixtures.egress_tls import (
    RESOLVER,
    SB,
    TLSRecorder,
    guest_context,
    https,
    proxy_config,
    req,
    tunnel,
)

RULES = [
    {"host": "api.test", "schemes": ["https"], "methods": ["GET"], "paths": ["/v1/*"]},
    {"host": "http-only.test", "schemes": ["http"], "methods": ["GET"]},
]


def make_proxy(
    recorder: TLSRecorder,
    records: list[Decision],
    ca: InterceptionCA | None,
    rules: list[dict[str, object]] = RULES,
) -> EgressProxy:
    sandbox = SandboxEgress(
        id="ns/a",
        allow=("plain.test",),
        rules=rules,  # type: ignore[arg-type]
        sourceIPs=(ipaddress.ip_address(SB),),  # type: ignore[call-arg]
    )
    config = ProxyConfig.model_validate(proxy_config(recorder.port, sandbox))
    return EgressProxy(
        config, sink=CallbackSink(records.append), resolver=RESOLVER, interception=ca
    )


@pytest.fixture
async def proxy(
    recorder: TLSRecorder, records: list[Decision], ca: InterceptionCA
) -> AsyncIterator[EgressProxy]:
    p = make_proxy(recorder, records, ca)
    await p.start()
    yield p
    await p.stop()


# ---- the CA ----------------------------------------------------------------------------------


def test_the_ca_gives_out_its_certificate_only_and_caches_leaves(tmp_path: Path) -> None:
    ca = InterceptionCA()
    assert b"PRIVATE KEY" not in ca.cert_pem and b"BEGIN CERTIFICATE" in ca.cert_pem
    first = ca.server_context("api.test")
    assert ca.server_context("api.test") is first
    assert ca.server_context("other.test") is not first
    assert first.minimum_version >= ssl.TLSVersion.TLSv1_2
    up = ca.upstream_context()
    assert up.verify_mode is ssl.CERT_REQUIRED and up.check_hostname
    ca.close()


# ---- through the proxy -----------------------------------------------------------------------


async def test_an_allowed_https_request_is_judged_and_sent_on_verified(
    proxy: EgressProxy, recorder: TLSRecorder, records: list[Decision], ca: InterceptionCA
) -> None:
    status, _, body = await https(
        proxy, ca, recorder.port, req("GET", "/v1/models", f"api.test:{recorder.port}")
    )
    assert (status, body) == (200, b"ok")
    assert recorder.seen.startswith(b"GET /v1/models HTTP/1.1\r\n")
    assert f"Host: api.test:{recorder.port}".encode() in recorder.seen
    assert b"Connection: close" in recorder.seen
    decision = records[-1]
    assert decision.verdict is Verdict.ALLOW and decision.method == "GET"
    assert decision.host == "api.test" and decision.address == "127.0.0.1"


@pytest.mark.parametrize(
    ("method", "path", "reason"),
    [
        ("POST", "/v1/x", DecisionReason.METHOD_NOT_ALLOWED),
        ("post", "/v1/x", DecisionReason.METHOD_NOT_ALLOWED),
        ("Post", "/v1/x", DecisionReason.METHOD_NOT_ALLOWED),
        ("GET", "/admin", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "/v1/../admin", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "/v1/%2e%2e/admin", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "/v1/%2E%2E/admin", DecisionReason.PATH_NOT_ALLOWED),
        ("GET", "/v1/..%2Fadmin", DecisionReason.PATH_NOT_ALLOWED),
    ],
)
async def test_a_forbidden_https_request_is_refused_inside_the_tunnel_and_reaches_nothing(
    proxy: EgressProxy,
    recorder: TLSRecorder,
    records: list[Decision],
    ca: InterceptionCA,
    method: str,
    path: str,
    reason: DecisionReason,
) -> None:
    status, headers, body = await https(
        proxy, ca, recorder.port, req(method, path, f"api.test:{recorder.port}")
    )
    assert status == 403 and headers["x-egress-reason"] == str(reason)
    assert path.encode() not in body
    assert recorder.received == []
    assert records[-1].reason is reason and records[-1].method == method.upper()


async def test_a_lower_case_allowed_verb_goes_upstream_in_its_canonical_case(
    proxy: EgressProxy, recorder: TLSRecorder, ca: InterceptionCA
) -> None:
    status, _, _ = await https(
        proxy, ca, recorder.port, req("get", "/v1/x", f"api.test:{recorder.port}")
    )
    assert status == 200
    assert recorder.seen.startswith(b"GET /v1/x HTTP/1.1\r\n")


async def test_a_second_request_on_the_kept_alive_connection_never_reaches_the_upstream(
    proxy: EgressProxy, recorder: TLSRecorder, ca: InterceptionCA
) -> None:
    here = f"api.test:{recorder.port}"
    first = req("GET", "/v1/x", here, "Connection: keep-alive")
    second = req("POST", "/admin", here, "Content-Length: 0")
    third = req("GET", "/v1/x", "other.test")
    status, _, _ = await https(proxy, ca, recorder.port, first + second + third)
    assert status == 200
    assert b"POST" not in recorder.seen and b"other.test" not in recorder.seen
    assert recorder.seen.count(b"GET ") == 1


@pytest.mark.parametrize(
    "hosts",
    [
        ("Host: other.test",),
        ("Host: api.test:1",),
        ("Host: api.test", "Host: other.test"),
        (),
    ],
)
async def test_a_request_naming_another_host_than_the_tunnel_is_refused(
    proxy: EgressProxy,
    recorder: TLSRecorder,
    records: list[Decision],
    ca: InterceptionCA,
    hosts: tuple[str, ...],
) -> None:
    raw = ("\r\n".join(["GET /v1/x HTTP/1.1", *hosts]) + "\r\n\r\n").encode()
    status, headers, _ = await https(proxy, ca, recorder.port, raw)
    assert status == 403 and headers["x-egress-reason"] == "HostMismatch"
    assert recorder.received == []
    assert records[-1].reason is DecisionReason.HOST_MISMATCH


async def test_http2_is_never_negotiated_and_its_preface_is_refused(
    proxy: EgressProxy, recorder: TLSRecorder, ca: InterceptionCA
) -> None:
    status, _, t = await tunnel(proxy, "api.test", recorder.port, guest_context(ca, ["h2"]))
    assert status == 200
    assert t.writer.get_extra_info("ssl_object").selected_alpn_protocol() is None
    status, headers, _ = await t.exchange(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    assert status == 400 and headers["x-egress-reason"] == "BadRequest"
    status, _, t = await tunnel(
        proxy, "api.test", recorder.port, guest_context(ca, ["h2", "http/1.1"])
    )
    assert t.writer.get_extra_info("ssl_object").selected_alpn_protocol() == "http/1.1"
    t.writer.close()
    assert recorder.received == []


async def test_an_upgrade_gets_the_rules_verdict_and_is_never_forwarded(
    proxy: EgressProxy, recorder: TLSRecorder, ca: InterceptionCA
) -> None:
    upgrade = ("Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13")
    status, headers, _ = await https(
        proxy, ca, recorder.port, req("GET", "/admin", f"api.test:{recorder.port}", *upgrade)
    )
    assert status == 403 and headers["x-egress-reason"] == "PathNotAllowed"
    status, _, _ = await https(
        proxy, ca, recorder.port, req("GET", "/v1/ws", f"api.test:{recorder.port}", *upgrade)
    )
    assert status == 200
    assert b"upgrade" not in recorder.seen.lower()


async def test_a_host_outside_the_allowlist_is_refused_before_any_tls(
    proxy: EgressProxy, recorder: TLSRecorder, records: list[Decision], ca: InterceptionCA
) -> None:
    status, headers, t = await tunnel(proxy, "other.test", recorder.port, None)
    t.writer.close()
    assert status == 403 and headers["x-egress-reason"] == "HostNotAllowed"
    assert records[-1].method == "CONNECT"


async def test_a_plain_host_keeps_its_tunnel_without_interception(
    proxy: EgressProxy, recorder: TLSRecorder, upstream_cert: SelfSignedCert
) -> None:
    # The guest sees the upstream's own certificate: the proxy is not in the TLS.
    status, _, t = await tunnel(proxy, "plain.test", recorder.port, upstream_cert.client_context())
    assert status == 200
    status, _, body = await t.exchange(req("DELETE", "/anything", "plain.test"))
    assert (status, body) == (200, b"ok")


async def test_an_upstream_whose_certificate_does_not_verify_is_unreachable(
    recorder: TLSRecorder, records: list[Decision]
) -> None:
    ca = InterceptionCA()  # the system's roots only: the upstream's self-signed cert fails
    async with make_proxy(recorder, records, ca) as p:
        status, headers, _ = await https(
            p, ca, recorder.port, req("GET", "/v1/x", f"api.test:{recorder.port}")
        )
    assert status == 502 and headers["x-egress-reason"] == "UpstreamTLSFailed"
    assert records[-1].verdict is Verdict.UNREACHABLE


async def test_a_guest_that_does_not_trust_the_proxy_ca_gets_nothing(
    proxy: EgressProxy, recorder: TLSRecorder, records: list[Decision]
) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        await tunnel(proxy, "api.test", recorder.port, ssl.create_default_context())
    for _ in range(50):
        if records and records[-1].reason is DecisionReason.CLIENT_TLS_FAILED:
            break
        await asyncio.sleep(0.05)
    assert records[-1].reason is DecisionReason.CLIENT_TLS_FAILED
    assert recorder.received == []


async def test_rules_are_kept_to_their_schemes(
    proxy: EgressProxy, recorder: TLSRecorder, records: list[Decision], ca: InterceptionCA
) -> None:
    # api.test's rule names https only: a plain request to it is refused.
    reader, writer = await open_from("127.0.0.1", proxy.port, SB)
    writer.write(req("GET", f"http://api.test:{recorder.port}/v1/x", "api.test"))
    status, headers = await read_reply_head(reader)
    writer.close()
    assert status == 403 and headers["x-egress-reason"] == "SchemeNotAllowed"
    # http-only.test's rule names http only: a tunnel to it is not opened.
    status, headers, t = await tunnel(proxy, "http-only.test", recorder.port, None)
    t.writer.close()
    assert status == 403 and headers["x-egress-reason"] == "TunnelNotInspectable"


async def test_without_a_ca_a_tunnel_to_an_https_ruled_host_is_refused(
    recorder: TLSRecorder, records: list[Decision]
) -> None:
    async with make_proxy(recorder, records, None) as p:
        status, headers, t = await tunnel(p, "api.test", recorder.port, None)
        t.writer.close()
    assert status == 403 and headers["x-egress-reason"] == "TunnelNotInspectable"
