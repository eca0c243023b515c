"""The few Kubernetes calls the reconcilers make, over kubernetes_asyncio.

Every call the operator makes on its own resources goes through here (pods and NetworkPolicies go
through the runtime-class driver), so the RBAC rules the Helm chart grants can be read off this
file: sandboxes and sandboxscopes get/list/watch/patch/delete, their status patch, events create,
and the apply (create, patch) of a conversation's Role and RoleBinding.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, TypeVar

from sandbox_operator import kubeobj
from sandbox_operator.backends.manifests import MetadataPatch, ObjectMeta, Role, RoleBinding
from sandbox_operator.contract import (
    API_VERSION,
    GROUP,
    SANDBOX_PLURAL,
    SANDBOX_SCOPE_PLURAL,
    VERSION,
)
from sandbox_operator.reconcile.conditions import now_rfc3339
from sandbox_operator.reconcile.manifests import EventBody, StatusPatch
from sandbox_operator.views import (
    ApiStatusView,
    ListView,
    ObjectView,
    PodView,
    SandboxScopeView,
    SandboxView,
)
from sandbox_operator.views.fields import mapping

log = logging.getLogger(__name__)

REPORTING_COMPONENT = "sandbox-operator"

V = TypeVar("V", bound=ObjectView)


class Conflict(Exception):
    """The object changed since it was read (optimistic concurrency); read again and retry."""


class Kube:
    def __init__(self, api: Any) -> None:
        from kubernetes_asyncio import client

        self.api = api
        self._custom: Any = client.CustomObjectsApi(api)
        self._core: Any = client.CoreV1Api(api)
        self._rbac: Any = client.RbacAuthorizationV1Api(api)

    @staticmethod
    def _status(exc: Exception) -> int | None:
        return getattr(exc, "status", None)

    async def _get(self, plural: str, namespace: str, name: str, view: type[V]) -> V | None:
        """The object as the API answers it, in ``view`` (None: 404)."""
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            obj = await self._custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return view(mapping(obj))

    async def get_sandbox(self, namespace: str, name: str) -> SandboxView | None:
        return await self._get(SANDBOX_PLURAL, namespace, name, SandboxView)

    async def get_scope(self, namespace: str, name: str) -> SandboxScopeView | None:
        return await self._get(SANDBOX_SCOPE_PLURAL, namespace, name, SandboxScopeView)

    async def get_pod(self, namespace: str, name: str) -> PodView | None:
        """A pod (a view over its JSON), None when there is none: only to confirm the views
        before a Ready sandbox is taken for lost (the runtime-class driver makes every other
        pod call)."""
        from kubernetes_asyncio.client.exceptions import ApiException

        from sandbox_operator.kubecalls import call_json

        try:
            return PodView(await call_json(self._core.read_namespaced_pod, name, namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def list_sandboxes(
        self, namespace: str, label_selector: str | None = None
    ) -> list[SandboxView]:
        selector = {"label_selector": label_selector} if label_selector else {}
        result = await self._custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, SANDBOX_PLURAL, **selector
        )
        return [SandboxView(mapping(item)) for item in ListView(result).objects]

    async def _patch(
        self,
        plural: str,
        namespace: str,
        name: str,
        body: StatusPatch | MetadataPatch,
        *,
        status: bool,
    ) -> ObjectView | None:
        from kubernetes_asyncio.client.exceptions import ApiException

        call = (
            self._custom.patch_namespaced_custom_object_status
            if status
            else self._custom.patch_namespaced_custom_object
        )
        try:
            result = await call(
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                body,
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(name) from None
            if exc.status == 404:
                return None
            raise
        return ObjectView(mapping(result))

    async def patch_status(
        self,
        plural: str,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        resource_version: str | None,
    ) -> ObjectView | None:
        """Merge ``status`` (the JSON its kind's model encoded) into the status subresource;
        the object as written, None when it is gone."""
        body: StatusPatch = {"status": dict(status)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return await self._patch(plural, namespace, name, body, status=True)

    async def patch_metadata(
        self,
        plural: str,
        namespace: str,
        name: str,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        *,
        finalizers: list[str] | None = None,
        resource_version: str | None = None,
    ) -> ObjectView | None:
        """Merge labels and annotations in; replace the finalizer list when given (then with
        ``resource_version`` as a precondition, so a finalizer someone else added meanwhile is
        never dropped: a 409 raises :class:`Conflict`)."""
        meta: ObjectMeta = {}
        if labels:
            meta["labels"] = dict(labels)
        if annotations:
            meta["annotations"] = dict(annotations)
        if finalizers is not None:
            meta["finalizers"] = list(finalizers)
        if resource_version:
            meta["resourceVersion"] = resource_version
        return await self._patch(plural, namespace, name, {"metadata": meta}, status=False)

    async def apply_rbac(self, body: Role | RoleBinding, field_manager: str) -> None:
        """Server-side apply one Role or RoleBinding (``reconcile/access.py``), forcing
        ownership of its fields: the operator is the only writer of what it makes."""
        call = (
            self._rbac.patch_namespaced_role
            if body["kind"] == kubeobj.ROLE_KIND
            else self._rbac.patch_namespaced_role_binding
        )
        meta = body["metadata"]
        await call(
            meta["name"],
            meta["namespace"],
            body,
            field_manager=field_manager,
            force=True,
            _content_type="application/apply-patch+yaml",
        )

    async def delete_sandboxes(self, namespace: str, label_selector: str) -> None:
        """Delete every Sandbox matching the selector in one call (``deletecollection``)."""
        await self._custom.delete_collection_namespaced_custom_object(
            GROUP, VERSION, namespace, SANDBOX_PLURAL, label_selector=label_selector
        )

    async def delete_sandbox(self, namespace: str, name: str) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            await self._custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, SANDBOX_PLURAL, name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def post_event(
        self,
        obj: ObjectView,
        *,
        type_: str,
        reason: str,
        message: str,
        action: str = "Reconcile",
    ) -> None:
        """Record a Kubernetes Event about ``obj``; failures are logged, never raised."""
        meta = obj.metadata
        namespace = meta.namespace or "default"
        stamp = now_rfc3339()
        body: EventBody = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": f"{(meta.name if 'name' in meta else 'object')[:200]}.",
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": obj.api_version if "apiVersion" in obj else API_VERSION,
                "kind": obj.kind,
                "name": meta.name,
                "namespace": namespace,
                "uid": meta.uid,
                "resourceVersion": meta.resource_version,
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "action": action,
            "source": {"component": REPORTING_COMPONENT},
            "reportingComponent": REPORTING_COMPONENT,
            "reportingInstance": REPORTING_COMPONENT,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self._core.create_namespaced_event(namespace, body)
        except Exception as exc:  # an Event is a courtesy; never fail a reconcile over it
            detail = getattr(exc, "status", type(exc).__name__)
            log.warning("could not record event %s on %s: %s", reason, meta.name, detail)


def api_error_text(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if body:
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if isinstance(doc, Mapping):
            return ApiStatusView(doc).message[:500]
    return type(exc).__name__
