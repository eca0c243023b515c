"""Pure parts of the egress proxy: host patterns, address policy, config, parsing, identity."""

from __future__ import annotations

import base64
import ipaddress

import pytest
from pydantic import ValidationError

from sandbox_operator.egress import (
    AddressPolicy,
    DecisionReason,
    HostPattern,
    IdentityConflict,
    IdentityMode,
    InvalidHost,
    ProxyConfig,
    RateLimiter,
    SandboxEgress,
    SandboxTable,
    normalize_host,
    token_digest,
)
from sandbox_operator.egress.http import BadRequest, parse_head, request_target, upstream_head
from sandbox_operator.egress.identity import token_from_proxy_authorization
from tests.fixtures.wire_keys import model_keys, typed_keys

PORTS = (80, 443)


# ---- host names and patterns ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("Example.COM", "example.com"),
        ("example.com.", "example.com"),
        ("[2001:DB8::1]", "2001:db8::1"),
        ("192.0.2.7", "192.0.2.7"),
        ("_srv.example.com", "_srv.example.com"),
    ],
)
def test_normalize_host(raw: str, norm: str) -> None:
    assert normalize_host(raw) == norm


@pytest.mark.parametrize(
    "raw", ["", "a..b", "-a.com", "a b.com", "exa*mple.com", "x" * 64 + ".com", "1.2.3", "[::1"]
)
def test_normalize_host_rejects(raw: str) -> None:
    with pytest.raises(InvalidHost):
        normalize_host(raw)


def test_exact_pattern_matches_only_itself() -> None:
    p = HostPattern.parse("PyPI.org")
    assert p.matches("pypi.org", 443, PORTS)
    assert not p.matches("files.pypi.org", 443, PORTS)
    assert not p.matches("pypi.org.evil.test", 443, PORTS)
    assert not p.matches("evilpypi.org", 443, PORTS)


def test_wildcard_matches_subdomains_not_apex() -> None:
    p = HostPattern.parse("*.example.com")
    assert p.matches("a.example.com", 443, PORTS)
    assert p.matches("a.b.example.com", 80, PORTS)
    assert not p.matches("example.com", 443, PORTS)
    assert not p.matches("badexample.com", 443, PORTS)
    assert not p.matches("a.example.com.evil.test", 443, PORTS)


def test_pattern_ports() -> None:
    assert not HostPattern.parse("example.com").matches("example.com", 8443, PORTS)
    fixed = HostPattern.parse("example.com:8443")
    assert fixed.matches("example.com", 8443, PORTS)
    assert not fixed.matches("example.com", 443, PORTS)
    assert str(HostPattern.parse("*.Example.com:8443")) == "*.example.com:8443"
    assert str(HostPattern.parse("[2001:db8::1]:443")) == "[2001:db8::1]:443"


@pytest.mark.parametrize("raw", ["*", "*.", "a.*.com", "*example.com", "*.192.0.2.7", "x:99999"])
def test_bad_patterns(raw: str) -> None:
    with pytest.raises(InvalidHost):
        HostPattern.parse(raw)


# ---- addresses -----------------------------------------------------------------------------


def _policy(admitted: tuple[str, ...] = ()) -> AddressPolicy:
    cfg = ProxyConfig(admittedNetworks=admitted)  # type: ignore[call-arg]
    return AddressPolicy(cfg.refused_networks, cfg.admitted_networks, cfg.metadata_networks)


@pytest.mark.parametrize(
    "addr",
    [
        "127.0.0.1", "127.9.9.9", "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1",
        "100.64.0.1", "100.127.255.254", "169.254.1.1", "169.254.169.254", "0.0.0.0",
        "224.0.0.1", "239.255.255.250", "255.255.255.255", "198.18.0.1", "::", "::1",
        "fe80::1", "fd00:ec2::254", "fc00::1", "ff02::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
        "64:ff9b::a00:1", "2002:a00:1::1", "2001:db8::1",
    ],
)  # fmt: skip
def test_default_policy_refuses_internal(addr: str) -> None:
    assert _policy().check(ipaddress.ip_address(addr)).refused


@pytest.mark.parametrize("addr", ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "100.128.0.1"])
def test_default_policy_admits_public(addr: str) -> None:
    assert not _policy().check(ipaddress.ip_address(addr)).refused


def test_admitted_networks_carve_out_but_metadata_stays_refused() -> None:
    policy = _policy(("127.0.0.0/8", "169.254.0.0/16", "fd00::/8"))
    assert not policy.check(ipaddress.ip_address("127.0.0.1")).refused
    assert not policy.check(ipaddress.ip_address("169.254.1.1")).refused
    for meta in ("169.254.169.254", "fd00:ec2::254"):
        verdict = policy.check(ipaddress.ip_address(meta))
        assert verdict.refused and verdict.metadata
    assert policy.check(ipaddress.ip_address("10.0.0.1")).refused


