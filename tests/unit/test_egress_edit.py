"""Egress edits on a live Sandbox (docs/egress.md, "Editing egress on a live Sandbox"), without a
cluster: the operator's judgement of an edit and what it writes (reconcile/egress_edit.py over
policy.check_egress), the proxy re-admitting with the egress generation and closing the open
connections a narrowing no longer allows (over loopback sockets), and the client's reading of
where an edit stands."""

from __future__ import annotations

import asyncio
import ipaddress
from datetime import UTC, datetime
from typing import Any

import pytest

from sandbox_operator.client.egressedits import edit_state
from sandbox_operator.contract import (
    BackendDeclarations,
    ConditionReason,
    Egress,
    EgressNotEnforced,
    SandboxResourceSpec,
    SandboxResourceStatus,
    SandboxSpec,
)
from sandbox_operator.egress import EgressProxy, ProxyConfig, SandboxEgress, StaticResolver
from sandbox_operator.egress.summaries import EgressSummaries
from sandbox_operator.policy import BackendProfile, check_egress
from sandbox_operator.reconcile.egress_edit import egress_edit
from sandbox_operator.testing.egress import (
    connect_through,
    get_through,
    start_echo_server,
    start_http_server,
)
from sandbox_operator.views import SandboxStatusView, SandboxView

NOW = datetime(2099, 1, 1, 12, 0, 0, tzinfo=UTC)
RULE = {"host": "api.example.com", "schemes": ["http"], "methods": ["GET"]}
HTTPS_RULE = {"host": "api.example.com", "schemes": ["https"], "methods": ["GET"]}


def spec(allow: tuple[str, ...] = ("pypi.org",), rules: tuple[dict[str, Any], ...] = ()) -> Any:
    data: dict[str, Any] = {
        "scopeRef": "conv",
        "agentDir": "agents/a",
        "kind": "shell",
        "image": "busybox",
        "egress": "allowlist",
        "egressAllow": list(allow),
    }
    if rules:
        data["egressRules"] = list(rules)
    return SandboxResourceSpec.model_validate(data)


def backend(*, rules: bool = True, https: bool = False) -> BackendProfile:
    declared = BackendDeclarations(
        egress_modes=frozenset({Egress.CLOSED, Egress.ALLOWLIST}),
        egress_rules=rules,
        egress_rules_https=https,
    )
    return BackendProfile(name="runc", isolation="container", declarations=declared)


def judge(
    s: Any,
    status: dict[str, Any],
    *,
    generation: int = 2,
    profile: BackendProfile | None = None,
    gone: bool = False,
    follows: bool = True,
    admitted: dict[str, Any] | None = None,
) -> Any:
    return egress_edit(
        s,
        SandboxStatusView(status),
        admitted or {},
        generation=generation,
        backend=None if gone else (profile or backend()),
        follows_edits=follows,
        allow_unrestricted=False,
        now=NOW,
    )


ENFORCED = {
    "admittedEgressAllow": ["pypi.org"],
    "egressPolicy": {"generation": 1, "appliedAt": "2099-01-01T11:00:00Z"},
}


# ---- the policy's egress check, alone ------------------------------------------------------


def test_check_egress_is_the_admissions_egress_step_alone() -> None:
    ruled = spec(rules=(RULE,)).sandbox_spec()
    check_egress(backend(), ruled, allow_unrestricted=False)
    with pytest.raises(EgressNotEnforced) as refused:
        check_egress(backend(rules=False), ruled, allow_unrestricted=False)
    assert refused.value.rules
    with pytest.raises(EgressNotEnforced) as refused:
        check_egress(backend(), spec(rules=(HTTPS_RULE,)).sandbox_spec(), allow_unrestricted=False)
    assert refused.value.rules_https
    unrestricted = SandboxSpec(kind="shell", image="busybox", egress=Egress.UNRESTRICTED)
    with pytest.raises(EgressNotEnforced) as refused:
        check_egress(backend(), unrestricted, allow_unrestricted=False)
    assert refused.value.host_forbids


# ---- the operator's judgement of an edit ----------------------------------------------------


