"""The egress proxy the operator runs itself: one per namespace with allowlisted sandboxes.

Why per namespace: the proxy tells sandboxes apart by pod IP and keeps its table from the
Sandboxes it may read, so its ServiceAccount needs read access to Sandboxes and pods and the
right to post Events. Per namespace that is a namespaced Role, so one namespace's proxy never
sees another namespace's Sandboxes, and a namespace's sandboxes share one pod (about 40 MiB)
instead of a pod each on their critical path (docs/egress-managed.md).

Objects, all named ``sandbox-egress-proxy`` in the sandbox's namespace and labelled
:func:`proxy_labels`: a ServiceAccount, a Role (:data:`PROXY_ROLE_RULES`) and its RoleBinding, a
ConfigMap with the proxy's config file (the operator-level ``egressProxy.config``, no sandboxes:
the proxy keeps its own table with ``--kube-namespace``), a Deployment of one hardened pod and a
ClusterIP Service. Sandboxes under allowlist resolve no names (their NetworkPolicy allows only the
proxy), so they get the Service's cluster IP as a number.

Lifecycle, declarative: every object carries a (non-controller) ownerReference to each
allowlisted Sandbox it serves, so Kubernetes' garbage collector removes the proxy once the last
of them is gone; the operator never deletes it. The references are kept with server-side apply:
the full object is applied under one field manager (:data:`FIELD_MANAGER`, which also applies the
Sandbox that is being ensured, so an object is never created without an owner), and each Sandbox's
reference once more under a field manager of its own (``.../<sandbox uid>``). An apply keeps list
entries any other manager still applies, so one Sandbox's ensure never drops another's reference,
and the garbage collector's removal of a gone owner's reference takes that manager's claim with it.

Recovery: the garbage collector may delete the proxy while a new Sandbox is adding its reference
(it decided on the owners it saw). Each sandbox pod records the address it was given
(:data:`PROXY_ADDRESS_ANNOTATION`); a Service that is re-created asks for that cluster IP back, so
sandboxes that are already running keep working. When the address cannot be had back the sandbox
is reported Failed rather than left without egress (:meth:`ManagedEgressProxy.check`).

Builders are pure (tested without a cluster); :class:`ManagedEgressProxy` applies them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from sandbox_operator import kubeobj
from sandbox_operator import labels as lbl
from sandbox_operator.backends.base import PoolRef, SandboxRef
from sandbox_operator.backends.egress_proxy_ca import namespace_ca
from sandbox_operator.backends.egress_proxy_objects import (
    APPLIED,
    APPLY_CONTENT_TYPE,
    COMPONENT,
    CONFIG_CHECKSUM_ANNOTATION,
    CONFIG_DIR,
    CONFIG_FILE,
    CONTAINER_NAME,
    FIELD_MANAGER,
    INTERCEPTION_APPLIED,
    PROXY_ADDRESS_ANNOTATION,
    PROXY_NAME,
    PROXY_ROLE_RULES,
    PROXY_UID,
    SERVICE_CHECK_SECONDS,
    ProxyAddress,
    ProxyCA,
    build_ca_secret,
    build_config_map,
    build_deployment,
    build_objects,
    build_role,
    build_role_binding,
    build_service,
    build_service_account,
    owner_only,
    proxy_config_text,
    proxy_labels,
    recorded_address,
    sandbox_field_manager,
    service_address,
    with_owner,
)
from sandbox_operator.backends.manifests import OwnerReferencesOnly, ProxyObject
from sandbox_operator.egress.config import ManagedEgressProxySettings
from sandbox_operator.kubeapi import api_message
from sandbox_operator.kubecalls import read_or_none
from sandbox_operator.views import ObjectView, PodView, ServiceView

log = logging.getLogger(__name__)

__all__ = [
    "APPLIED",
    "APPLY_CONTENT_TYPE",
    "COMPONENT",
    "CONFIG_CHECKSUM_ANNOTATION",
    "CONFIG_DIR",
    "CONFIG_FILE",
    "CONTAINER_NAME",
    "ESCALATION_MARK",
    "FIELD_MANAGER",
    "INTERCEPTION_APPLIED",
    "PROXY_ADDRESS_ANNOTATION",
    "PROXY_NAME",
    "PROXY_ROLE_RULES",
    "PROXY_UID",
    "SERVICE_CHECK_SECONDS",
    "ManagedEgressProxy",
    "ProxyAddress",
    "ProxyCA",
    "ProxyError",
    "build_ca_secret",
    "build_config_map",
    "build_deployment",
    "build_objects",
    "build_role",
    "build_role_binding",
    "build_service",
    "build_service_account",
    "owner_only",
    "proxy_config_text",
    "proxy_labels",
    "recorded_address",
    "sandbox_field_manager",
    "service_address",
    "with_owner",
]


class ProxyError(Exception):
    """Applying the proxy's objects did not work. ``permanent``: retrying will not help (the API
    server refused the object: RBAC, validation); otherwise a later attempt may succeed."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.message = message
        self.permanent = permanent