def test_partition_keeps_only_passing_addresses() -> None:
    policy = _policy(("127.0.0.1/32",))
    ok, refused = policy.partition(
        [ipaddress.ip_address(a) for a in ("10.0.0.1", "127.0.0.1", "127.0.0.2")]
    )
    assert [str(a) for a in ok] == ["127.0.0.1"]
    assert [str(v.address) for v in refused] == ["10.0.0.1", "127.0.0.2"]


# ---- config --------------------------------------------------------------------------------


def test_config_camel_case_and_normalised_patterns() -> None:
    cfg = ProxyConfig.model_validate(
        {
            "listenPort": 0,
            "allowedPorts": [443],
            "sandboxes": [{"id": "ns/a", "sourceIPs": ["10.244.0.5"], "allow": ["PyPI.org."]}],
        }
    )
    assert cfg.sandboxes[0].allow == ("pypi.org",)
    assert cfg.limits.max_header_bytes == 16384


@pytest.mark.parametrize(
    "sandboxes",
    [
        [{"id": "a", "sourceIPs": ["10.0.0.1"]}, {"id": "a", "sourceIPs": ["10.0.0.2"]}],
        [{"id": "a", "sourceIPs": ["10.0.0.1"]}, {"id": "b", "sourceIPs": ["10.0.0.1"]}],
        [{"id": "a"}],  # sourceIP identity without IPs
        [{"id": "a", "sourceIPs": ["10.0.0.1"], "allow": ["*"]}],
        [{"id": "a", "sourceIPs": ["10.0.0.1"], "tokenSHA256": "not-hex"}],
        [{"id": "a", "sourceIPs": ["10.0.0.1"], "unknown": 1}],
    ],
)
def test_config_rejects(sandboxes: list[dict[str, object]]) -> None:
    with pytest.raises(ValidationError):
        ProxyConfig.model_validate({"sandboxes": sandboxes})


def test_token_mode_needs_digest() -> None:
    with pytest.raises(ValidationError):
        ProxyConfig.model_validate({"identity": "token", "sandboxes": [{"id": "a"}]})
    ProxyConfig.model_validate(
        {"identity": "token", "sandboxes": [{"id": "a", "tokenSHA256": token_digest("t")}]}
    )


# ---- request parsing -----------------------------------------------------------------------


def test_parse_connect_default_port() -> None:
    head = parse_head(b"CONNECT Allowed.Test HTTP/1.1\r\nHost: x\r\n\r\n")
    target = request_target(head)
    assert (target.host, target.port) == ("allowed.test", 443)


def test_parse_absolute_form_and_upstream_head() -> None:
    head = parse_head(
        b"GET http://Allowed.Test:8080/p?q=1 HTTP/1.1\r\nHost: evil.test\r\n"
        b"Proxy-Authorization: Basic eDp5\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\n"
        b"Proxy-Connection: keep-alive\r\nAccept: */*\r\nContent-Length: 3\r\n\r\n"
    )
    target = request_target(head)
    assert (target.host, target.port, target.origin_form) == ("allowed.test", 8080, "/p?q=1")
    up = upstream_head(head, target).decode()
    assert up.startswith("GET /p?q=1 HTTP/1.1\r\nHost: allowed.test:8080\r\n")
    low = up.lower()
    for gone in ("proxy-authorization", "x-drop", "proxy-connection", "evil.test", "keep-alive"):
        assert gone not in low
    assert "accept: */*" in low and "content-length: 3" in low
    assert low.endswith("connection: close\r\n\r\n")


