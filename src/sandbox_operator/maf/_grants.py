"""maf's attached identity (``EgressRule(authority=)``, ``CredentialGateway``) on the operator.

Its own module because it is the one place the maf backend holds a credential: a grant the host's
gateway issues for one sandbox instance is written into a Secret the Sandbox owns (so it is
deleted with it), with the expiry the egress proxy enforces (``credential-expires-at``: the
grant's, never past the gateway's ``max_lifetime_seconds`` from the acquire). The Sandbox's
egressRules name that Secret (``egressRules[].credential``): the proxy attaches it as
``Authorization: Bearer`` to the requests of that one HTTPS origin, and the guest never holds it.

What is declared is what is enforced: ``ATTACHED_IDENTITY`` and ``AttachedIdentity(PER_SANDBOX,
max_lifetime_seconds, {EGRESS_HEADER})`` only where the backend is given a gateway and the operator
publishes that its proxy attaches credentials (``egressCredentials``, with rules judged inside
HTTPS). A grant is installed after the Sandbox exists (it is for that instance): until then, and
after its expiry, the proxy refuses the origin's requests (``CredentialMissing`` /
``CredentialExpired``), never sends them without it.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypedDict
from urllib.parse import urlsplit

import maf_sandbox as maf
from kubernetes_asyncio import client as k8s
from maf_sandbox.credentials import CredentialGateway, CredentialRequest, GatewayLease

from sandbox_operator.keyhash import hash_part
from sandbox_operator.views import SandboxView

#: On the grant's Secret: when the proxy stops attaching it (egress/credentials.py reads it).
EXPIRES_ANNOTATION = "sandbox-operator.dev/credential-expires-at"
FIELD_MANAGER = "sandbox-operator/maf-grants"


def attached_identity(gateway: CredentialGateway | None, attaches: bool) -> maf.AttachedIdentity:
    """What the backend declares: the gateway's bound where the operator's proxy attaches."""
    if gateway is None or not attaches:
        return maf.NO_ATTACHED_IDENTITY
    return gateway.attached_identity


def grant_secret_name(key: maf.SandboxKey, kind: str) -> str:
    """The Secret holding one sandbox's grants: derived from its key and kind, so the spec can
    name it before the Sandbox exists."""
    digest = hash_part("grant", key.scope, key.thread_id, key.agent_id, key.call_id, kind)
    return f"sandbox-grant-{digest}"


def grant_key(audience: str) -> str:
    """The Secret key of an audience's token (a data key: ``[-._a-zA-Z0-9]``)."""
    return f"aud-{hash_part('audience', audience)}"


def authority_rules(spec: maf.SandboxSpec) -> tuple[maf.EgressRule, ...]:
    return tuple(
        e for e in spec.egress_allow if isinstance(e, maf.EgressRule) and e.authority is not None
    )


def start(
    gateway: CredentialGateway | None, key: maf.SandboxKey, spec: maf.SandboxSpec
) -> GatewayLease | None:
    """maf's checks before anything is provisioned (a gateway, one audience per rule, a full key,
    the workload's retention bound); None when the spec attaches nothing."""
    try:
        return GatewayLease.start(gateway, key, spec)
    except ValueError as exc:
        raise maf.SandboxAttachedIdentityNotPermitted(str(exc)) from None


class OwnerReference(TypedDict):
    apiVersion: str
    kind: str
    name: str
    uid: str


class SecretMetadata(TypedDict):
    name: str
    namespace: str
    annotations: dict[str, str]
    ownerReferences: list[OwnerReference]


class SecretBody(TypedDict):
    """The grant's Secret as applied (the keys are the API's: mypy holds them)."""

    apiVersion: str
    kind: str
    metadata: SecretMetadata
    type: str
    data: dict[str, str]


Apply = Callable[[SecretBody], Awaitable[object]]


def secret_applier(api: Any) -> Apply:
    """Server-side apply of a Secret through the client's ``ApiClient``."""
    core = k8s.CoreV1Api(api)

    async def apply(body: SecretBody) -> object:
        patch: Any = core.patch_namespaced_secret  # **kwargs untyped
        meta = body["metadata"]
        return await patch(
            meta["name"],
            meta["namespace"],
            body,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type="application/apply-patch+yaml",
        )

    return apply


async def install(
    apply: Apply,
    gateway: CredentialGateway,
    lease: GatewayLease,
    key: maf.SandboxKey,
    spec: maf.SandboxSpec,
    sandbox: SandboxView,
    instance_id: str,
) -> str:
    """Ask the gateway for this instance's grants and write them into the Secret the Sandbox
    owns (server-side apply); returns its name. Raises ``ValueError`` for grants that do not
    answer the request (another audience, another origin, expired): nothing is written then."""
    rules = authority_rules(spec)
    audiences = frozenset(r.authority for r in rules if r.authority is not None)
    request = CredentialRequest(
        key, spec.kind, instance_id, lease.generation, audiences, lease.expires_at
    )
    try:
        grants = tuple(await gateway.provider(request))
    except Exception:
        raise ValueError("the credential provider refused the grant") from None
    by_audience = {g.audience: g for g in grants}
    if len(by_audience) != len(grants) or by_audience.keys() != audiences:
        raise ValueError("the credential provider must return exactly the requested audiences")
    data: dict[str, str] = {}
    expires = lease.expires_at
    for rule in rules:
        assert rule.authority is not None
        grant = by_audience[rule.authority]
        if urlsplit(grant.origin).hostname != rule.host.lower():
            raise ValueError("a credential's origin does not match its authority rule")
        expires = min(expires, grant.expires_at)
        data[grant_key(rule.authority)] = base64.b64encode(grant.token.encode()).decode()
    if expires <= time.time():
        raise ValueError("the credential expired while it was installed")
    owner = SandboxView.of(sandbox)  # a plain dict handed outside the type checker is wrapped
    meta = owner.metadata
    name = grant_secret_name(key, spec.kind)
    body: SecretBody = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": meta.namespace,
            "annotations": {EXPIRES_ANNOTATION: datetime.fromtimestamp(expires, UTC).isoformat()},
            "ownerReferences": [
                {
                    "apiVersion": owner.api_version,
                    "kind": owner.kind,
                    "name": meta.name,
                    "uid": meta.uid,
                }
            ],
        },
        "type": "Opaque",
        "data": data,
    }
    await apply(body)
    return name
