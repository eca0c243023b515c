"""The host side of a conversation: create its SandboxScope and wait until the operator reports it
Ready, and the sandbox key a SandboxScope gives an agent's ``(agent_dir, call_id)``.

:class:`Scopes` holds the namespace's :class:`~sandbox_operator.client.kube.SandboxObjects` (to
apply and read a scope) and the client's :class:`~sandbox_operator.client.watching.Watches` (to
wait for it); deleting a scope is :class:`~sandbox_operator.client.purges.ScopePurges`', beside
``dispose_scope``: both wait for a conversation's disposal and report it to the observer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sandbox_operator import naming
from sandbox_operator.client.errors import SandboxScopeNotReady
from sandbox_operator.client.kube import SandboxObjects
from sandbox_operator.client.watching import Watches
from sandbox_operator.contract import (
    API_VERSION,
    SANDBOX_SCOPE_KIND,
    SANDBOX_SCOPE_PLURAL,
    SandboxKey,
)
from sandbox_operator.views import SandboxScopeView


class Scopes:
    """The SandboxScopes of one namespace (see the module)."""

    def __init__(self, objects: SandboxObjects, watches: Watches) -> None:
        self.objects = objects
        self.watches = watches

    async def create(
        self,
        *,
        scope: str,
        thread_id: str,
        name: str | None = None,
        min_isolation: str | None = None,
        min_isolation_scope: str | None = None,
        agent_service_accounts: Sequence[str] = (),
        timeout: float = 60.0,  # noqa: ASYNC109
    ) -> str:
        """:meth:`SandboxClient.create_scope
        <sandbox_operator.client.SandboxClient.create_scope>`: apply the SandboxScope, then, when
        it binds agents, wait until the operator reports it Ready."""
        name = name or naming.scope_name(scope, thread_id)
        spec: dict[str, object] = {"scope": scope, "threadId": thread_id}
        if min_isolation:
            spec["minIsolation"] = min_isolation
        if min_isolation_scope:
            spec["minIsolationScope"] = min_isolation_scope
        if agent_service_accounts:
            spec["agentServiceAccounts"] = list(agent_service_accounts)
        body = {
            "apiVersion": API_VERSION,
            "kind": SANDBOX_SCOPE_KIND,
            "metadata": {"name": name, "namespace": self.objects.namespace},
            "spec": spec,
        }
        obj = await self.objects.apply(SANDBOX_SCOPE_PLURAL, name, body, SandboxScopeView)
        if agent_service_accounts:
            try:
                async with asyncio.timeout(timeout):
                    await self.wait_ready(name, obj)
            except TimeoutError:
                raise SandboxScopeNotReady(
                    scope_ref=name, namespace=self.objects.namespace, reason="", timeout=timeout
                ) from None
        return name

    async def wait_ready(self, name: str, raw: SandboxScopeView) -> None:
        """Until the operator has reported the scope's current generation Ready (watched);
        ``raw``: the SandboxScope's view."""
        obj = SandboxScopeView.of(raw)
        while True:
            meta, status = obj.metadata, obj.status
            ready = status.conditions.find("Ready")
            current = status.observed_generation == meta.generation
            if current and ready is not None:
                if ready.is_true:
                    return
                if ready.reason != "Pending":
                    raise SandboxScopeNotReady(
                        scope_ref=name,
                        namespace=self.objects.namespace,
                        reason=ready.reason,
                        message=ready.message,
                    )
            rv = meta.resource_version or None
            event = await self.watches.next_event(
                SANDBOX_SCOPE_PLURAL, name, None if rv is None else str(rv)
            )
            if event is None:
                obj = await self.objects.read_scope(name)
                continue
            kind, obj = event[0], SandboxScopeView(event[1])
            if kind == "DELETED":
                raise SandboxScopeNotReady(
                    scope_ref=name, namespace=self.objects.namespace, reason="Deleted"
                )

    @staticmethod
    def key_for(scope_obj: SandboxScopeView, agent_dir: str, call_id: str) -> SandboxKey:
        """The sandbox key of ``(agent_dir, call_id)`` in the conversation ``scope_obj`` names."""
        return SandboxKey(
            scope=scope_obj.scope,
            thread_id=scope_obj.thread_id,
            agent_dir=agent_dir,
            call_id=call_id,
        )
