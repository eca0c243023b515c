"""``SandboxClient``: acquire sandboxes as ``Sandbox`` custom resources and wait for them.

The client never decides a conversation's scope or thread: it takes ``scope_ref``, the name of a
``SandboxScope`` the *host* created in the namespace, and reads scope and thread from it. The
model, which only ever talks to tools, cannot name another conversation's sandbox.

``acquire`` is get-or-create: the Sandbox's name is derived from the key
(:func:`sandbox_operator.naming.sandbox_name`) and the object is written with server-side apply,
so two callers racing on one key converge on one object (and one pod). Then the client *watches*
the Sandbox (it never polls) until ``Ready=True`` or a terminal reason, raising that reason's
exception the moment the operator reports it; it also watches the SandboxScope, so a scope
deleted while a caller waits raises promptly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio import watch as k8s_watch
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.stream import WsApiClient

from sandbox_operator import labels as lbl
from sandbox_operator import naming
from sandbox_operator.client.dataplane import DataPlane, pod_dataplane
from sandbox_operator.client.errors import (
    DataPlaneError,
    SandboxAcquireError,
    SandboxForbidden,
    SandboxGone,
    SandboxNotReadyInTime,
    SandboxScopeNotFound,
    SandboxSpecConflict,
    SandboxSpecRejected,
    acquire_error_for,
    scrub,
)
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.contract import (
    API_VERSION,
    GROUP,
    SANDBOX_KIND,
    SANDBOX_PLURAL,
    SANDBOX_SCOPE_KIND,
    SANDBOX_SCOPE_PLURAL,
    VERSION,
    IsolationScope,
    SandboxKey,
    SandboxResourceSpec,
    SandboxSpec,
)

_SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

#: Builds a data plane for a Ready Sandbox, keyed by ``status.servedBy.kind``.
DataPlaneFactory = Callable[["SandboxClient", Mapping[str, Any]], DataPlane]
_DATAPLANES: dict[str, DataPlaneFactory] = {}


def register_dataplane(served_by_kind: str, factory: DataPlaneFactory) -> None:
    """Teach every client how to reach sandboxes served by a ``servedBy.kind`` (e.g. an ACA
    session). ``Pod`` is built in."""
    _DATAPLANES[served_by_kind] = factory


def _pod_factory(client: SandboxClient, obj: Mapping[str, Any]) -> DataPlane:
    served = (obj.get("status") or {}).get("servedBy") or {}
    namespace = served.get("namespace") or obj["metadata"]["namespace"]
    if namespace != client.namespace:
        raise DataPlaneError("the sandbox is served from another namespace")
    return pod_dataplane(client.ws_api, namespace, served["name"])


register_dataplane("Pod", _pod_factory)


def _conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {c.get("type", ""): c for c in (obj.get("status") or {}).get("conditions") or []}


def _evaluate(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    """("ready" | "pending" | "terminal", reason, message) for a Sandbox object."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    observed = status.get("observedGeneration")
    conds = _conditions(obj)
    disposed = conds.get("Disposed")
    if disposed is not None and disposed.get("status") == "True":
        return "terminal", disposed.get("reason") or "Disposed", disposed.get("message", "")
    admitted = conds.get("Admitted")
    stale = observed is not None and meta.get("generation") and observed < meta["generation"]
    if admitted is not None and admitted.get("status") == "False" and not stale:
        reason = admitted.get("reason", "")
        if acquire_error_for(reason) is not None:
            return "terminal", reason, admitted.get("message", "")
    ready = conds.get("Ready")
    if ready is not None and not stale:
        reason = ready.get("reason", "")
        if ready.get("status") == "True":
            return "ready", reason, ""
        if acquire_error_for(reason) is not None:
            return "terminal", reason, ready.get("message", "")
        return "pending", reason, ready.get("message", "")
    return "pending", (admitted or {}).get("reason", "") or "Pending", ""


