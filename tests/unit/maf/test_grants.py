"""maf's attached identity on the operator (#38 item 3): ``ATTACHED_IDENTITY`` declared with the
``AttachedIdentity`` the operator enforces only where its proxy attaches credentials and the host
gave a ``CredentialGateway``; an ``EgressRule(authority=)`` translated into an https rule naming
the sandbox's grant Secret; the gateway's grant for one instance installed into that Secret, owned
by the Sandbox and expiring with the grant (at most the gateway's lifetime), or nothing installed
when the grant does not answer the request. The Secret's use by the proxy is
tests/unit/test_egress_credentials.py's."""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import maf_sandbox as maf
import pytest
from maf_sandbox.credentials import CredentialGateway, CredentialGrant, CredentialRequest

from sandbox_operator.maf import _grants as grants
from sandbox_operator.maf import declarations, operator_spec
from tests.fixtures.maf_translate import RUNC, published

ATTACHING = {**RUNC["declarations"], "egressRules": True, "egressRulesHttps": True,
             "egressCredentials": True}  # fmt: skip
KEY = maf.SandboxKey(scope="tenant-a", thread_id="t1", agent_id="agent", call_id="c1")
TOKEN = "grant-7d1e0c5a9b3f"


def gateway(grant: Any = None, lifetime: int = 300) -> tuple[CredentialGateway, list[Any]]:
    asked: list[CredentialRequest] = []

    async def provider(request: CredentialRequest) -> Sequence[CredentialGrant]:
        asked.append(request)
        if grant is not None:
            return grant(request)
        return [CredentialGrant("api", "https://api.example.com", TOKEN, time.time() + 60)]

    return CredentialGateway(provider, max_lifetime_seconds=lifetime), asked


def spec(**rule: Any) -> maf.SandboxSpec:
    return maf.SandboxSpec(
        kind="python",
        image="python:3.12",
        requires=frozenset({maf.Capability.EXEC, maf.Capability.ATTACHED_IDENTITY}),
        egress=maf.Egress.ALLOWLIST,
        egress_allow=(maf.EgressRule(host="api.example.com", authority="api", **rule),),
        max_identity_retention_seconds=600,
        max_identity_scope=maf.IdentityScope.PER_SANDBOX,
    )


def test_attached_identity_is_declared_only_where_the_operator_attaches() -> None:
    gw, _ = gateway()
    attaching = published({**RUNC, "declarations": ATTACHING}).backends[0]
    got = declarations(attaching, grants.attached_identity(gw, attaches=True))
    assert maf.Capability.ATTACHED_IDENTITY in got.capabilities
    assert got.attached_identity == maf.AttachedIdentity(
        maf.IdentityScope.PER_SANDBOX, 300, frozenset({maf.AuthorityChannel.EGRESS_HEADER})
    )
    # No gateway: nothing to attach. A backend whose proxy does not attach: nothing declared.
    for backend, gw_or_none in ((attaching, None), (published(RUNC).backends[0], gw)):
        silent = declarations(backend, grants.attached_identity(gw_or_none, attaches=True))
        assert maf.Capability.ATTACHED_IDENTITY not in silent.capabilities
        assert silent.attached_identity == maf.NO_ATTACHED_IDENTITY


def test_an_authority_rule_becomes_an_https_rule_naming_the_grant_secret() -> None:
    name = grants.grant_secret_name(KEY, "python")
    got = operator_spec(spec(methods=("GET",), paths=("/v1/*",)), grant_secret=name)
    (rule,) = got.egress_rules
    assert [str(s) for s in rule.schemes] == ["https"]
    assert (rule.methods, rule.paths) == (("GET",), ("/v1/*",))
    assert rule.credential is not None
    assert (rule.credential.secret_name, rule.credential.key) == (name, grants.grant_key("api"))
    assert (rule.credential.header, rule.credential.prefix) == ("Authorization", "Bearer ")
    assert contract_capability_free(got)
    with pytest.raises(maf.SandboxAttachedIdentityNotPermitted):
        operator_spec(spec())  # a backend without a gateway attaches nothing


def contract_capability_free(got: Any) -> bool:
    """ATTACHED_IDENTITY is how the spec asks for the rule's credential, not a contract
    capability (the operator has none of that name)."""
    return all(c.value != "attached_identity" for c in got.requires)


def test_the_lease_refuses_what_maf_refuses_before_anything_is_made() -> None:
    gw, asked = gateway()
    assert grants.start(gw, KEY, spec()) is not None
    assert grants.start(None, KEY, maf.SandboxSpec(kind="python", image="python:3.12")) is None
    with pytest.raises(maf.SandboxAttachedIdentityNotPermitted):
        grants.start(None, KEY, spec())
    with pytest.raises(maf.SandboxAttachedIdentityNotPermitted):
        grants.start(gateway(lifetime=900)[0], KEY, spec())  # past the workload's bound
    assert asked == []


SANDBOX = {
    "apiVersion": "sandbox-operator.dev/v1alpha1",
    "kind": "Sandbox",
    "metadata": {"name": "sbx-a", "namespace": "agents", "uid": "uid-1"},
}


async def test_the_grant_for_one_instance_goes_into_a_secret_the_sandbox_owns() -> None:
    gw, asked = gateway()
    lease = grants.start(gw, KEY, spec())
    assert lease is not None
    applied: list[dict[str, Any]] = []

    async def apply(body: dict[str, Any]) -> object:
        applied.append(body)
        return body

    name = await grants.install(apply, gw, lease, KEY, spec(), SANDBOX, "instance-1")
    (request,) = asked
    assert (request.instance_id, request.audiences, request.kind) == (
        "instance-1",
        frozenset({"api"}),
        "python",
    )
    assert request.generation == lease.generation and request.expires_at == lease.expires_at
    (body,) = applied
    meta = body["metadata"]
    assert meta["name"] == name == grants.grant_secret_name(KEY, "python")
    assert meta["namespace"] == "agents"
    assert meta["ownerReferences"] == [{"apiVersion": SANDBOX["apiVersion"], "kind": "Sandbox",
                                        "name": "sbx-a", "uid": "uid-1"}]  # fmt: skip
    data = body["data"]
    assert base64.b64decode(data[grants.grant_key("api")]).decode() == TOKEN
    expires = datetime.fromisoformat(meta["annotations"][grants.EXPIRES_ANNOTATION]).timestamp()
    assert expires <= min(lease.expires_at, time.time() + 60) + 1  # the earlier of the two


@pytest.mark.parametrize(
    "answer",
    [
        lambda r: [],
        lambda r: [CredentialGrant("other", "https://api.example.com", TOKEN, time.time() + 60)],
        lambda r: [CredentialGrant("api", "https://elsewhere.example", TOKEN, time.time() + 60)],
    ],
    ids=["none", "another-audience", "another-origin"],
)
async def test_a_grant_that_does_not_answer_the_request_installs_nothing(answer: Any) -> None:
    gw, _ = gateway(answer)
    lease = grants.start(gw, KEY, spec())
    assert lease is not None
    applied: list[object] = []

    async def apply(body: dict[str, Any]) -> object:
        applied.append(body)
        return body

    with pytest.raises(ValueError) as exc:
        await grants.install(apply, gw, lease, KEY, spec(), SANDBOX, "instance-1")
    assert applied == [] and TOKEN not in str(exc.value)