def test_an_unchanged_allowlist_writes_nothing() -> None:
    assert not judge(spec(), ENFORCED).fields
    # Order alone is no edit.
    two = {**ENFORCED, "admittedEgressAllow": ["b.example.com", "pypi.org"]}
    assert not judge(spec(("pypi.org", "b.example.com")), two).fields


def test_a_widening_is_admitted_with_its_generation_and_an_event() -> None:
    edit = judge(spec(("pypi.org", "files.example.com"), (RULE,)), ENFORCED, generation=3)
    assert edit.fields["admittedEgressAllow"] == ["pypi.org", "files.example.com"]
    assert edit.fields["admittedEgressRules"] == [
        {"host": "api.example.com", "schemes": ["http"], "methods": ["GET"]}
    ]
    assert edit.fields["egressPolicy"] == {"generation": 3, "appliedAt": "2099-01-01T12:00:00Z"}
    assert edit.fields["egressEditRefused"] is None
    [(type_, reason, message)] = edit.events
    assert (type_, reason) == ("Normal", ConditionReason.EGRESS_EDITED)
    assert "generation 3" in message and "files.example.com" in message
    # What it writes is a valid status.
    SandboxResourceStatus.model_validate({k: v for k, v in edit.fields.items() if v is not None})


def test_a_narrowing_removes_the_rules_and_hosts_it_drops() -> None:
    ruled = {**ENFORCED, "admittedEgressRules": [RULE]}
    edit = judge(spec(("pypi.org",)), ruled)
    assert edit.fields["admittedEgressAllow"] == ["pypi.org"]
    assert edit.fields["admittedEgressRules"] is None  # removed: a Sandbox without rules


def test_a_widening_the_backend_cannot_enforce_is_refused_and_the_old_lists_stay() -> None:
    edit = judge(spec(rules=(HTTPS_RULE,)), ENFORCED, generation=4)
    # The admitted lists and the record of the egress in force are not touched.
    assert set(edit.fields) == {"egressEditRefused"}
    refused = edit.fields["egressEditRefused"]
    assert refused["generation"] == 4 and refused["reason"] == "EgressNotEnforced"
    assert "HTTPS" in refused["message"]
    [(type_, reason, message)] = edit.events
    assert (type_, reason) == ("Warning", ConditionReason.EGRESS_EDIT_REFUSED)
    assert "generation 1 stays enforced" in message
    SandboxResourceStatus.model_validate({"egressEditRefused": refused})
    # Judged once per generation: the next pass of the same generation writes nothing.
    after = {**ENFORCED, "egressEditRefused": refused}
    assert not judge(spec(rules=(HTTPS_RULE,)), after, generation=4).fields
    # A later generation is judged again, against a backend that may judge it now.
    later = judge(spec(rules=(HTTPS_RULE,)), after, generation=5, profile=backend(https=True))
    assert later.fields["egressPolicy"] == {"generation": 5, "appliedAt": "2099-01-01T12:00:00Z"}
    assert later.fields["egressEditRefused"] is None  # removed in the same write
    # The spec set back to what is enforced removes the refusal, the record kept.
    back = judge(spec(), after, generation=6)
    assert back.fields == {"egressEditRefused": None}
    assert not back.events


def test_a_backend_that_cannot_follow_an_edit_refuses_it() -> None:
    edit = judge(spec(("pypi.org", "more.example.com")), ENFORCED, follows=False)
    assert set(edit.fields) == {"egressEditRefused"}
    assert edit.fields["egressEditRefused"]["reason"] == "EgressEditNotSupported"
    gone = judge(spec(("pypi.org", "more.example.com")), ENFORCED, gone=True)
    assert gone.fields["egressEditRefused"]["reason"] == "EgressEditNotSupported"


