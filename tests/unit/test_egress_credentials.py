"""Credentials at the egress hop (#38 item 3), over real loopback sockets: the proxy terminates
the guest's TLS, judges the request by its rule and, only then, attaches the rule's credential
(a Secret's value) as a header, replacing any header of that name the guest sent. A credential
that cannot be attached (no Secret, no key, expired, unreadable, not a header value) is a refused
request with its reason, never a request sent without it; and the value shows up nowhere the
guest or an observer can read: not in a response, a decision record or a log line.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

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
from sandbox_operator.egress.credentials import (
    EXPIRES_ANNOTATION,
    CredentialRef,
    CredentialSource,
    CredentialUnavailable,
    NoCredentials,
    SecretCredentials,
    StaticCredentials,
)
from sandbox_operator.egress.interception import InterceptionCA
from sandbox_operator.egress.requestrules import credential_for, rules_for
from tests.fixtures.egress_tls import RESOLVER, SB, TLSRecorder, https, proxy_config, req

TOKEN = "tok-3f9a1c7e5b2d4a6c8e0f"
NS = "ns"
CREDENTIAL = {"secretName": "api-token", "key": "token"}
RULES: list[dict[str, Any]] = [
    {
        "host": "api.test",
        "schemes": ["https"],
        "methods": ["GET"],
        "paths": ["/v1/*"],
        "credential": CREDENTIAL,
    },
    {"host": "other.test", "schemes": ["https"], "methods": ["GET"]},
]


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def secrets(value: str = TOKEN, key: str = "token") -> StaticCredentials:
    return StaticCredentials({(NS, "api-token"): {key: b64(value)}})


def make_proxy(
    recorder: TLSRecorder,
    records: list[Decision],
    ca: InterceptionCA,
    credentials: CredentialSource | None,
    rules: list[dict[str, Any]] = RULES,
) -> EgressProxy:
    sandbox = SandboxEgress.model_validate({"id": f"{NS}/a", "rules": rules, "sourceIPs": [SB]})
    config = ProxyConfig.model_validate(proxy_config(recorder.port, sandbox))
    return EgressProxy(
        config,
        sink=CallbackSink(records.append),
        resolver=RESOLVER,
        interception=ca,
        credentials=credentials,
    )


async def get(
    proxy: EgressProxy, ca: InterceptionCA, recorder: TLSRecorder, *extra: str, **kw: str
) -> tuple[int, dict[str, str], bytes]:
    method, path, host = kw.get("method", "GET"), kw.get("path", "/v1/models"), kw.get("host")
    host = host or "api.test"
    return await https(
        proxy, ca, recorder.port, req(method, path, f"{host}:{recorder.port}", *extra), host=host
    )


def header_lines(seen: bytes, name: str) -> list[str]:
    head = seen.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    return [line for line in head.split("\r\n")[1:] if line.lower().startswith(name.lower() + ":")]


async def test_the_rules_credential_arrives_upstream_as_a_bearer_header(
    recorder: TLSRecorder, records: list[Decision], ca: InterceptionCA
) -> None:
    async with make_proxy(recorder, records, ca, secrets()) as proxy:
        status, headers, body = await get(proxy, ca, recorder)
    assert (status, body) == (200, b"ok")
    assert header_lines(recorder.seen, "Authorization") == [f"Authorization: Bearer {TOKEN}"]
    assert TOKEN not in json.dumps(headers) + body.decode()
    assert records[-1].verdict is Verdict.ALLOW and records[-1].method == "GET"


@pytest.mark.parametrize(
    "sent",
    [
        "Authorization: Bearer guest-made",
        "authorization: Basic Z3Vlc3Q6eA==",
        "AUTHORIZATION: x",
    ],
)
async def test_a_guest_sent_header_of_that_name_is_replaced_not_merged(
    recorder: TLSRecorder, records: list[Decision], ca: InterceptionCA, sent: str
) -> None:
    async with make_proxy(recorder, records, ca, secrets()) as proxy:
        status, _, _ = await get(proxy, ca, recorder, sent, "Authorization: Bearer second")
    assert status == 200
    assert header_lines(recorder.seen, "Authorization") == [f"Authorization: Bearer {TOKEN}"]
    assert b"guest" not in recorder.seen and b"second" not in recorder.seen


async def test_a_secret_made_from_a_file_loses_its_trailing_line_end_only(
    recorder: TLSRecorder, records: list[Decision], ca: InterceptionCA
) -> None:
    async with make_proxy(recorder, records, ca, secrets(value=TOKEN + "\n")) as proxy:
        status, _, _ = await get(proxy, ca, recorder)
    assert status == 200
    assert header_lines(recorder.seen, "Authorization") == [f"Authorization: Bearer {TOKEN}"]


async def test_a_credential_fills_the_header_and_prefix_its_rule_names(
    recorder: TLSRecorder, records: list[Decision], ca: InterceptionCA
) -> None:
    credential = {**CREDENTIAL, "header": "X-Api-Key", "prefix": ""}
    rules = [{**RULES[0], "credential": credential}]
    async with make_proxy(recorder, records, ca, secrets(), rules) as proxy:
        status, _, _ = await get(proxy, ca, recorder, "x-api-key: mine")
    assert status == 200
    assert header_lines(recorder.seen, "X-Api-Key") == [f"X-Api-Key: {TOKEN}"]
    assert header_lines(recorder.seen, "Authorization") == []


async def test_only_the_origin_whose_rule_names_it_gets_the_credential(
    recorder: TLSRecorder, records: list[Decision], ca: InterceptionCA
) -> None:
    async with make_proxy(recorder, records, ca, secrets()) as proxy:
        status, _, _ = await get(
            proxy, ca, recorder, "Authorization: Bearer own", host="other.test"
        )
    assert status == 200
    assert header_lines(recorder.seen, "Authorization") == ["Authorization: Bearer own"]
    assert TOKEN.encode() not in recorder.seen


async def test_a_request_the_rule_refuses_never_reads_nor_sends_the_credential(
    recorder: TLSRecorder, records: list[Decision], ca: InterceptionCA
) -> None:
    class Counting(StaticCredentials):
        calls = 0

        async def value(self, namespace: str, ref: CredentialRef) -> str:
            Counting.calls += 1
            return await super().value(namespace, ref)

    source = Counting({(NS, "api-token"): {"token": b64(TOKEN)}})
    async with make_proxy(recorder, records, ca, source) as proxy:
        status, headers, _ = await get(proxy, ca, recorder, method="POST")
    assert status == 403 and headers["x-egress-reason"] == "MethodNotAllowed"
    assert recorder.received == [] and Counting.calls == 0


def test_a_credential_goes_only_with_requests_its_own_rule_admits() -> None:
    # Another rule covering the host (a wildcard) may admit more; the credential does not follow.
    entry = SandboxEgress.model_validate(
        {
            "id": "ns/a",
            "sourceIPs": [SB],
            "rules": [
                RULES[0],
                {"host": "*.test", "schemes": ["https"], "methods": ["GET", "POST"]},
            ],
        }
    )
    rules = rules_for(entry.request_rules(), "api.test")
    assert len(rules) == 2
    assert credential_for(rules, "GET", "/v1/x?q=1") == CredentialRef("api-token", "token")
    assert credential_for(rules, "POST", "/v1/x") is None
    assert credential_for(rules, "GET", "/v2/x") is None


EXPIRED = datetime.now(UTC) - timedelta(seconds=1)


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        (StaticCredentials({}), DecisionReason.CREDENTIAL_MISSING),
        (secrets(key="other"), DecisionReason.CREDENTIAL_MISSING),
        (
            StaticCredentials(
                {(NS, "api-token"): {"token": b64(TOKEN)}}, {(NS, "api-token"): EXPIRED}
            ),
            DecisionReason.CREDENTIAL_EXPIRED,
        ),
        (secrets(value=TOKEN + "\r\nX-Injected: 1"), DecisionReason.CREDENTIAL_UNUSABLE),
        (
            StaticCredentials({(NS, "api-token"): {"token": "%%%"}}),
            DecisionReason.CREDENTIAL_UNUSABLE,
        ),
        (NoCredentials(), DecisionReason.CREDENTIAL_UNREADABLE),
        (None, DecisionReason.CREDENTIAL_UNREADABLE),
    ],
)
async def test_a_credential_that_cannot_be_attached_fails_closed(
    recorder: TLSRecorder,
    records: list[Decision],
    ca: InterceptionCA,
    source: CredentialSource | None,
    reason: DecisionReason,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with make_proxy(recorder, records, ca, source) as proxy:
        status, headers, body = await get(proxy, ca, recorder)
    assert status == 403 and headers["x-egress-reason"] == str(reason)
    assert recorder.received == []  # nothing went upstream, with or without the header
    assert records[-1].reason is reason and records[-1].verdict is Verdict.DENY
    assert records[-1].host == "api.test" and records[-1].method == "GET"
    shown = body.decode() + json.dumps(headers) + caplog.text
    shown += "".join(json.dumps(d.as_dict()) + d.summary() for d in records)
    assert TOKEN not in shown and b64(TOKEN) not in shown


async def test_the_value_is_in_no_record_log_or_answer_of_an_allowed_request(
    recorder: TLSRecorder,
    records: list[Decision],
    ca: InterceptionCA,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with make_proxy(recorder, records, ca, secrets()) as proxy:
        for path in ("/v1/a", "/v1/b"):
            status, headers, body = await get(proxy, ca, recorder, path=path)
            assert status == 200
            assert TOKEN not in body.decode() + json.dumps(headers)
    assert recorder.seen.count(TOKEN.encode()) == 2
    shown = caplog.text + "".join(json.dumps(d.as_dict()) + d.summary() for d in records)
    assert TOKEN not in shown and b64(TOKEN) not in shown


# ---- reading Secrets: on demand, cached briefly, never listed --------------------------------


class FakeSecrets:
    """``read_namespaced_secret`` over a dict, counting calls (a Kubernetes stand-in for a
    collaborator: the proxy's own API calls are covered on the cluster)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], Any] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail: Exception | None = None

    def put(self, name: str, data: dict[str, str], expires: str | None = None) -> None:
        meta = type("Meta", (), {"annotations": {EXPIRES_ANNOTATION: expires} if expires else None})
        self.objects[(NS, name)] = type("Secret", (), {"metadata": meta, "data": data})

    async def read(self, name: str, namespace: str) -> Any:
        self.calls.append((namespace, name))
        if self.fail is not None:
            raise self.fail
        try:
            return self.objects[(namespace, name)]
        except KeyError:
            raise ApiError(404) from None


class ApiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"({status}) reason: {TOKEN}")  # what a server could echo: never shown
        self.status = status


