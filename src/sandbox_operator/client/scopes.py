"""The host side of a conversation: create and delete its SandboxScope, and the sandbox key a
SandboxScope gives an agent's ``(agent_dir, call_id)``."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from sandbox_operator import naming
from sandbox_operator.client.errors import SandboxScopeNotReady
from sandbox_operator.client.watching import WatchCalls
from sandbox_operator.contract import (
    API_VERSION,
    SANDBOX_SCOPE_KIND,
    SANDBOX_SCOPE_PLURAL,
    SandboxKey,
)


class ScopeCalls(WatchCalls):
    """:meth:`create_scope` and :meth:`key_for` of the client (``delete_scope`` is the client's,
    beside ``dispose_scope``: both report to its observer)."""

    async def create_scope(
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
        """Create (or converge) the SandboxScope of a conversation; returns its name. For the
        *host*: an agent's service account should not be able to do this.

        ``agent_service_accounts`` binds those ServiceAccounts of the namespace to this
        conversation (docs/concepts.md, "The conversation boundary"); the call then waits (up to
        ``timeout`` seconds) until the operator reports the scope Ready, which it does once their
        Role is written, so an agent handed the scope can use it at once; else
        :class:`SandboxScopeNotReady`."""
        name = name or naming.scope_name(scope, thread_id)
        spec: dict[str, Any] = {"scope": scope, "threadId": thread_id}
        if min_isolation:
            spec["minIsolation"] = min_isolation
        if min_isolation_scope:
            spec["minIsolationScope"] = min_isolation_scope
        if agent_service_accounts:
            spec["agentServiceAccounts"] = list(agent_service_accounts)
        body = {
            "apiVersion": API_VERSION,
            "kind": SANDBOX_SCOPE_KIND,
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": spec,
        }
        obj = await self._apply(SANDBOX_SCOPE_PLURAL, name, body)
        if agent_service_accounts:
            try:
                async with asyncio.timeout(timeout):
                    await self._wait_scope_ready(name, obj)
            except TimeoutError:
                raise SandboxScopeNotReady(
                    scope_ref=name, namespace=self.namespace, reason="", timeout=timeout
                ) from None
        return name

    async def _wait_scope_ready(self, name: str, obj: Mapping[str, Any]) -> None:
        """Until the operator has reported the scope's current generation Ready (watched)."""
        while True:
            meta, status = obj.get("metadata") or {}, obj.get("status") or {}
            ready = next(
                (c for c in status.get("conditions") or () if c.get("type") == "Ready"), None
            )
            current = status.get("observedGeneration") == meta.get("generation")
            if current and ready is not None:
                if ready.get("status") == "True":
                    return
                if ready.get("reason") != "Pending":
                    raise SandboxScopeNotReady(
                        scope_ref=name,
                        namespace=self.namespace,
                        reason=str(ready.get("reason") or ""),
                        message=str(ready.get("message") or ""),
                    )
            rv = meta.get("resourceVersion")
            event = await self._next_event(
                SANDBOX_SCOPE_PLURAL, name, None if rv is None else str(rv)
            )
            if event is None:
                obj = await self._read_scope(name)
                continue
            kind, obj = event
            if kind == "DELETED":
                raise SandboxScopeNotReady(
                    scope_ref=name, namespace=self.namespace, reason="Deleted"
                )

    def key_for(self, scope_obj: Mapping[str, Any], agent_dir: str, call_id: str) -> SandboxKey:
        spec = scope_obj.get("spec") or {}
        return SandboxKey(
            scope=spec["scope"], thread_id=spec["threadId"], agent_dir=agent_dir, call_id=call_id
        )
