"""The egress proxy the operator runs itself: one per namespace with allowlisted sandboxes.

Why per namespace: the proxy tells sandboxes apart by pod IP and keeps its table from the
Sandboxes it may read, so its ServiceAccount needs read access to Sandboxes and pods and the
right to post Events. Per namespace that is a namespaced Role, so one namespace's proxy never
sees another namespace's Sandboxes, and a namespace's sandboxes share one pod (about 40 MiB)
instead of a pod each on their critical path (docs/egress.md).

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
import contextlib
import hashlib
import ipaddress
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from sandbox_operator import labels as lbl
from sandbox_operator.backends.base import PoolRef, SandboxRef
from sandbox_operator.backends.owners import owner_reference
from sandbox_operator.config import ManagedEgressProxySettings

log = logging.getLogger(__name__)

PROXY_NAME = "sandbox-egress-proxy"
COMPONENT = "egress-proxy"
CONTAINER_NAME = "proxy"
CONFIG_DIR = "/etc/sandbox-egress"
CONFIG_FILE = "proxy.yaml"
#: On each sandbox pod under a managed proxy: the ``ip:port`` it was given (for recovery).
#: How often the operator looks at each namespace's proxy Service (one GET per namespace that has
#: one, whatever the number of sandboxes in it): a Service that went away or changed address wakes
#: that namespace's allowlisted sandboxes, whose passes restore it or report them Failed. Between
#: looks, `check` answers from the last look, so passes over sandboxes cost no read.
SERVICE_CHECK_SECONDS = 5.0
PROXY_ADDRESS_ANNOTATION = f"{lbl.GROUP}/egress-proxy"
#: On the proxy's pod template: the config file's SHA-256, so a changed config rolls the pod.
CONFIG_CHECKSUM_ANNOTATION = f"{lbl.GROUP}/config-sha256"
#: Field manager of the full objects; each Sandbox's own reference uses ``FIELD_MANAGER/<uid>``.
FIELD_MANAGER = "sandbox-operator/egress"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
#: The uid/gid the proxy runs as (the operator image's non-root user).
PROXY_UID = 65532

#: What the proxy may do in its namespace: keep its table (Sandboxes, their pods, watched), post
#: Events, write the ``status.egress`` summary and read its own Service. The operator must hold
#: every one of these itself to create the Role (RBAC refuses escalation); the chart grants them
#: (tests/unit/test_chart_rbac).
PROXY_ROLE_RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": [lbl.GROUP], "resources": ["sandboxes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [lbl.GROUP], "resources": ["sandboxes/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    # Its own Service: admissions are reported once a connection through it arrives.
    {"apiGroups": [""], "resources": ["services"], "resourceNames": [PROXY_NAME], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
)

#: (apiVersion, kind, API group, resource) of what is applied, in order: the pod needs its
#: ServiceAccount and ConfigMap, and the Service comes last so its address is the last word.
APPLIED: tuple[tuple[str, str, str, str], ...] = (
    ("v1", "ServiceAccount", "", "serviceaccounts"),
    ("rbac.authorization.k8s.io/v1", "Role", "rbac.authorization.k8s.io", "roles"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", "rbac.authorization.k8s.io", "rolebindings"),
    ("v1", "ConfigMap", "", "configmaps"),
    ("apps/v1", "Deployment", "apps", "deployments"),
    ("v1", "Service", "", "services"),
)


@dataclass(frozen=True)
class ProxyAddress:
    """Where a sandbox reaches its namespace's proxy: the Service's cluster IP and port."""

    ip: str
    port: int

    @property
    def annotation(self) -> str:
        """``ip:port`` (``[ip]:port`` for IPv6), as recorded on the sandbox pod."""
        return f"{self._host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def _host(self) -> str:
        return f"[{self.ip}]" if ":" in self.ip else self.ip

    @classmethod
    def parse(cls, text: str) -> ProxyAddress | None:
        """The inverse of :attr:`annotation`; None for anything else."""
        host, sep, port = text.strip().rpartition(":")
        if not sep or not port.isdigit():
            return None
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return None
        number = int(port)
        return cls(str(ip), number) if 0 < number < 65536 else None


class ProxyError(Exception):
    """Applying the proxy's objects did not work. ``permanent``: retrying will not help (the API
    server refused the object: RBAC, validation); otherwise a later attempt may succeed."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.message = message
        self.permanent = permanent


# --------------------------------------------------------------------------------------------
# Pure builders


def proxy_labels() -> dict[str, str]:
    """Labels of every proxy object; also the selector of its pods (Service, NetworkPolicy)."""
    return {
        "app.kubernetes.io/name": PROXY_NAME,
        "app.kubernetes.io/component": COMPONENT,
        lbl.MANAGED_BY_LABEL: lbl.MANAGED_BY_VALUE,
    }