REF = CredentialRef("api-token", "token")


async def test_secrets_are_read_on_demand_and_cached_for_a_few_seconds() -> None:
    api, now = FakeSecrets(), [0.0]
    source = SecretCredentials(api.read, clock=lambda: now[0])
    api.put("api-token", {"token": b64(TOKEN)})
    assert await source.value(NS, REF) == TOKEN
    assert await source.value(NS, REF) == TOKEN
    assert api.calls == [(NS, "api-token")]
    api.put("api-token", {"token": b64("rotated")})
    now[0] = 5.0
    assert await source.value(NS, REF) == "rotated"
    assert len(api.calls) == 2


async def test_a_missing_secret_is_remembered_briefly_then_read_again() -> None:
    api, now = FakeSecrets(), [0.0]
    source = SecretCredentials(api.read, clock=lambda: now[0])
    for _ in range(3):
        with pytest.raises(CredentialUnavailable) as exc:
            await source.value(NS, REF)
        assert exc.value.reason is DecisionReason.CREDENTIAL_MISSING
    assert len(api.calls) == 1
    api.put("api-token", {"token": b64(TOKEN)})
    now[0] = 2.0
    assert await source.value(NS, REF) == TOKEN


async def test_an_expiry_passing_while_cached_refuses_without_a_read() -> None:
    api, wall = FakeSecrets(), [datetime(2030, 1, 1, tzinfo=UTC)]
    source = SecretCredentials(api.read, clock=lambda: 0.0, now=lambda: wall[0])
    api.put("api-token", {"token": b64(TOKEN)}, expires="2030-01-01T00:00:30Z")
    assert await source.value(NS, REF) == TOKEN
    wall[0] += timedelta(seconds=30)
    with pytest.raises(CredentialUnavailable) as exc:
        await source.value(NS, REF)
    assert exc.value.reason is DecisionReason.CREDENTIAL_EXPIRED and len(api.calls) == 1
    api.put("api-token", {"token": b64(TOKEN)}, expires="not a time")
    fresh = SecretCredentials(api.read, now=lambda: wall[0])
    with pytest.raises(CredentialUnavailable) as exc:
        await fresh.value(NS, REF)
    assert exc.value.reason is DecisionReason.CREDENTIAL_EXPIRED


async def test_a_secret_the_proxy_may_not_read_is_unreadable_and_its_answer_untold() -> None:
    api = FakeSecrets()
    api.fail = ApiError(403)
    with pytest.raises(CredentialUnavailable) as exc:
        await SecretCredentials(api.read).value(NS, REF)
    assert exc.value.reason is DecisionReason.CREDENTIAL_UNREADABLE
    assert "403" in exc.value.why and TOKEN not in str(exc.value)


def test_the_proxy_table_keeps_the_reference_admission_judged() -> None:
    entry = SandboxEgress.model_validate({"id": "ns/a", "sourceIPs": [SB], "rules": [RULES[0]]})
    (rule,) = entry.request_rules()
    assert rule.credential == CredentialRef("api-token", "token", "Authorization", "Bearer ")
    with pytest.raises(ValueError, match="schemes"):
        SandboxEgress.model_validate(
            {"id": "ns/a", "sourceIPs": [SB], "rules": [{**RULES[0], "schemes": ["http"]}]}
        )
    assert ipaddress.ip_address(SB) in entry.source_ips
