"""The host side of a conversation: create and delete its SandboxScope, and the sandbox key a
SandboxScope gives an agent's ``(agent_dir, call_id)``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandbox_operator import naming
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
    ) -> str:
        """Create (or converge) the SandboxScope of a conversation; returns its name. For the
        *host*: an agent's service account should not be able to do this."""
        name = name or naming.scope_name(scope, thread_id)
        spec: dict[str, Any] = {"scope": scope, "threadId": thread_id}
        if min_isolation:
            spec["minIsolation"] = min_isolation
        if min_isolation_scope:
            spec["minIsolationScope"] = min_isolation_scope
        body = {
            "apiVersion": API_VERSION,
            "kind": SANDBOX_SCOPE_KIND,
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": spec,
        }
        await self._apply(SANDBOX_SCOPE_PLURAL, name, body)
        return name

    def key_for(self, scope_obj: Mapping[str, Any], agent_dir: str, call_id: str) -> SandboxKey:
        spec = scope_obj.get("spec") or {}
        return SandboxKey(
            scope=spec["scope"], thread_id=spec["threadId"], agent_dir=agent_dir, call_id=call_id
        )