def test_the_record_is_written_with_the_admission_and_once_for_older_sandboxes() -> None:
    fresh = {"admittedEgressAllow": ["pypi.org"]}
    new = judge(spec(), {}, generation=1, admitted=fresh)
    assert new.fields == {"egressPolicy": {"generation": 1, "appliedAt": "2099-01-01T12:00:00Z"}}
    assert not new.events
    older = judge(spec(), {"admittedEgressAllow": ["pypi.org"]}, generation=7)
    assert older.fields["egressPolicy"]["generation"] == 7
    # A resume judged afresh records its generation, the lists being the spec's.
    resumed = judge(spec(), ENFORCED, generation=9, admitted=fresh)
    assert resumed.fields["egressPolicy"]["generation"] == 9
    # Not an allowlist: nothing.
    closed = SandboxResourceSpec.model_validate(
        {"scopeRef": "c", "agentDir": "a", "kind": "shell", "image": "busybox"}
    )
    assert not judge(closed, ENFORCED).fields


def test_an_admitted_sandbox_without_lists_in_status_has_the_specs_judged_never_taken() -> None:
    # Its status lost (or never had) the admitted lists: the proxy enforces nothing for it, and
    # the spec's lists are an edit from none: judged, so rules its backend does not judge stay
    # out.
    refused = judge(spec(rules=(RULE,)), {}, generation=4, profile=backend(rules=False))
    assert set(refused.fields) == {"egressEditRefused"}
    assert refused.fields["egressEditRefused"]["reason"] == "EgressNotEnforced"
    accepted = judge(spec(), {}, generation=4)
    assert accepted.fields["admittedEgressAllow"] == ["pypi.org"]
    assert accepted.fields["egressPolicy"]["generation"] == 4


# ---- the proxy: the generation it enforces, and open connections --------------------------


async def test_summaries_say_which_generation_the_proxy_enforces() -> None:
    written: list[dict[str, Any]] = []

    async def patch(name: str, body: dict[str, Any]) -> object:
        written.append(body)
        return None

    summaries = EgressSummaries(patch, interval=60.0, clock=lambda: 0.0)
    summaries.admit("ns/a", "u1", 3)
    await summaries.flush()
    assert written[-1]["status"]["egress"]["policyGeneration"] == 3
    summaries.admit("ns/a", "u1", 4)  # a re-admission is written at once, not at the interval
    await summaries.flush()
    assert written[-1]["status"]["egress"]["policyGeneration"] == 4
    summaries.admit("ns/b", "u2")  # a Sandbox without a record: no field
    await summaries.flush()
    assert "policyGeneration" not in written[-1]["status"]["egress"]


SB = "127.0.0.2"


def _sandbox(allow: tuple[str, ...], rules: tuple[dict[str, Any], ...] = ()) -> SandboxEgress:
    return SandboxEgress.model_validate(
        {"id": "ns/a", "allow": allow, "rules": rules, "sourceIPs": [ipaddress.ip_address(SB)]}
    )


async def test_a_narrowing_closes_the_tunnels_it_no_longer_allows() -> None:
    echo = await start_echo_server()
    resolver = StaticResolver({n: ["127.0.0.1"] for n in ("kept.test", "dropped.test")})
    config = ProxyConfig.model_validate(
        {
            "listenHost": "127.0.0.1",
            "listenPort": 0,
            "allowedPorts": [echo.port],
            "admittedNetworks": ["127.0.0.1/32"],
        }
    )
    proxy = EgressProxy(config, resolver=resolver)
    await proxy.start()
    try:
        proxy.upsert_sandbox(_sandbox(("kept.test", "dropped.test")))
        kept = await connect_through(proxy.port, f"kept.test:{echo.port}", source=SB)
        dropped = await connect_through(proxy.port, f"dropped.test:{echo.port}", source=SB)
        assert kept.status == dropped.status == 200
        for tunnel in (kept, dropped):
            tunnel.writer.write(b"ping")
            assert await tunnel.reader.readexactly(4) == b"ping"
        assert proxy.opened.count("ns/a") == 2

        proxy.upsert_sandbox(_sandbox(("kept.test",)))  # the edit, as the table sync makes it

        async with asyncio.timeout(5):
            assert await dropped.reader.read() == b""  # closed by the proxy at once
        kept.writer.write(b"still")
        assert await kept.reader.readexactly(5) == b"still"
        # A new connection to the dropped host is refused; the kept host still passes.
        again = await connect_through(proxy.port, f"dropped.test:{echo.port}", source=SB)
        assert again.status == 403
        again.close()
        # A plain host that becomes ruled: its open tunnel could not be judged, so it goes.
        proxy.upsert_sandbox(
            _sandbox((), ({"host": "kept.test", "schemes": ["http"], "methods": ["GET"]},))
        )
        async with asyncio.timeout(5):
            assert await kept.reader.read() == b""
        async with asyncio.timeout(5):
            while proxy.opened.count("ns/a"):  # noqa: ASYNC110 (the handlers' own cleanup)
                await asyncio.sleep(0.01)
        kept.close()
        dropped.close()
    finally:
        await proxy.stop()
        await echo.close()


