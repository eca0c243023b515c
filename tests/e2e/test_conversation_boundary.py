"""One conversation cannot reach another in the same namespace (#25 item 2).

Two agent identities (ServiceAccounts with tokens, using the client as an agent would), each bound
to one conversation by its SandboxScope's ``agentServiceAccounts``, under the chart's agent Role
and admission policies with ``agentRole.conversationBoundary``. Each acquires and execs in its own
conversation; agent A then tries everything against agent B's conversation (read its scope, create
a Sandbox naming it, read, list, watch, suspend, touch and delete B's Sandbox, exec into B's pod)
and is refused each time by the cluster, with B's sandbox untouched. On runc and gVisor.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream

from sandbox_operator.client import SandboxClient, SandboxForbidden
from sandbox_operator.contract import SandboxSpec
from tests.fixtures.agents import agent_chart_objects, token, token_client
from tests.fixtures.operator import BUSYBOX, GROUP, VERSION, Kit, local_config

pytestmark = pytest.mark.e2e


#: B's sandbox keeps a work volume, so that suspending it is a change the schema accepts and only
#: the boundary can refuse.
STORAGE = {"size": "64Mi", "storageClassName": "sandbox-local"}


def spec(**fields: Any) -> SandboxSpec:
    return SandboxSpec.model_validate(
        {"kind": "shell", "image": BUSYBOX, "requires": ["exec"], **fields}
    )


def sandbox_body(name: str, scope_ref: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"scopeRef": scope_ref, "agentDir": "agents/forged", **spec().to_wire()},
    }


def forbidden(call: Callable[[], Any]) -> str:
    """Run a synchronous API call that must be refused; its 403 body (the reason given)."""
    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status == 403, info.value
    return str(info.value.body)


async def refused(call: Any) -> None:
    with pytest.raises(SandboxForbidden):
        await call


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
async def test_an_agent_bound_to_one_conversation_cannot_reach_another(
    kit: Kit,
    kubeconfig: str,
    api_client: client.ApiClient,
    core_v1: client.CoreV1Api,
    kubectl: Callable[..., Any],
    start_operator: Callable[..., Any],
    tmp_path: Path,
    runtime: str,
) -> None:
    ns = kit.ns
    start_operator(local_config(selection="fixed", pinned=runtime))
    with agent_chart_objects(
        api_client, ns, tmp_path, ["agent-a", "agent-b"], conversationBoundary=True
    ):
        # The host binds each agent to its conversation; create_scope returns once the operator
        # has granted it (the scope is Ready).
        async with await SandboxClient.from_kubeconfig(ns, kubeconfig=kubeconfig) as host:
            for conv, agent in (("a", "agent-a"), ("b", "agent-b")):
                await host.create_scope(
                    name=f"conv-{conv}", scope="tenant", thread_id=conv,
                    agent_service_accounts=[agent], timeout=30,
                )  # fmt: skip
        token_a = token(core_v1, ns, "agent-a")
        a = await token_client(kubeconfig, ns, token_a)
        b = await token_client(kubeconfig, ns, token(core_v1, ns, "agent-b"))
        # A's own identity, synchronously, for the raw calls the client would never make.
        raw_a = client.CustomObjectsApi(_with_token(api_client, token_a))
        try:
            # The policies reach admission a moment after they are created: until A's create
            # of a Sandbox naming B's conversation is refused (dry run), by the boundary.
            deadline = time.monotonic() + 30
            while True:
                try:
                    raw_a.create_namespaced_custom_object(
                        GROUP, VERSION, ns, "sandboxes", sandbox_body("forged", "conv-b"),
                        dry_run="All",
                    )  # fmt: skip
                except ApiException as exc:
                    if exc.status == 403 and "may not use SandboxScope 'conv-b'" in str(exc.body):
                        break
                assert time.monotonic() < deadline, "the boundary policy never took effect"
                await asyncio.sleep(1)

            # Each agent works in its own conversation.
            mine, theirs = await asyncio.gather(
                a.acquire("conv-a", "agents/a", spec(), timeout=180),
                b.acquire("conv-b", "agents/b", spec(storage=STORAGE), timeout=180),
            )
            assert (await mine.exec(["echo", "a"])).stdout == b"a\n"
            assert (await theirs.exec(["echo", "b"])).stdout == b"b\n"
            pod_b = kit.get(theirs.name)["status"]["servedBy"]["name"]  # type: ignore[index]

            # B's conversation is out of A's reach: its scope ...
            await refused(a.acquire("conv-b", "agents/a", spec(), timeout=30))
            body = forbidden(
                lambda: raw_a.create_namespaced_custom_object(
                    GROUP, VERSION, ns, "sandboxes", sandbox_body("forged", "conv-b")
                )
            )
            assert "may not use SandboxScope 'conv-b'" in body
            # ... reading B's Sandbox, by name, by list, by watch ...
            forbidden(
                lambda: raw_a.get_namespaced_custom_object(
                    GROUP, VERSION, ns, "sandboxes", theirs.name
                )
            )
            forbidden(lambda: raw_a.list_namespaced_custom_object(GROUP, VERSION, ns, "sandboxes"))
            forbidden(
                lambda: raw_a.list_namespaced_custom_object(
                    GROUP, VERSION, ns, "sandboxes", field_selector=f"metadata.name={theirs.name}",
                    watch=True, timeout_seconds=1, _preload_content=False,
                )
            )  # fmt: skip
            # ... changing it (suspend, touch) and deleting it ...
            for patch in ({"spec": {"suspended": True}}, {"metadata": {"annotations": {
                "sandbox-operator.dev/last-activity": "2026-01-01T00:00:00Z"}}}):  # fmt: skip
                body = forbidden(
                    lambda patch=patch: raw_a.patch_namespaced_custom_object(
                        GROUP, VERSION, ns, "sandboxes", theirs.name, patch
                    )
                )
                assert "may not use SandboxScope 'conv-b'" in body
            await refused(a.dispose(theirs.name))
            # ... and exec into its pod.
            with pytest.raises(ApiException) as info:
                stream(
                    client.CoreV1Api(raw_a.api_client).connect_get_namespaced_pod_exec,
                    pod_b, ns, command=["true"], stdout=True, stderr=True,
                )  # fmt: skip
            assert "403" in str(info.value.reason), info.value.reason
            assert f"may not use the conversation of pod '{pod_b}'" in str(info.value.reason), (
                info.value.reason
            )

            # A's own sandbox is still A's to use and dispose; B's is untouched and serves B.
            assert (await mine.exec(["echo", "still"])).stdout == b"still\n"
            obj = kit.get(theirs.name)
            assert obj is not None and not obj["metadata"].get("deletionTimestamp")
            assert not obj["spec"].get("suspended")
            assert (await theirs.exec(["echo", "b"])).stdout == b"b\n"
            await a.dispose(mine, wait=True)
            assert kit.get(mine.name) is None
        finally:
            await a.close()
            await b.close()


def _with_token(api: client.ApiClient, bearer: str) -> client.ApiClient:
    """A synchronous ApiClient for the admin's server that authenticates with ``bearer``."""
    cfg = client.Configuration()
    cfg.host = api.configuration.host
    cfg.ssl_ca_cert = api.configuration.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {bearer}"}
    return client.ApiClient(configuration=cfg)