@pytest.mark.parametrize(
    "raw",
    [
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",  # origin-form: not a proxy request
        b"GET https://a.test/ HTTP/1.1\r\n\r\n",  # https must use CONNECT
        b"GET http://u:p@a.test/ HTTP/1.1\r\n\r\n",
        b"CONNECT a.test:99999 HTTP/1.1\r\n\r\n",
        b"CONNECT ::1:443 HTTP/1.1\r\n\r\n",
        b"CONNECT a.test:443 HTTP/2.0\r\n\r\n",
        b"CONNECT  a.test:443 HTTP/1.1\r\n\r\n",
        b"CONNECT a.test:443 HTTP/1.1\r\n folded\r\n\r\n",
        b"CONNECT a.test:443 HTTP/1.1\r\nBad Header: x\r\n\r\n",
    ],
)
def test_bad_requests(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        request_target(parse_head(raw))


# ---- identity ------------------------------------------------------------------------------


def _sb(sid: str, ip: str, token: str | None = None, allow: tuple[str, ...] = ()) -> SandboxEgress:
    return SandboxEgress(
        id=sid,
        sourceIPs=(ipaddress.ip_address(ip),),  # type: ignore[call-arg]
        tokenSHA256=token_digest(token) if token else None,
        allow=allow,
    )


def test_proxy_authorization_forms() -> None:
    basic = base64.b64encode(b"sandbox:s3cret").decode()
    assert token_from_proxy_authorization(f"Basic {basic}") == "s3cret"
    assert token_from_proxy_authorization("Bearer s3cret") == "s3cret"
    assert token_from_proxy_authorization("Basic !!!") is None
    assert token_from_proxy_authorization("Digest x") is None
    assert token_from_proxy_authorization(None) is None


def test_identify_modes() -> None:
    table = SandboxTable([_sb("a", "10.0.0.1", "ta"), _sb("b", "10.0.0.2", "tb")])
    ip_a, ip_b = ipaddress.ip_address("10.0.0.1"), ipaddress.ip_address("10.0.0.2")
    got = table.identify(IdentityMode.SOURCE_IP, ip_a, None)
    assert got.entry is not None and got.entry.id == "a"
    mapped = ipaddress.ip_address("::ffff:10.0.0.2")
    got = table.identify(IdentityMode.SOURCE_IP, mapped, None)
    assert got.entry is not None and got.entry.id == "b"
    got = table.identify(IdentityMode.SOURCE_IP, ipaddress.ip_address("10.0.0.9"), None)
    assert got.reason is DecisionReason.UNKNOWN_SANDBOX
    assert table.identify(IdentityMode.TOKEN, None, None).reason is DecisionReason.AUTH_REQUIRED
    got = table.identify(IdentityMode.TOKEN, None, "Bearer tb")
    assert got.reason is DecisionReason.ALLOWED and got.entry is not None and got.entry.id == "b"
    got = table.identify(IdentityMode.SOURCE_IP_AND_TOKEN, ip_a, "Bearer tb")
    assert got.reason is DecisionReason.IDENTITY_MISMATCH
    got = table.identify(IdentityMode.SOURCE_IP_AND_TOKEN, ip_b, "Bearer tb")
    assert got.reason is DecisionReason.ALLOWED


def test_table_conflicts_leave_table_unchanged() -> None:
    table = SandboxTable([_sb("a", "10.0.0.1", allow=("x.test",))])
    with pytest.raises(IdentityConflict) as err:
        table.upsert(_sb("b", "10.0.0.1"))
    assert (err.value.sandbox, err.value.other) == ("b", "a")
    assert table.ids() == ["a"]
    table.upsert(_sb("a", "10.0.0.3", allow=("y.test",)))  # moving a sandbox frees its old IP
    assert table.by_ip(ipaddress.ip_address("10.0.0.1")) is None
    entry = table.by_ip(ipaddress.ip_address("10.0.0.3"))
    assert entry is not None
    assert entry.check("y.test", 443, PORTS) is DecisionReason.ALLOWED
    assert entry.check("y.test", 22, PORTS) is DecisionReason.PORT_NOT_ALLOWED
    assert entry.check("x.test", 443, PORTS) is DecisionReason.HOST_NOT_ALLOWED
    assert table.remove("a") and not table.remove("a")


def test_rate_limiter_bounds_events_per_key() -> None:
    now = [0.0]
    limiter = RateLimiter(rate_per_second=1.0, burst=3, clock=lambda: now[0])
    assert [limiter.allow("sb") for _ in range(5)] == [True, True, True, False, False]
    assert limiter.allow("other")
    assert limiter.suppressed["sb"] == 2
    now[0] += 1.0
    assert limiter.allow("sb") and not limiter.allow("sb")


def test_a_rule_written_as_a_dict_is_typed_with_the_models_keys() -> None:
    """``edit_egress(rules=[{...}])`` takes ``EgressRuleFields``: its keys (and its
    credential's) are exactly the models' wire names, so what mypy accepts is what validates."""
    from sandbox_operator.contract.egressrules import (
        EgressCredential,
        EgressCredentialFields,
        EgressRule,
        EgressRuleFields,
    )

    assert typed_keys(EgressRuleFields) == model_keys(EgressRule)
    assert typed_keys(EgressCredentialFields) == model_keys(EgressCredential)
    rule: EgressRuleFields = {
        "host": "api.example.com",
        "schemes": ["https"],
        "credential": {"secretName": "token", "key": "value"},
    }
    assert EgressRule.model_validate(rule).credential is not None
