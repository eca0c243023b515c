"""The client's calls on the Kubernetes API: read, list, apply, patch and delete the custom objects
of one namespace, with the API's refusals turned into the client's typed errors.

:class:`SandboxObjects` exists so that the client's other parts (its watches, suspensions and
scopes, and :class:`~sandbox_operator.client.SandboxClient` itself) share one namespace, one API
and one field manager without sharing a base class, and so that there is one place an
``ApiException`` status becomes a :class:`SandboxForbidden`, :class:`SandboxGone`,
:class:`SandboxSpecConflict` or :class:`SandboxSpecRejected`. Each of them holds this object and
reads ``custom`` and ``namespace`` from it at each call, so swapping them here (a test's fake API
server, a client pointed at another namespace) swaps them for all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NoReturn, TypeVar

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from sandbox_operator import labels as lbl
from sandbox_operator.client.errors import (
    SandboxClientError,
    SandboxForbidden,
    SandboxGone,
    SandboxNotResettable,
    SandboxNotSuspendable,
    SandboxScopeNotFound,
    SandboxSpecConflict,
    SandboxSpecRejected,
    scrub,
)
from sandbox_operator.contract import GROUP, SANDBOX_PLURAL, SANDBOX_SCOPE_PLURAL, VERSION
from sandbox_operator.kubeapi import api_message
from sandbox_operator.kubecalls import call_json_status
from sandbox_operator.views import ListView, ObjectView, SandboxScopeView, SandboxView

#: Content types of the two kinds of patch the client sends.
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"

#: A body the client sends (a spec's fields, an apply's object): encoded, never read back.
Body = Mapping[str, object]

#: The view an answer is read through (the kind asked for decides it).
V = TypeVar("V", bound=ObjectView)


class SandboxObjects:
    """API calls on one namespace's Sandboxes and SandboxScopes (see the module): ``custom`` is
    the API they go through, ``field_manager`` names the client in server-side apply."""

    def __init__(self, custom: k8s.CustomObjectsApi, namespace: str, field_manager: str) -> None:
        self.custom = custom
        self.namespace = namespace
        self.field_manager = field_manager

    def refuse(
        self, exc: ApiException, action: str, missing: SandboxClientError | None = None
    ) -> NoReturn:
        """Raise the typed error of a refused call: 403 is :class:`SandboxForbidden`, 404 is
        ``missing`` when given; anything else is re-raised as it came."""
        if exc.status == 403:
            raise SandboxForbidden(namespace=self.namespace, action=action) from None
        if exc.status == 404 and missing is not None:
            raise missing from None
        raise exc

    def no_sandbox(self, name: str) -> SandboxGone:
        return SandboxGone(sandbox=name, namespace=self.namespace, message="no such Sandbox")

    async def get(self, plural: str, name: str, view: type[V]) -> V:
        """One object, as the API returns it, read through ``view`` (``ApiException`` as it
        came)."""
        return view(
            await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, name
            )
        )

    async def get_sandbox(self, name: str) -> SandboxView:
        try:
            return await self.get(SANDBOX_PLURAL, name, SandboxView)
        except ApiException as exc:
            self.refuse(exc, "get sandboxes", self.no_sandbox(name))

    async def read_scope(self, scope_ref: str) -> SandboxScopeView:
        """The SandboxScope ``scope_ref``; missing or being deleted raises."""
        try:
            obj = await self.get(SANDBOX_SCOPE_PLURAL, scope_ref, SandboxScopeView)
        except ApiException as exc:
            missing = SandboxScopeNotFound(
                sandbox="", namespace=self.namespace, message=f"no SandboxScope {scope_ref!r}"
            )
            self.refuse(exc, "get sandboxscopes", missing)
        if obj.metadata.deleting:
            raise SandboxGone(
                sandbox="",
                namespace=self.namespace,
                reason="ScopeDeleted",
                message=f"SandboxScope {scope_ref!r} is being deleted",
            )
        return obj

    async def list_objects(self, plural: str, view: type[V]) -> list[V]:
        """Every object of ``plural`` in the namespace, each read through ``view``
        (``ApiException`` as it came)."""
        listing = ListView(
            await self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, plural)
        )
        return [view(item) for item in listing.objects]

    async def patch(self, name: str, body: Body, *, manager: str, content_type: str) -> SandboxView:
        """Patch one Sandbox; a response without a decoded body (e.g. a no-op apply) is read."""
        obj: object = await self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            SANDBOX_PLURAL,
            name,
            body,
            field_manager=manager,
            _content_type=content_type,  # type: ignore[call-arg]
        )
        if isinstance(obj, Mapping):
            return SandboxView(obj)
        return await self.get(SANDBOX_PLURAL, name, SandboxView)

    async def patch_created(
        self, plural: str, name: str, body: Body, view: type[V], *, manager: str, content_type: str
    ) -> tuple[V, bool]:
        """:meth:`patch`, and whether this request created the object (HTTP 201: of several
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
        return view(obj), status == 201

    async def apply(self, plural: str, name: str, body: Body, view: type[V]) -> V:
        """Server-side apply ``body`` as this client's field manager."""
        obj, _ = await self.apply_created(plural, name, body, view)
        return obj

    async def apply_created(
        self, plural: str, name: str, body: Body, view: type[V]
    ) -> tuple[V, bool]:
        """:meth:`apply`, and whether this apply created the object."""
        try:
            return await self.patch_created(
                plural, name, body, view, manager=self.field_manager, content_type=APPLY_PATCH
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
            self.refuse(exc, f"apply {plural}")

    async def edit_spec(
        self,
        name: str,
        fields: Body,
        *,
        manager: str,
        refused: Callable[[str], SandboxClientError],
    ) -> SandboxView:
        """Merge-patch spec fields an edit sets (``suspended``, ``resets``, the egress lists) as
        this client's ``-<manager>`` field manager. The API server's refusal of the values (400,
        422) raises ``refused(message)``."""
        try:
            return await self.patch(
                name,
                {"spec": dict(fields)},
                manager=f"{self.field_manager}-{manager}",
                content_type=MERGE_PATCH,
            )
        except ApiException as exc:
            message = scrub(api_message(exc))
            if exc.status in (400, 422):
                raise refused(message) from None
            self.refuse(exc, "patch sandboxes", self.no_sandbox(name))

    async def patch_suspended(self, name: str, value: bool) -> SandboxView:
        """Set ``spec.suspended``."""

        def refused(message: str) -> SandboxClientError:
            where = {"sandbox": name, "namespace": self.namespace, "message": message}
            if value and "storage" in message:
                return SandboxNotSuspendable(**where)
            return SandboxSpecRejected(**where)

        return await self.edit_spec(name, {"suspended": value}, manager="suspend", refused=refused)

    async def patch_resets(self, name: str, count: int) -> SandboxView:
        """Set ``spec.resets``. The CRD refuses a lower count, or any with storage."""

        def refused(message: str) -> SandboxClientError:
            return SandboxNotResettable(sandbox=name, namespace=self.namespace, message=message)

        return await self.edit_spec(name, {"resets": count}, manager="reset", refused=refused)

    async def annotate_activity(self, name: str, stamp: str) -> None:
        """Set the Sandbox's last-activity annotation (a merge patch, as this client's
        ``-activity`` field manager); the answer is not read."""
        await self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            SANDBOX_PLURAL,
            name,
            {"metadata": {"annotations": {lbl.LAST_ACTIVITY_ANNOTATION: stamp}}},
            field_manager=f"{self.field_manager}-activity",
            _content_type=MERGE_PATCH,  # type: ignore[call-arg]
        )

    async def delete(
        self, plural: str, name: str, view: type[V], *, uid: str | None = None
    ) -> V | None:
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
            self.refuse(exc, f"delete {plural}")
        if isinstance(answer, Mapping) and (left := view(answer)).metadata.deleting:
            return left
        return None