def sandbox_field_manager(sandbox: SandboxRef | PoolRef) -> str:
    return f"{FIELD_MANAGER}/{sandbox.uid}"


def _meta(namespace: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": PROXY_NAME, "namespace": namespace, "labels": proxy_labels()}
    meta.update(extra or {})
    return meta


def build_service_account(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(namespace)}


def build_role(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(namespace),
        "rules": [json.loads(json.dumps(rule)) for rule in PROXY_ROLE_RULES],
    }


def build_role_binding(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(namespace),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": PROXY_NAME},
        "subjects": [{"kind": "ServiceAccount", "name": PROXY_NAME, "namespace": namespace}],
    }


def proxy_config_text(settings: ManagedEgressProxySettings) -> str:
    """The proxy's config file: ``egressProxy.config`` on ``egressProxy.port``, no sandboxes."""
    data = settings.proxy_config().model_dump(mode="json", by_alias=True)
    return yaml.safe_dump(data, sort_keys=True)


def build_config_map(namespace: str, settings: ManagedEgressProxySettings) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(namespace),
        "data": {CONFIG_FILE: proxy_config_text(settings)},
    }


def build_deployment(namespace: str, settings: ManagedEgressProxySettings) -> dict[str, Any]:
    """One proxy pod, hardened like a sandbox pod; a changed config file rolls it."""
    checksum = hashlib.sha256(proxy_config_text(settings).encode()).hexdigest()
    labels = proxy_labels()
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": [
            "python3",
            "-m",
            "sandbox_operator.egress",
            "--config",
            f"{CONFIG_DIR}/{CONFIG_FILE}",
            "--kube-namespace",
            namespace,
            "--kube-service",
            PROXY_NAME,
        ],
        "env": [
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        ],
        "ports": [{"name": "proxy", "containerPort": settings.port, "protocol": "TCP"}],
        "readinessProbe": {
            "tcpSocket": {"port": settings.port},
            "periodSeconds": 2,
            "failureThreshold": 3,
        },
        "resources": {
            part: dict(values)
            for part, values in (
                ("requests", settings.resources.requests),
                ("limits", settings.resources.limits),
            )
            if values
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": PROXY_UID,
            "runAsGroup": PROXY_UID,
        },
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": PROXY_NAME,
        "automountServiceAccountToken": True,  # it reads Sandboxes and posts Events
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "terminationGracePeriodSeconds": 10,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": PROXY_UID,
            "runAsGroup": PROXY_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": PROXY_NAME}}],
    }
    if settings.runtime_class_name:
        pod_spec["runtimeClassName"] = settings.runtime_class_name
    if settings.node_selector:
        pod_spec["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in settings.tolerations]
    if settings.host_aliases:
        pod_spec["hostAliases"] = [
            {"ip": a.ip, "hostnames": list(a.hostnames)} for a in settings.host_aliases
        ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(namespace),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {CONFIG_CHECKSUM_ANNOTATION: checksum},
                },
                "spec": pod_spec,
            },
        },
    }


def build_service(
    namespace: str, settings: ManagedEgressProxySettings, cluster_ip: str | None = None
) -> dict[str, Any]:
    """The ClusterIP Service; ``cluster_ip`` asks for a given address (recovery)."""
    spec: dict[str, Any] = {
        "type": "ClusterIP",
        "selector": proxy_labels(),
        "ports": [
            {"name": "proxy", "port": settings.port, "targetPort": settings.port, "protocol": "TCP"}
        ],
    }
    if cluster_ip:
        spec["clusterIP"] = cluster_ip
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(namespace), "spec": spec}


def build_objects(
    namespace: str, settings: ManagedEgressProxySettings, cluster_ip: str | None = None
) -> list[dict[str, Any]]:
    """Every proxy object of a namespace, in :data:`APPLIED` order, without owners."""
    return [
        build_service_account(namespace),
        build_role(namespace),
        build_role_binding(namespace),
        build_config_map(namespace, settings),
        build_deployment(namespace, settings),
        build_service(namespace, settings, cluster_ip),
    ]


def with_owner(obj: Mapping[str, Any], sandbox: SandboxRef | PoolRef) -> dict[str, Any]:
    """``obj`` with the Sandbox's ownerReference (what the common manager applies)."""
    out: dict[str, Any] = json.loads(json.dumps(obj))
    if sandbox.uid:
        out["metadata"]["ownerReferences"] = [owner_reference(sandbox, controller=False)]
    return out


