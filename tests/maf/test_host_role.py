"""The maf route runs under the chart's maf host Role and nothing more (#37 item 3).

A ServiceAccount bound only to what ``helm template`` renders for ``hostRole`` (its Role, its
RoleBinding and its exec policies, created in the module's namespace) builds the
:class:`~sandbox_operator.client.SandboxClient` that ``maf_sandbox.SandboxRouter`` over
:class:`~sandbox_operator.maf.OperatorBackend` runs on: the published backends are read, a
conversation's SandboxScope and Sandbox are created, a file is written and a program run, and
the conversation is purged, from another backend instance (another process), SandboxScope
included. The same token is refused everything else the Role is meant to deny: Secrets, pods and
their logs, other ConfigMaps, status writes, RBAC, exec into a pod that is not a sandbox pod, and
another namespace.

With ``agentRole.conversationBoundary`` too, the host (no bound agent) creates the conversation's
SandboxScope naming agent A: A execs into the sandbox the maf route made, B is refused it, and the
host's purge takes the scope and A's grant with it. On runc and gVisor (the module's operator).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import maf_sandbox as maf
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream
from tests.fixtures.agents import host_chart_objects, token, token_api, token_client
from tests.fixtures.maf_cluster import Served
from tests.fixtures.operator import BUSYBOX, GROUP, PYTHON, VERSION

from sandbox_operator import labels as lbl
from sandbox_operator import naming
from sandbox_operator.client import SandboxForbidden
from sandbox_operator.contract import SandboxSpec
from sandbox_operator.maf import OperatorBackend
from sandbox_operator.reconcile.access import access_name

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SPEC = maf.SandboxSpec(
    kind="host-role", requires=frozenset({maf.Capability.EXEC, maf.Capability.FILES_IN})
)


def forbidden(call: Callable[[], Any]) -> str:
    """Run a synchronous API call that must be refused; its 403 body (the reason given)."""
    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status == 403, info.value
    return str(info.value.body)


async def until_refused(call: Callable[[], Any], text: str) -> None:
    """Admission policies take effect a moment after they are created: until ``call`` is
    refused (403) with ``text``."""
    deadline = time.monotonic() + 30
    while True:
        try:
            call()
        except ApiException as exc:
            if "403" in f"{exc.status} {exc.reason}" and text in f"{exc.reason} {exc.body}":
                return
        assert time.monotonic() < deadline, f"never refused with {text!r}"
        await asyncio.sleep(1)


def conversation_sandbox(custom: client.CustomObjectsApi, ns: str, key: maf.SandboxKey) -> Any:
    (item,) = custom.list_namespaced_custom_object(
        GROUP, VERSION, ns, "sandboxes", label_selector=lbl.scope_selector(key.scope, key.thread_id)
    )["items"]
    return item


async def gone(read: Callable[[], Any], what: str, within: float = 90) -> None:
    """Until ``read`` answers 404."""
    deadline = time.monotonic() + within
    while True:
        try:
            read()
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        assert time.monotonic() < deadline, f"{what} still there after {within}s"
        await asyncio.sleep(0.5)


def plain_pod(core: client.CoreV1Api, ns: str) -> str:
    """A pod of the namespace that is no sandbox's (another workload)."""
    name = f"plain-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_pod(
        ns,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1PodSpec(
                containers=[client.V1Container(name="c", image=BUSYBOX, command=["sleep", "3600"])],
                termination_grace_period_seconds=0,
            ),
        ),
    )
    return name


