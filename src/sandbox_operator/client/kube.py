"""The client's calls on the Kubernetes API: read, apply, patch and delete the custom objects of
one namespace, with the API's refusals turned into the client's typed errors.

:class:`KubeCalls` is the base of :class:`~sandbox_operator.client.SandboxClient`'s method groups
(watching, suspension, scopes): it declares what every group reads from the client and is the one
place an ``ApiException`` status becomes a :class:`SandboxForbidden`, :class:`SandboxGone`,
:class:`SandboxSpecConflict` or :class:`SandboxSpecRejected`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from sandbox_operator.client.errors import (
    SandboxClientError,
    SandboxForbidden,
    SandboxGone,
    SandboxNotSuspendable,
    SandboxScopeNotFound,
    SandboxSpecConflict,
    SandboxSpecRejected,
    scrub,
)
from sandbox_operator.client.observer import SandboxObserver
from sandbox_operator.contract import GROUP, SANDBOX_PLURAL, SANDBOX_SCOPE_PLURAL, VERSION
from sandbox_operator.kubeapi import api_message
from sandbox_operator.kubecalls import call_json_status

#: Content types of the two kinds of patch the client sends.
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"


class KubeCalls:
    """API calls on one namespace's Sandboxes and SandboxScopes (see the module)."""

    custom: k8s.CustomObjectsApi
    namespace: str
    field_manager: str
    default_timeout: float
    observer: SandboxObserver | None

    def _refuse(
        self, exc: ApiException, action: str, missing: SandboxClientError | None = None
    ) -> NoReturn:
        """Raise the typed error of a refused call: 403 is :class:`SandboxForbidden`, 404 is
        ``missing`` when given; anything else is re-raised as it came."""
        if exc.status == 403:
            raise SandboxForbidden(namespace=self.namespace, action=action) from None
        if exc.status == 404 and missing is not None:
            raise missing from None
        raise exc

    def _no_sandbox(self, name: str) -> SandboxGone:
        return SandboxGone(sandbox=name, namespace=self.namespace, message="no such Sandbox")

    async def _get_object(self, plural: str, name: str) -> Mapping[str, Any]:
        """One object, as the API returns it (``ApiException`` as it came)."""
        obj: Mapping[str, Any] = await self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, plural, name
        )
        return obj

    async def _get_sandbox(self, name: str) -> Mapping[str, Any]:
        try:
            return await self._get_object(SANDBOX_PLURAL, name)
        except ApiException as exc:
            self._refuse(exc, "get sandboxes", self._no_sandbox(name))

    async def _read_scope(self, scope_ref: str) -> Mapping[str, Any]:
        """The SandboxScope ``scope_ref``; missing or being deleted raises."""
        try:
            obj = await self._get_object(SANDBOX_SCOPE_PLURAL, scope_ref)
        except ApiException as exc:
            missing = SandboxScopeNotFound(
                sandbox="", namespace=self.namespace, message=f"no SandboxScope {scope_ref!r}"
            )
            self._refuse(exc, "get sandboxscopes", missing)
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            raise SandboxGone(
                sandbox="",
                namespace=self.namespace,
                reason="ScopeDeleted",
                message=f"SandboxScope {scope_ref!r} is being deleted",
            )
        return obj

    async def _patch(
        self, plural: str, name: str, body: Mapping[str, Any], *, manager: str, content_type: str
    ) -> Mapping[str, Any]:
        """Patch one object; a response without a decoded body (e.g. a no-op apply) is read."""
        obj: object = await self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            plural,
            name,
            body,
            field_manager=manager,
            _content_type=content_type,  # type: ignore[call-arg]
        )
        if isinstance(obj, Mapping):
            return obj
        return await self._get_object(plural, name)

    async def _patch_created(
        self, plural: str, name: str, body: Mapping[str, Any], *, manager: str, content_type: str
    ) -> tuple[Mapping[str, Any], bool]:
        """:meth:`_patch`, and whether this request created the object (HTTP 201: of several
        concurrent applies of one name, exactly one gets it).

        The answer is decoded here: the generated client decodes a 200's body only (a create's
        201 comes back as None), and reading the object again would cost a request and need
        ``get``, which an agent bound to its conversation has on a new Sandbox only once the
        operator has named it in the conversation's Role (docs/concepts.md)."""
        obj, status = await call_json_status(
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            plural,
            name,
            body,
            field_manager=manager,
            _content_type=content_type,
        )
        return obj, status == 201

    async def _apply(self, plural: str, name: str, body: dict[str, Any]) -> Mapping[str, Any]:
        """Server-side apply ``body`` as this client's field manager."""
        obj, _ = await self._apply_created(plural, name, body)
        return obj

    async def _apply_created(
        self, plural: str, name: str, body: dict[str, Any]
    ) -> tuple[Mapping[str, Any], bool]:
        """:meth:`_apply`, and whether this apply created the object."""
        try:
            return await self._patch_created(
                plural, name, body, manager=self.field_manager, content_type=APPLY_PATCH
            )
        except ApiException as exc:
            message = scrub(api_message(exc))
            if exc.status == 409:
                raise SandboxSpecConflict(
                    sandbox=name, namespace=self.namespace, message=message
                ) from None
            if exc.status in (400, 422):
                raise SandboxSpecRejected(
                    sandbox=name, namespace=self.namespace, message=message
                ) from None
            self._refuse(exc, f"apply {plural}")

    async def _patch_suspended(self, name: str, value: bool) -> Mapping[str, Any]:
        """Set ``spec.suspended`` (a merge patch: the acquirer's apply does not own it)."""
        try:
            return await self._patch(
                SANDBOX_PLURAL,
                name,
                {"spec": {"suspended": value}},
                manager=f"{self.field_manager}-suspend",
                content_type=MERGE_PATCH,
            )
        except ApiException as exc:
            message = scrub(api_message(exc))
            if exc.status in (400, 422):
                if value and "storage" in message:
                    raise SandboxNotSuspendable(
                        sandbox=name, namespace=self.namespace, message=message
                    ) from None
                raise SandboxSpecRejected(
                    sandbox=name, namespace=self.namespace, message=message
                ) from None
            self._refuse(exc, "patch sandboxes", self._no_sandbox(name))

    async def _delete(
        self, plural: str, name: str, *, uid: str | None = None
    ) -> Mapping[str, Any] | None:
        """Delete one object; missing is success. With ``uid``, only that very object: the API
        server refuses the delete (409) when the name now holds another one (a replacement), which
        is success too, because the object meant is gone.

        Returns the object as the delete left it when a finalizer holds it (being deleted), else
        None (gone at once, or missing)."""
        try:
            if uid:
                answer = await self.custom.delete_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    self.namespace,
                    plural,
                    name,
                    body=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid)),
                )
            else:
                answer = await self.custom.delete_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, plural, name
                )
        except ApiException as exc:
            if exc.status == 404 or (uid and exc.status == 409):
                return None
            self._refuse(exc, f"delete {plural}")
        if isinstance(answer, Mapping) and (answer.get("metadata") or {}).get("deletionTimestamp"):
            return answer
        return None