def owner_only(obj: Mapping[str, Any], sandbox: SandboxRef | PoolRef) -> dict[str, Any]:
    """Only the Sandbox's ownerReference: what the Sandbox's own field manager applies."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "ownerReferences": [owner_reference(sandbox, controller=False)],
        },
    }


def recorded_address(pods: list[Mapping[str, Any]]) -> ProxyAddress | None:
    """The proxy address most live sandbox pods of a namespace were given, if any."""
    seen: Counter[ProxyAddress] = Counter()
    for pod in pods:
        meta = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase")
        if meta.get("deletionTimestamp") or phase in ("Failed", "Succeeded"):
            continue
        annotations = meta.get("annotations") or {}
        address = ProxyAddress.parse(str(annotations.get(PROXY_ADDRESS_ANNOTATION, "")))
        if address is not None:
            seen[address] += 1
    return seen.most_common(1)[0][0] if seen else None


def service_address(service: Mapping[str, Any] | None) -> ProxyAddress | None:
    """The address a (live) proxy Service serves on; None if absent, deleting or headless."""
    if not service or (service.get("metadata") or {}).get("deletionTimestamp"):
        return None
    spec = service.get("spec") or {}
    ip = spec.get("clusterIP") or spec.get("cluster_ip")
    ports = spec.get("ports") or []
    if not ip or ip == "None" or not ports:
        return None
    return ProxyAddress(str(ip), int(ports[0].get("port")))


# --------------------------------------------------------------------------------------------
# Applying


ESCALATION_MARK = "attempting to grant RBAC permissions not currently held"


def _api_message(exc: Any) -> str:
    message = str(getattr(exc, "reason", ""))
    with contextlib.suppress(Exception):
        message = str(json.loads(exc.body).get("message", ""))
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
        self._seen_service: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self._namespaces: set[str] = set()  # where a proxy was ensured or checked
        # One ensure at a time per namespace: the allowlisted sandboxes of a namespace whose
        # Service went away are all woken at once, and two restores racing to create the Service
        # with the recorded address would have the API server refuse the second (422: the IP is
        # allocated), which reads as a permanent loss. In turn, each sees the one before it.
        self._ensuring: dict[str, asyncio.Lock] = {}

    def _apply_call(self, kind: str) -> Callable[..., Any]:
        calls: dict[str, Callable[..., Any]] = {
            "ServiceAccount": self._core.patch_namespaced_service_account,
            "Role": self._rbac.patch_namespaced_role,
            "RoleBinding": self._rbac.patch_namespaced_role_binding,
            "ConfigMap": self._core.patch_namespaced_config_map,
            "Deployment": self._apps.patch_namespaced_deployment,
            "Service": self._core.patch_namespaced_service,
        }
        return calls[kind]

    async def _apply(self, body: dict[str, Any], manager: str) -> dict[str, Any]:
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
        out: dict[str, Any] = self._api.sanitize_for_serialization(result)
        return out

    async def read_service(self, namespace: str) -> dict[str, Any] | None:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            svc = await self._core.read_namespaced_service(PROXY_NAME, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        out: dict[str, Any] = self._api.sanitize_for_serialization(svc)
        return out

    async def _recorded(self, namespace: str) -> ProxyAddress | None:
        """The address live sandbox pods of the namespace were given (one list call)."""
        pods = await self._core.list_namespaced_pod(
            namespace,
            label_selector=lbl.format_selector({lbl.MANAGED_BY_LABEL: lbl.MANAGED_BY_VALUE}),
        )
        return recorded_address([self._api.sanitize_for_serialization(p) for p in pods.items])

    async def ensure(
        self, namespace: str, sandbox: SandboxRef | PoolRef, *, want: ProxyAddress | None = None
    ) -> ProxyAddress:
        """Apply the namespace's proxy objects with ``sandbox`` among their owners; return the
        Service's address (see ``_ensure``). One at a time per namespace."""
        lock = self._ensuring.setdefault(namespace, asyncio.Lock())
        async with lock:
            return await self._ensure(namespace, sandbox, want=want)

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
        service: dict[str, Any] = {}
        for obj in build_objects(namespace, self.settings, ask.ip if ask else None):
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
                service = applied
        address = service_address(service)
        if address is None:
            raise ProxyError("the egress proxy Service has no cluster IP", permanent=True)
        self._seen_service[namespace] = (time.monotonic(), service)
        self._namespaces.add(namespace)
        return address

    def seen_address(self, namespace: str) -> ProxyAddress | None:
        """The namespace's proxy address as last seen (by ``ensure`` or the periodic look), if
        seen lately; None when not seen lately (nothing is read here)."""
        seen = self._seen_service.get(namespace)
        if seen is None or time.monotonic() - seen[0] > 2 * SERVICE_CHECK_SECONDS + 1:
            return None
        return service_address(seen[1])

    async def _service_for_check(self, namespace: str) -> dict[str, Any] | None:
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
            refs = ((service or {}).get("metadata") or {}).get("ownerReferences") or []
            owners = {o.get("uid") for o in refs}
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