def assert_host_denied(api: client.ApiClient, ns: str, sandbox: str, pod: str) -> None:
    """What the host Role does not grant, each refused by the API server."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    forbidden(lambda: core.list_namespaced_secret(ns))
    forbidden(lambda: core.list_namespaced_pod(ns))
    forbidden(lambda: core.read_namespaced_pod(pod, ns))
    forbidden(lambda: core.read_namespaced_pod_log(pod, ns))
    forbidden(lambda: core.create_namespaced_pod(ns, {"metadata": {"name": "forged"}, "spec": {
        "containers": [{"name": "c", "image": BUSYBOX}]}}))  # fmt: skip
    forbidden(lambda: core.read_namespaced_config_map("kube-root-ca.crt", ns))
    forbidden(
        lambda: custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, ns, "sandboxes", sandbox, {"status": {"phase": "Ready"}}
        )
    )
    forbidden(
        lambda: client.RbacAuthorizationV1Api(api).create_namespaced_role(
            ns, {"metadata": {"name": "forged"}, "rules": []}
        )
    )
    forbidden(lambda: custom.list_namespaced_custom_object(GROUP, VERSION, "default", "sandboxes"))


async def test_the_maf_route_runs_under_the_host_role_alone(
    served: Served,
    api_client: client.ApiClient,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
    tmp_path: Path,
) -> None:
    ns = served.namespace
    key = maf.SandboxKey("host-role", f"thread-{uuid.uuid4().hex[:8]}", "agent")
    with host_chart_objects(api_client, ns, tmp_path, "maf-host"):
        bearer = token(core_v1, ns, "maf-host")
        raw = token_api(api_client, bearer)
        other = plain_pod(core_v1, ns)
        await until_refused(
            lambda: stream(
                client.CoreV1Api(raw).connect_get_namespaced_pod_exec,
                other, ns, command=["true"], stdout=True, stderr=True,
            ),
            "the maf host may exec only into sandbox pods",
        )  # fmt: skip
        host = await token_client(served.kubeconfig, ns, bearer)
        purger = await token_client(served.kubeconfig, ns, bearer)
        try:
            backend = await OperatorBackend.connect(
                host, backend=served.runtime, default_image=PYTHON
            )
            router = maf.SandboxRouter([backend], min_isolation=served.isolation)
            sandbox = await router.acquire(key, SPEC)
            await sandbox.write_file("hello.py", "print('hello, host')", working_directory=".")
            result = await sandbox.exec(["python3", "hello.py"], working_directory=".", timeout=60)
            assert result.exit_code == 0 and result.stdout == "hello, host\n", result

            obj = conversation_sandbox(custom_objects, ns, key)
            assert_host_denied(raw, ns, obj["metadata"]["name"], obj["status"]["servedBy"]["name"])

            # The purge served by another process (a backend that never acquired here) takes
            # the Sandbox and the conversation's SandboxScope.
            scope_ref = naming.scope_name(key.scope, key.thread_id)
            assert custom_objects.get_namespaced_custom_object(
                GROUP, VERSION, ns, "sandboxscopes", scope_ref
            )
            elsewhere = OperatorBackend(purger, backend.published, backend=served.runtime)
            purge = await maf.SandboxRouter(
                [elsewhere], min_isolation=served.isolation
            ).dispose_scope(key.scope, key.thread_id)
            assert (purge.disposed, purge.undisposed) == (1, None)
            await gone(
                lambda: custom_objects.get_namespaced_custom_object(
                    GROUP, VERSION, ns, "sandboxscopes", scope_ref
                ),
                f"SandboxScope {scope_ref}",
            )
        finally:
            await host.close()
            await purger.close()


async def test_the_maf_route_under_the_host_role_with_the_conversation_boundary(
    served: Served,
    api_client: client.ApiClient,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
    tmp_path: Path,
) -> None:
    ns = served.namespace
    key = maf.SandboxKey("host-role", f"bound-{uuid.uuid4().hex[:8]}", "agent")
    scope_ref = naming.scope_name(key.scope, key.thread_id)
    agents = ["agent-a", "agent-b"]
    with host_chart_objects(
        api_client, ns, tmp_path, "maf-host-bound", agents, conversationBoundary=True
    ):
        host_bearer = token(core_v1, ns, "maf-host-bound")
        host = await token_client(served.kubeconfig, ns, host_bearer)
        raw_a = token_api(api_client, token(core_v1, ns, "agent-a"))
        bearer_b = token(core_v1, ns, "agent-b")
        raw_b = token_api(api_client, bearer_b)
        b = await token_client(served.kubeconfig, ns, bearer_b)
        try:
            backend = await OperatorBackend.connect(
                host,
                backend=served.runtime,
                default_image=PYTHON,
                agent_service_accounts=["agent-a"],
            )
            router = maf.SandboxRouter([backend], min_isolation=served.isolation)
            # The host is no bound agent: the maf route creates the conversation (naming A) and
            # its Sandbox, and execs in it.
            sandbox = await router.acquire(key, SPEC)
            result = await sandbox.exec(["echo", "host"], working_directory=".", timeout=60)
            assert result.stdout == "host\n", result
            scope = custom_objects.get_namespaced_custom_object(
                GROUP, VERSION, ns, "sandboxscopes", scope_ref
            )
            assert scope["spec"]["agentServiceAccounts"] == ["agent-a"]
            obj = conversation_sandbox(custom_objects, ns, key)
            pod = obj["status"]["servedBy"]["name"]

            # B may not use the host's conversation: not its pod, not its scope, not its Sandbox.
            await until_refused(
                lambda: stream(
                    client.CoreV1Api(raw_b).connect_get_namespaced_pod_exec,
                    pod, ns, command=["true"], stdout=True, stderr=True,
                ),
                f"may not use the conversation of pod '{pod}'",
            )  # fmt: skip
            spec = SandboxSpec.model_validate({"kind": "shell", "image": BUSYBOX,
                                               "requires": ["exec"]})  # fmt: skip
            with pytest.raises(SandboxForbidden):
                await b.acquire(scope_ref, "agents/b", spec, timeout=30)
            forbidden(
                lambda: client.CustomObjectsApi(raw_b).get_namespaced_custom_object(
                    GROUP, VERSION, ns, "sandboxes", obj["metadata"]["name"]
                )
            )
            # A, whom the host's scope names, execs into the sandbox the maf route made.
            out = stream(
                client.CoreV1Api(raw_a).connect_get_namespaced_pod_exec,
                pod, ns, command=["echo", "agent-a"], stdout=True, stderr=True,
            )  # fmt: skip
            assert out == "agent-a\n", out
            # And the host Role denies the host the same things as without the boundary.
            assert_host_denied(token_api(api_client, host_bearer), ns, obj["metadata"]["name"], pod)

            # The host's purge takes the conversation: its Sandbox, its scope and A's grant.
            purge = await router.dispose_scope(key.scope, key.thread_id)
            assert (purge.disposed, purge.undisposed) == (1, None)
            await gone(
                lambda: custom_objects.get_namespaced_custom_object(
                    GROUP, VERSION, ns, "sandboxscopes", scope_ref
                ),
                f"SandboxScope {scope_ref}",
            )
            rbac = client.RbacAuthorizationV1Api(api_client)
            await gone(
                lambda: rbac.read_namespaced_role_binding(access_name(scope_ref), ns),
                "agent A's RoleBinding",
            )
        finally:
            await host.close()
            await b.close()