class SandboxClient:
    """Async client for one namespace. Build it with :meth:`from_kubeconfig` or
    :meth:`in_cluster`, or hand it a configured ``kubernetes_asyncio`` ``ApiClient``.

    ``field_manager`` names this client in server-side apply (one per client by default).
    """

    def __init__(
        self,
        api_client: k8s.ApiClient,
        namespace: str,
        *,
        field_manager: str | None = None,
        default_timeout: float = 300.0,
    ) -> None:
        self.api = api_client
        self.namespace = namespace
        self.field_manager = field_manager or f"sandbox-client-{secrets.token_hex(4)}"
        self.default_timeout = default_timeout
        self.custom = k8s.CustomObjectsApi(api_client)
        self.ws_api = WsApiClient(configuration=api_client.configuration)

    # -- construction ---------------------------------------------------------------------

    @classmethod
    async def from_kubeconfig(
        cls,
        namespace: str,
        *,
        kubeconfig: str | os.PathLike[str] | None = None,
        context: str | None = None,
        **kwargs: Any,
    ) -> SandboxClient:
        cfg = k8s.Configuration()
        await k8s_config.load_kube_config(
            config_file=str(kubeconfig) if kubeconfig else None,
            context=context,
            client_configuration=cfg,
        )
        return cls(k8s.ApiClient(configuration=cfg), namespace, **kwargs)

    @classmethod
    def in_cluster(cls, namespace: str | None = None, **kwargs: Any) -> SandboxClient:
        """From the pod's service account (namespace: the pod's own unless given)."""
        cfg = k8s.Configuration()
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        if namespace is None:
            with open(_SA_NAMESPACE) as fh:
                namespace = fh.read().strip()
        return cls(k8s.ApiClient(configuration=cfg), namespace, **kwargs)

    async def close(self) -> None:
        await self.ws_api.close()
        await self.api.close()

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- host side: scopes ----------------------------------------------------------------

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

    async def delete_scope(
        self,
        name: str,
        *,
        wait: bool = False,
        timeout: float = 120.0,  # noqa: ASYNC109
    ) -> None:
        """Delete a SandboxScope (the operator disposes its sandboxes). Missing is success."""
        await self._delete(SANDBOX_SCOPE_PLURAL, name)
        if wait:
            await self._wait_gone(SANDBOX_SCOPE_PLURAL, name, timeout)

    # -- agent side -------------------------------------------------------------------------

    async def _read_scope(self, scope_ref: str) -> Mapping[str, Any]:
        try:
            obj: Mapping[str, Any] = await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, SANDBOX_SCOPE_PLURAL, scope_ref
            )
        except ApiException as exc:
            if exc.status == 403:
                raise SandboxForbidden(
                    namespace=self.namespace, action="get sandboxscopes"
                ) from None
            if exc.status == 404:
                raise SandboxScopeNotFound(
                    sandbox="", namespace=self.namespace, message=f"no SandboxScope {scope_ref!r}"
                ) from None
            raise
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            raise SandboxGone(
                sandbox="",
                namespace=self.namespace,
                reason="ScopeDeleted",
                message=f"SandboxScope {scope_ref!r} is being deleted",
            )
        return obj

    def key_for(self, scope_obj: Mapping[str, Any], agent_dir: str, call_id: str) -> SandboxKey:
        spec = scope_obj.get("spec") or {}
        return SandboxKey(
            scope=spec["scope"], thread_id=spec["threadId"], agent_dir=agent_dir, call_id=call_id
        )

    async def acquire(
        self,
        scope_ref: str,
        agent_dir: str,
        spec: SandboxSpec,
        call_id: str = "",
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Sandbox:
        """Get or create the sandbox for ``(scope_ref, agent_dir, call_id)`` and wait until it
        is Ready. Raises the typed exception of the reason the operator reports (refusals
        without waiting for the deadline) or :class:`SandboxNotReadyInTime`."""
        deadline = timeout if timeout is not None else self.default_timeout
        scope_obj = await self._read_scope(scope_ref)
        key = self.key_for(scope_obj, agent_dir, call_id)
        name = naming.sandbox_name(key)
        resource = SandboxResourceSpec.model_validate(
            {
                **spec.model_dump(exclude_unset=True),
                "scope_ref": scope_ref,
                "agent_dir": agent_dir,
                "call_id": call_id,
            }
        )
        body = {
            "apiVersion": API_VERSION,
            "kind": SANDBOX_KIND,
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": lbl.key_labels(key),
                "annotations": lbl.key_annotations(key),
            },
            "spec": resource.to_wire(),
        }
        last = {"reason": ""}
        try:
            async with asyncio.timeout(deadline):
                obj = await self._wait_ready(name, scope_ref, body, last)
        except TimeoutError:
            raise SandboxNotReadyInTime(
                sandbox=name, namespace=self.namespace, timeout=deadline, last_reason=last["reason"]
            ) from None
        dataplane = self._dataplane(obj)

        async def touch() -> None:
            await self.touch(name)

        return Sandbox(
            spec,
            dataplane,
            name=name,
            namespace=self.namespace,
            key=key,
            scope_ref=scope_ref,
            on_activity=touch,
        )

    async def touch(self, name: str) -> None:
        """Stamp the Sandbox's last-activity annotation (the operator's idle timeout counts from
        it). The handle does this by itself, at most every 30 seconds, while it is used."""
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        await self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            SANDBOX_PLURAL,
            name,
            {"metadata": {"annotations": {lbl.LAST_ACTIVITY_ANNOTATION: stamp}}},
            field_manager=f"{self.field_manager}-activity",
            _content_type="application/merge-patch+json",  # type: ignore[call-arg]
        )

    def _dataplane(self, obj: Mapping[str, Any]) -> DataPlane:
        served = (obj.get("status") or {}).get("servedBy") or {}
        factory = _DATAPLANES.get(served.get("kind", ""))
        if factory is None:
            raise DataPlaneError(f"no data plane for servedBy kind {served.get('kind')!r}")
        return factory(self, obj)

    async def _wait_ready(
        self, name: str, scope_ref: str, body: dict[str, Any], last: dict[str, str]
    ) -> Mapping[str, Any]:
        while True:
            obj = await self._apply(SANDBOX_PLURAL, name, body)
            if (obj.get("metadata") or {}).get("deletionTimestamp"):
                # A previous sandbox under this key is still going away: wait, then recreate.
                await self._wait_gone(SANDBOX_PLURAL, name, None)
                continue
            break
        sandbox_watch = asyncio.ensure_future(self._watch_sandbox(name, obj, last))
        scope_watch = asyncio.ensure_future(self._watch_scope_deleted(scope_ref))
        try:
            done, _ = await asyncio.wait(
                {sandbox_watch, scope_watch}, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in (sandbox_watch, scope_watch):
                task.cancel()
            await asyncio.gather(sandbox_watch, scope_watch, return_exceptions=True)
        if sandbox_watch in done:
            return sandbox_watch.result()
        scope_watch.result()
        raise SandboxGone(
            sandbox=name,
            namespace=self.namespace,
            reason="ScopeDeleted",
            message=f"SandboxScope {scope_ref!r} was deleted while waiting",
        )

    def _raise_terminal(self, name: str, reason: str, message: str) -> None:
        cls = acquire_error_for(reason) or SandboxAcquireError
        raise cls(sandbox=name, namespace=self.namespace, reason=reason, message=message)

    async def _watch_sandbox(
        self, name: str, obj: Mapping[str, Any], last: dict[str, str]
    ) -> Mapping[str, Any]:
        """Return the object once Ready; raise on a terminal reason or deletion."""
        while True:
            state, reason, message = _evaluate(obj)
            last["reason"] = reason
            if state == "ready":
                return obj
            if state == "terminal":
                self._raise_terminal(name, reason, message)
            if (obj.get("metadata") or {}).get("deletionTimestamp"):
                raise SandboxGone(
                    sandbox=name,
                    namespace=self.namespace,
                    reason="Deleted",
                    message="the Sandbox is being deleted",
                )
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            event = await self._next_event(SANDBOX_PLURAL, name, rv)
            if event is None:  # relist
                try:
                    obj = await self.custom.get_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, SANDBOX_PLURAL, name
                    )
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                    raise SandboxGone(
                        sandbox=name,
                        namespace=self.namespace,
                        reason="Deleted",
                        message="the Sandbox was deleted while waiting",
                    ) from None
                continue
            kind, new = event
            if kind == "DELETED":
                raise SandboxGone(
                    sandbox=name,
                    namespace=self.namespace,
                    reason="Deleted",
                    message="the Sandbox was deleted while waiting",
                )
            obj = new

    async def _next_event(
        self, plural: str, name: str, resource_version: str | None
    ) -> tuple[str, Mapping[str, Any]] | None:
        """The next event on one object after ``resource_version`` (None: relist needed)."""
        w = k8s_watch.Watch()
        try:
            stream = w.stream(
                self.custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                plural,
                field_selector=f"metadata.name={name}",
                resource_version=resource_version,
                timeout_seconds=60,
                allow_watch_bookmarks=False,
            )
            async for event in stream:
                kind = event.get("type", "")
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    return kind, event["object"]
        except ApiException as exc:
            if exc.status == 410:
                return None
            raise
        finally:
            w.stop()
            await w.close()
        return None

    async def _watch_scope_deleted(self, scope_ref: str) -> None:
        """Return when the SandboxScope is deleted or marked for deletion."""
        while True:
            try:
                obj = await self._read_scope(scope_ref)
            except (SandboxScopeNotFound, SandboxGone):
                return
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            while True:
                event = await self._next_event(SANDBOX_SCOPE_PLURAL, scope_ref, rv)
                if event is None:
                    break
                kind, new = event
                if kind == "DELETED" or (new.get("metadata") or {}).get("deletionTimestamp"):
                    return
                rv = (new.get("metadata") or {}).get("resourceVersion")

    async def dispose(self, sandbox: Sandbox | str, *, wait: bool = False) -> None:
        """Delete a Sandbox (by handle or name). Missing is success."""
        name = sandbox if isinstance(sandbox, str) else sandbox.name
        if not isinstance(sandbox, str):
            with contextlib.suppress(Exception):
                await sandbox.close()
        await self._delete(SANDBOX_PLURAL, name)
        if wait:
            await self._wait_gone(SANDBOX_PLURAL, name, 120.0)

    async def dispose_scope(self, scope_ref: str) -> int:
        """Delete every Sandbox of one SandboxScope in the namespace; returns how many deletes
        were issued. The SandboxScope itself is the host's to delete."""
        listing = await self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, SANDBOX_PLURAL
        )
        count = 0
        for item in listing.get("items", []):
            if (item.get("spec") or {}).get("scopeRef") == scope_ref:
                await self._delete(SANDBOX_PLURAL, item["metadata"]["name"])
                count += 1
        return count

    @contextlib.asynccontextmanager
    async def sandbox_for_call(
        self,
        scope_ref: str,
        agent_dir: str,
        spec: SandboxSpec,
        call_id: str | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> AsyncIterator[Sandbox]:
        """A sandbox created for one call (``isolationScope: call``) and deleted when the block
        exits, however it exits."""
        if spec.isolation_scope is not IsolationScope.CALL:
            spec = spec.model_copy(update={"isolation_scope": IsolationScope.CALL})
        call_id = call_id or secrets.token_hex(8)
        name: str | None = None
        try:
            sandbox = await self.acquire(scope_ref, agent_dir, spec, call_id, timeout=timeout)
            name = sandbox.name
            yield sandbox
        finally:
            if name is None:
                with contextlib.suppress(Exception):
                    scope_obj = await self._read_scope(scope_ref)
                    name = naming.sandbox_name(self.key_for(scope_obj, agent_dir, call_id))
            if name is not None:
                await asyncio.shield(self.dispose(name))

    # -- plumbing ---------------------------------------------------------------------------

    async def _apply(self, plural: str, name: str, body: dict[str, Any]) -> Mapping[str, Any]:
        try:
            obj: Mapping[str, Any] = await self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                plural,
                name,
                body,
                field_manager=self.field_manager,
                _content_type="application/apply-patch+yaml",  # type: ignore[call-arg]
            )
        except ApiException as exc:
            message = scrub(_api_message(exc))
            if exc.status == 403:
                raise SandboxForbidden(namespace=self.namespace, action=f"apply {plural}") from None
            if exc.status == 409:
                raise SandboxSpecConflict(
                    sandbox=name, namespace=self.namespace, message=message
                ) from None
            if exc.status in (400, 422):
                raise SandboxSpecRejected(
                    sandbox=name, namespace=self.namespace, message=message
                ) from None
            raise
        if not isinstance(obj, Mapping):
            # Some responses (e.g. a no-op apply) come back without a decoded body.
            obj = await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, name
            )
        return obj

    async def _delete(self, plural: str, name: str) -> None:
        try:
            await self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, name
            )
        except ApiException as exc:
            if exc.status == 403:
                raise SandboxForbidden(
                    namespace=self.namespace, action=f"delete {plural}"
                ) from None
            if exc.status != 404:
                raise

    async def _wait_gone(self, plural: str, name: str, timeout: float | None) -> None:  # noqa: ASYNC109
        async with asyncio.timeout(timeout):
            while True:
                try:
                    obj = await self.custom.get_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, plural, name
                    )
                except ApiException as exc:
                    if exc.status == 404:
                        return
                    raise
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                while True:
                    event = await self._next_event(plural, name, rv)
                    if event is None:
                        break
                    if event[0] == "DELETED":
                        return
                    rv = (event[1].get("metadata") or {}).get("resourceVersion")


def _api_message(exc: ApiException) -> str:
    import json

    try:
        doc = json.loads(exc.body or "{}")
    except (ValueError, TypeError):
        return exc.reason or ""
    return str(doc.get("message") or exc.reason or "")