async def test_a_widening_leaves_open_connections_alone() -> None:
    upstream = await start_http_server(body=lambda head: b"ok\n")
    echo = await start_echo_server()
    resolver = StaticResolver({n: ["127.0.0.1"] for n in ("a.test", "b.test")})
    config = ProxyConfig.model_validate(
        {
            "listenHost": "127.0.0.1",
            "listenPort": 0,
            "allowedPorts": [echo.port, upstream.port],
            "admittedNetworks": ["127.0.0.1/32"],
        }
    )
    proxy = EgressProxy(config, resolver=resolver)
    await proxy.start()
    try:
        proxy.upsert_sandbox(_sandbox(("a.test",)))
        refused = await get_through(proxy.port, f"http://b.test:{upstream.port}/", source=SB)
        assert refused.status == 403
        refused.close()
        tunnel = await connect_through(proxy.port, f"a.test:{echo.port}", source=SB)
        assert tunnel.status == 200
        proxy.upsert_sandbox(_sandbox(("a.test", "b.test")))
        tunnel.writer.write(b"ping")
        assert await tunnel.reader.readexactly(4) == b"ping"
        reached = await get_through(proxy.port, f"http://b.test:{upstream.port}/", source=SB)
        assert reached.status == 200
        reached.close()
        tunnel.close()
    finally:
        await proxy.stop()
        await echo.close()
        await upstream.close()


# ---- the client: where an edit stands -------------------------------------------------------


def _obj(spec_allow: list[str], status: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"egressAllow": spec_allow}, "status": status}


def test_the_client_waits_for_the_operator_and_then_the_proxy() -> None:
    wanted = ["pypi.org", "x.example.com"]
    before = {**ENFORCED, "egress": {"policyGeneration": 1}}
    assert edit_state(_obj(wanted, before), 2)[0] == "pending"
    admitted = {
        "admittedEgressAllow": wanted,
        "egressPolicy": {"generation": 2},
        "egress": {"policyGeneration": 1},
    }
    assert edit_state(_obj(wanted, admitted), 2)[:2] == ("pending", "")
    enforced = {**admitted, "egress": {"policyGeneration": 2}}
    assert edit_state(_obj(wanted, enforced), 2)[0] == "done"
    # No proxy reporting (no status.egress): the operator's admission is the end.
    assert edit_state(_obj(wanted, {k: admitted[k] for k in admitted if k != "egress"}), 2)[0] == (
        "done"
    )
    refused = {
        **before,
        "egressEditRefused": {
            "generation": 2,
            "reason": "EgressNotEnforced",
            "message": "no https rules here",
        },
    }
    assert edit_state(_obj(wanted, refused), 2) == (
        "refused",
        "EgressNotEnforced",
        "no https rules here",
    )
    # A refusal of an older generation does not answer a newer edit.
    assert edit_state(_obj(wanted, refused), 3)[0] == "pending"


def test_the_views_keep_what_an_egress_edit_pass_reads() -> None:
    """The operator's passes read a Sandbox from its views: lists or a record the view dropped
    would make every pass see an edit from none (judged again, written again) and lose the
    generation a refusal keeps."""
    from sandbox_operator.reconcile.slim import slim_sandbox

    kept = {**ENFORCED, "admittedEgressRules": [RULE], "egressEditRefused": {"generation": 2}}
    slim = slim_sandbox(SandboxView({"metadata": {"name": "a", "namespace": "ns"}, "status": kept}))
    assert {k: slim["status"].get(k) for k in kept} == kept
