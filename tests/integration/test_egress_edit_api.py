"""Egress edits on a live Sandbox (#38 item 5, docs/egress.md "Editing egress on a live Sandbox")
against a real API server: the CRD lets `egressAllow` and `egressRules` change and still refuses,
naming the field, what it refuses at creation (a metadata host, a host in both lists) and any
change of the mode; the operator admits a widening (the admitted lists, `status.egressPolicy`, an
`EgressEdited` Event) and refuses rules its backend does not judge, keeping the old lists
(`EgressEditRefused`); the client's `edit_egress` raises the typed refusal for both. The
Sandbox's pod and its managed egress proxy run on no node: an edit is judged from admission on,
whatever the pod does (tests/fixtures/nodeless.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from sandbox_operator.client import SandboxClient, SandboxEgressEditRefused
from sandbox_operator.contract import GROUP, SANDBOX_PLURAL, VERSION
from tests.fixtures.faults import runc_config
from tests.fixtures.nodeless import NO_NODE, off_node
from tests.fixtures.operator import Kit

pytestmark = pytest.mark.integration

RULE = {"host": "api.example.com", "schemes": ["http"], "methods": ["GET"]}


def patch_spec(kit: Kit, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = kit.custom.patch_namespaced_custom_object(
        GROUP, VERSION, kit.ns, SANDBOX_PLURAL, name, {"spec": spec}
    )
    return result


def refusal(kit: Kit, name: str, spec: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as err:
        patch_spec(kit, name, spec)
    assert err.value.status == 422, err.value.body
    return str(err.value.body)


def wait_status(kit: Kit, name: str, predicate: Any, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = dict((kit.get(name) or {}).get("status") or {})
        if predicate(status):
            return status
        time.sleep(0.2)
    raise AssertionError(f"sandbox {name}: status never matched; last: {status}")


def test_the_crd_lets_the_allowlist_change_and_refuses_what_creation_refuses(
    kit: Kit, crds: Any
) -> None:
    kit.scope()
    kit.sandbox("e", egress="allowlist", egressAllow=["a.example.com"])
    edited = patch_spec(kit, "e", {"egressAllow": ["a.example.com", "b.example.com"]})
    assert edited["metadata"]["generation"] == 2
    edited = patch_spec(kit, "e", {"egressRules": [RULE]})
    assert edited["spec"]["egressRules"] == [RULE]
    body = refusal(kit, "e", {"egressAllow": ["a.example.com", "metadata.google.internal"]})
    assert "spec.egressAllow[1]" in body and "metadata" in body
    body = refusal(kit, "e", {"egressAllow": ["a.example.com", "169.254.169.254"]})
    assert "spec.egressAllow[1]" in body
    body = refusal(kit, "e", {"egressAllow": ["api.example.com"]})
    assert "spec.egressRules" in body and "list a host in one of them" in body
    body = refusal(kit, "e", {"egress": "unrestricted"})
    assert "spec.egress" in body and "cannot change after creation" in body
    after = kit.get("e")
    assert after is not None and after["metadata"]["generation"] == 3
    assert after["spec"]["egressAllow"] == ["a.example.com", "b.example.com"]
    # A closed Sandbox gets no allowlist by an edit: the mode decides.
    kit.sandbox("closed")
    body = refusal(kit, "closed", {"egressAllow": ["a.example.com"]})
    assert "egressAllow is only valid with egress allowlist" in body


def managed_off_node() -> dict[str, Any]:
    """One runc backend serving allowlist through the managed proxy, which judges no egressRules;
    its pods and the proxy's pod on no node."""
    config = off_node(runc_config(resyncSeconds=300))
    (backend,) = config["backends"]
    backend["declarations"] = dict(backend["declarations"], egressModes=["closed", "allowlist"])
    backend["egressProxy"] = {"managed": True}
    config["egressProxy"] = {
        "image": "sandbox-operator.dev/egress-proxy-not-run:0",
        "port": 3128,
        "nodeSelector": NO_NODE,
    }
    return config


async def test_the_operator_admits_a_widening_and_refuses_rules_it_cannot_enforce(
    kit: Kit, start_operator: Any, kubeconfig: str
) -> None:
    start_operator(managed_off_node())
    kit.scope()
    kit.sandbox("w", egress="allowlist", egressAllow=["a.example.com"])
    first = wait_status(kit, "w", lambda s: s.get("admittedEgressAllow") == ["a.example.com"])
    assert first["egressPolicy"]["generation"] == 1 and first["egressPolicy"]["appliedAt"]

    # A widening: admitted in one status write, with its generation and an Event.
    patch_spec(kit, "w", {"egressAllow": ["a.example.com", "b.example.com"]})
    status = wait_status(kit, "w", lambda s: s["egressPolicy"]["generation"] == 2)
    assert status["admittedEgressAllow"] == ["a.example.com", "b.example.com"]
    assert "egressEditRefused" not in status

    # Rules this backend does not judge: refused by the operator, the old lists kept.
    patch_spec(kit, "w", {"egressRules": [RULE]})
    status = wait_status(
        kit, "w", lambda s: (s.get("egressEditRefused") or {}).get("generation") == 3
    )
    assert status["egressEditRefused"]["reason"] == "EgressNotEnforced"
    assert status["egressPolicy"]["generation"] == 2
    assert status["admittedEgressAllow"] == ["a.example.com", "b.example.com"]
    assert "admittedEgressRules" not in status
    wanted = {"EgressEdited", "EgressEditRefused"}
    events = kit.events_until("w", lambda evs: wanted <= {e.reason for e in evs})
    reasons = {e.reason: e.type for e in events}
    assert reasons.get("EgressEdited") == "Normal", reasons
    assert reasons.get("EgressEditRefused") == "Warning", reasons

    # The client: the operator's refusal and the API server's, each typed.
    async with await SandboxClient.from_kubeconfig(kit.ns, kubeconfig=kubeconfig) as aclient:
        with pytest.raises(SandboxEgressEditRefused) as refused:
            await aclient.edit_egress(
                "w", rules=[{**RULE, "host": "other.example.com"}], timeout=60
            )
        assert refused.value.reason == "EgressNotEnforced"
        with pytest.raises(SandboxEgressEditRefused) as refused:
            await aclient.edit_egress("w", allow=["a.example.com", "169.254.169.254"], timeout=60)
        assert refused.value.reason == "Invalid" and "spec.egressAllow[1]" in refused.value.message
        # Back to no rules: the refusal is cleared, the lists enforced all along stay.
        await aclient.edit_egress("w", rules=[], timeout=60)
        status = wait_status(kit, "w", lambda s: "egressEditRefused" not in s)
        assert status["egressPolicy"]["generation"] == 2
        assert status["admittedEgressAllow"] == ["a.example.com", "b.example.com"]