# --------------------------------------------------------------------------------------------
# Applying


ESCALATION_MARK = "attempting to grant RBAC permissions not currently held"


def _api_message(exc: Any) -> str:
    message = api_message(exc)
    if ESCALATION_MARK in message:
        # The API server's text starts with the user and all its groups; what helps is the rest.
        missing = " ".join(message.split(ESCALATION_MARK, 1)[1].split()).lstrip(":").strip()
        return (
            "the operator does not hold every permission the proxy's Role grants (RBAC refuses "
            f"escalation; the chart grants them with config.egressProxy); missing: {missing}"
        )[:500]
    return message[:300]


class ManagedEgressProxy:
    """Applies a namespace's proxy objects and checks a sandbox's proxy is still where it was.

    ``api`` is a :class:`kubernetes_asyncio.client.ApiClient`.
    """

    def __init__(self, settings: ManagedEgressProxySettings, api: Any) -> None:
        from kubernetes_asyncio import client

        self.settings = settings
        self._api = api
        # Typed as Any: bodies are plain manifests (dicts), which the client serializes as is.
        self._core: Any = client.CoreV1Api(api)
        self._rbac: Any = client.RbacAuthorizationV1Api(api)
        self._apps: Any = client.AppsV1Api(api)
        # The Service as last read or applied, per namespace, for `check`: a pass over every
        # allowlisted sandbox of a namespace reads it at most once per SERVICE_CHECK_SECONDS.
        self._seen_service: dict[str, tuple[float, ServiceView | None]] = {}
        self._namespaces: set[str] = set()  # where a proxy was ensured or checked
        # One ensure at a time per namespace: the allowlisted sandboxes of a namespace whose
        # Service went away are all woken at once, and two restores racing to create the Service
        # with the recorded address would have the API server refuse the second (422: the IP is
        # allocated), which reads as a permanent loss. In turn, each sees the one before it.
        self._ensuring: dict[str, asyncio.Lock] = {}
        # The interception CA per namespace, read (or made) once (egress_proxy_ca).
        self._cas: dict[str, ProxyCA] = {}

    def _apply_call(self, kind: str) -> Callable[..., Any]:
        if kind == "Secret":  # only while the proxy terminates TLS
            return self._core.patch_namespaced_secret  # type: ignore[no-any-return]
        calls: dict[str, Callable[..., Any]] = {
            kubeobj.SERVICE_ACCOUNT_KIND: self._core.patch_namespaced_service_account,
            kubeobj.ROLE_KIND: self._rbac.patch_namespaced_role,
            kubeobj.ROLE_BINDING_KIND: self._rbac.patch_namespaced_role_binding,
            "ConfigMap": self._core.patch_namespaced_config_map,
            "Deployment": self._apps.patch_namespaced_deployment,
            "Service": self._core.patch_namespaced_service,
        }
        return calls[kind]

    async def _apply(self, body: ProxyObject | OwnerReferencesOnly, manager: str) -> ObjectView:
        """Server-side apply ``body`` under ``manager``; the object as the API server answers."""
        from kubernetes_asyncio.client.exceptions import ApiException

        meta = body["metadata"]
        try:
            result = await self._apply_call(body["kind"])(
                meta["name"],
                meta["namespace"],
                body,
                field_manager=manager,
                force=True,
                _content_type=APPLY_CONTENT_TYPE,
            )
        except ApiException as exc:
            status = exc.status or 0
            permanent = 400 <= status < 500 and status not in (404, 409, 429)
            raise ProxyError(
                f"egress proxy {body['kind']} {PROXY_NAME} was refused by the API server "
                f"(HTTP {status}): {_api_message(exc)}",
                permanent=permanent,
            ) from None
        return ObjectView(self._api.sanitize_for_serialization(result))

    async def read_service(self, namespace: str) -> ServiceView | None:
        found = await read_or_none(
            self._api, self._core.read_namespaced_service, PROXY_NAME, namespace
        )
        return None if found is None else ServiceView(found)

    async def _recorded(self, namespace: str) -> ProxyAddress | None:
        """The address live sandbox pods of the namespace were given (one list call)."""
        pods = await self._core.list_namespaced_pod(
            namespace,
            label_selector=lbl.format_selector({lbl.MANAGED_BY_LABEL: lbl.MANAGED_BY_VALUE}),
        )
        return recorded_address(
            PodView(self._api.sanitize_for_serialization(p)) for p in pods.items
        )

    async def ensure(
        self, namespace: str, sandbox: SandboxRef | PoolRef, *, want: ProxyAddress | None = None
    ) -> ProxyAddress:
        """Apply the namespace's proxy objects with ``sandbox`` among their owners; return the
        Service's address (see ``_ensure``). One at a time per namespace."""
        lock = self._ensuring.setdefault(namespace, asyncio.Lock())
        async with lock:
            address = await self._ensure(namespace, sandbox, want=want)
        return dataclasses.replace(address, intercepting=self.intercepting)

    @property
    def intercepting(self) -> bool:
        """Whether the proxy terminates TLS for hosts whose rules name https (its CA trusted)."""
        return self.settings.config.interception.enabled

    async def _ensure(
        self, namespace: str, sandbox: SandboxRef | PoolRef, *, want: ProxyAddress | None = None
    ) -> ProxyAddress:
        """Apply the namespace's proxy objects with ``sandbox`` among their owners; return the
        Service's address. (A SandboxWarmPool owns them too while it keeps allowlist pods: each
        pod is given the address before any Sandbox claims it.)

        A missing Service is created with the address recorded on the namespace's sandbox pods
        (or ``want``), so running sandboxes keep working. If that address cannot be had back, a
        new Sandbox (no ``want``) takes a fresh one (the others are then reported by
        :meth:`check`); with ``want`` a :class:`ProxyError` is raised instead.
        """
        from kubernetes_asyncio.client.exceptions import ApiException

        strict = want is not None
        try:
            current = service_address(await self.read_service(namespace))
            if current is None and want is None:
                want = await self._recorded(namespace)
        except ApiException as exc:
            forbidden = exc.status in (401, 403)
            raise ProxyError(
                f"reading the egress proxy Service {PROXY_NAME} failed (HTTP {exc.status})"
                + (
                    ": the operator lacks the grants for the egress proxy it runs (the chart "
                    "gives them with config.egressProxy)"
                    if forbidden
                    else ""
                ),
                permanent=forbidden,
            ) from None
        ask = current or want
        own = sandbox_field_manager(sandbox)
        service: ServiceView | None = None
        ca = await self._ca(namespace) if self.intercepting else None
        for obj in build_objects(namespace, self.settings, ask.ip if ask else None, ca):
            try:
                applied = await self._apply(with_owner(obj, sandbox), FIELD_MANAGER)
            except ProxyError as exc:
                if obj["kind"] != "Service" or current is not None or ask is None:
                    raise
                if strict or not exc.permanent:
                    raise
                # The recorded address is taken or invalid: a new Sandbox gets a fresh one;
                # the sandboxes given the old one are reported Failed by `check`.
                log.warning(
                    "namespace %s: the egress proxy Service cannot have its recorded address "
                    "back (%s); it gets a new one",
                    namespace,
                    exc.message,
                )
                obj = build_service(namespace, self.settings)
                applied = await self._apply(with_owner(obj, sandbox), FIELD_MANAGER)
            if sandbox.uid:
                await self._apply(owner_only(obj, sandbox), own)
            if obj["kind"] == "Service":
                service = ServiceView(applied.raw)
        address = service_address(service)
        if address is None:
            raise ProxyError("the egress proxy Service has no cluster IP", permanent=True)
        self._seen_service[namespace] = (time.monotonic(), service)
        self._namespaces.add(namespace)
        return address

    async def _ca(self, namespace: str) -> ProxyCA:
        from kubernetes_asyncio.client.exceptions import ApiException

        ca = self._cas.get(namespace)
        if ca is None:
            try:
                secret = await self._core.read_namespaced_secret(PROXY_NAME, namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise ProxyError(
                        f"reading the egress proxy Secret {PROXY_NAME} failed (HTTP {exc.status})",
                        permanent=exc.status in (401, 403),
                    ) from None
                secret = None
            ca = self._cas[namespace] = namespace_ca(secret)
        return ca

    def seen_address(self, namespace: str) -> ProxyAddress | None:
        """The namespace's proxy address as last seen (by ``ensure`` or the periodic look), if
        seen lately; None when not seen lately (nothing is read here)."""
        seen = self._seen_service.get(namespace)
        if seen is None or time.monotonic() - seen[0] > 2 * SERVICE_CHECK_SECONDS + 1:
            return None
        return service_address(seen[1])

    async def _service_for_check(self, namespace: str) -> ServiceView | None:
        """The namespace's Service as last seen, if seen lately (by ``ensure`` or the periodic
        look); else read now."""
        self._namespaces.add(namespace)
        seen = self._seen_service.get(namespace)
        if seen is not None and time.monotonic() - seen[0] < 2 * SERVICE_CHECK_SECONDS + 1:
            return seen[1]
        service = await self.read_service(namespace)
        self._seen_service[namespace] = (time.monotonic(), service)
        return service

    async def look_once(self, changed: Callable[[str], None]) -> None:
        """Read each known namespace's Service once; call ``changed(namespace)`` where it went
        away or its address moved since the last look."""
        from kubernetes_asyncio.client.exceptions import ApiException

        for namespace in sorted(self._namespaces):
            try:
                service = await self.read_service(namespace)
            except ApiException as exc:
                log.debug("namespace %s: reading the proxy Service: HTTP %s", namespace, exc.status)
                continue
            before = self._seen_service.get(namespace)
            self._seen_service[namespace] = (time.monotonic(), service)
            if before is None or service_address(before[1]) != service_address(service):
                changed(namespace)

    async def watch_services(self, changed: Callable[[str], None]) -> None:
        """Look at every known namespace's Service every ``SERVICE_CHECK_SECONDS``, forever."""
        while True:
            await asyncio.sleep(SERVICE_CHECK_SECONDS)
            try:
                await self.look_once(changed)
            except Exception:  # never let the loop die; the next look tries again
                log.exception("looking at the egress proxy Services failed")

    async def check(self, namespace: str, sandbox: SandboxRef, given: ProxyAddress) -> str:
        """Is the proxy still at the address this sandbox was given? "" if so (restoring a
        Service that went away, with that address), else why not, for a Failed condition.

        At most one GET of the Service per namespace every ``SERVICE_CHECK_SECONDS`` when all is
        well (however many sandboxes of the namespace are passed over); errors reading it are not
        the sandbox's failure (the next pass looks again).
        """
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            service = await self._service_for_check(namespace)
        except ApiException as exc:
            log.debug(
                "namespace %s: reading the egress proxy Service: HTTP %s", namespace, exc.status
            )
            return ""
        current = service_address(service)
        if current is not None:
            if current != given:
                return (
                    "the namespace's egress proxy Service was re-created with another address "
                    "than the one this sandbox was given, so its allowlisted egress is lost"
                )
            refs = service.metadata.owner_references if service is not None else []
            owners = {o.uid for o in refs}
            if sandbox.uid and sandbox.uid not in owners:
                # An ensure that stopped half-way: put this Sandbox's reference back.
                try:
                    await self.ensure(namespace, sandbox, want=given)
                except ProxyError as exc:
                    log.warning("namespace %s: re-adding an egress proxy owner: %s", namespace, exc)
            return ""
        try:
            restored = await self.ensure(namespace, sandbox, want=given)
        except ProxyError as exc:
            if not exc.permanent:
                return ""
            return (
                "the namespace's egress proxy was removed and could not be restored at the "
                f"address this sandbox was given: {exc.message}"
            )
        if restored != given:
            return (
                "the namespace's egress proxy was removed and came back with another address "
                "than the one this sandbox was given, so its allowlisted egress is lost"
            )
        log.info("namespace %s: egress proxy restored at its recorded address", namespace)
        return ""
