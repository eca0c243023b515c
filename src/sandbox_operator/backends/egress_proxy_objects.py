"""The managed egress proxy's objects, as pure functions of the namespace and the operator's
settings: its ServiceAccount, Role, RoleBinding, ConfigMap, Deployment and Service, the owner
references that keep it alive, and where sandboxes reach it (:class:`ProxyAddress`). Tested
without a cluster; :mod:`sandbox_operator.backends.egress_proxy` applies them."""

from __future__ import annotations

import base64
import copy
import hashlib
import ipaddress
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import yaml

from sandbox_operator import kubeobj
from sandbox_operator import labels as lbl
from sandbox_operator.backends.base import PoolRef, SandboxRef
from sandbox_operator.backends.manifests import (
    ConfigMap,
    Container,
    Deployment,
    ObjectMeta,
    OwnerReferencesOnly,
    PodSpec,
    PolicyRule,
    ProxyObject,
    ResourceRequirements,
    Role,
    RoleBinding,
    Secret,
    Service,
    ServiceAccount,
    ServiceSpec,
)
from sandbox_operator.backends.owners import owner_reference
from sandbox_operator.egress.config import (
    CA_BUNDLE_KEY,
    CA_CERT_KEY,
    CA_KEY_KEY,
    ManagedEgressProxySettings,
)
from sandbox_operator.views import PodView, ServiceView

PROXY_NAME = "sandbox-egress-proxy"
COMPONENT = "egress-proxy"
CONTAINER_NAME = "proxy"
CONFIG_DIR = "/etc/sandbox-egress"
CONFIG_FILE = "proxy.yaml"
#: Where the proxy pod mounts its Secret (the interception CA's certificate and key).
PROXY_CA_DIR = "/etc/sandbox-egress-proxy-ca"
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
PROXY_ROLE_RULES: tuple[PolicyRule, ...] = (
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
    ("v1", kubeobj.SERVICE_ACCOUNT_KIND, "", "serviceaccounts"),
    ("rbac.authorization.k8s.io/v1", kubeobj.ROLE_KIND, "rbac.authorization.k8s.io", "roles"),
    (
        "rbac.authorization.k8s.io/v1",
        kubeobj.ROLE_BINDING_KIND,
        "rbac.authorization.k8s.io",
        "rolebindings",
    ),
    ("v1", "ConfigMap", "", "configmaps"),
    ("apps/v1", "Deployment", "apps", "deployments"),
    ("v1", "Service", "", "services"),
)


@dataclass(frozen=True)
class ProxyAddress:
    """Where a sandbox reaches its namespace's proxy: the Service's cluster IP and port."""

    ip: str
    port: int
    #: The proxy terminates TLS for hosts whose rules name https: the pod mounts its CA's
    #: certificate and is told to trust it (not part of the address, nor of its equality).
    intercepting: bool = field(default=False, compare=False)

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


def _proxy_metadata(namespace: str, name: str = PROXY_NAME) -> ObjectMeta:
    return {"name": name, "namespace": namespace, "labels": proxy_labels()}


def build_service_account(namespace: str) -> ServiceAccount:
    return {
        "apiVersion": "v1",
        "kind": kubeobj.SERVICE_ACCOUNT_KIND,
        "metadata": _proxy_metadata(namespace),
    }


def build_role(namespace: str) -> Role:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kubeobj.ROLE_KIND,
        "metadata": _proxy_metadata(namespace),
        "rules": [copy.deepcopy(rule) for rule in PROXY_ROLE_RULES],
    }


def build_role_binding(namespace: str) -> RoleBinding:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kubeobj.ROLE_BINDING_KIND,
        "metadata": _proxy_metadata(namespace),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": kubeobj.ROLE_KIND,
            "name": PROXY_NAME,
        },
        "subjects": [
            {"kind": kubeobj.SERVICE_ACCOUNT_KIND, "name": PROXY_NAME, "namespace": namespace}
        ],
    }


#: The RoleBinding giving the proxy's ServiceAccount ``egressProxy.credentialsClusterRole`` (get
#: on Secrets) in its namespace, so it reads the Secrets egressRules credentials name. Binding a
#: ClusterRole needs ``bind`` on it (the chart grants that by name), not holding what it grants:
#: the operator itself never reads those Secrets.
CREDENTIALS_BINDING = f"{PROXY_NAME}-credentials"


def build_credentials_binding(namespace: str, cluster_role: str) -> RoleBinding:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kubeobj.ROLE_BINDING_KIND,
        "metadata": _proxy_metadata(namespace, CREDENTIALS_BINDING),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": cluster_role,
        },
        "subjects": [
            {"kind": kubeobj.SERVICE_ACCOUNT_KIND, "name": PROXY_NAME, "namespace": namespace}
        ],
    }


def proxy_config_text(settings: ManagedEgressProxySettings) -> str:
    """The proxy's config file: ``egressProxy.config`` on ``egressProxy.port``, no sandboxes."""
    data = settings.proxy_config().model_dump(mode="json", by_alias=True)
    return yaml.safe_dump(data, sort_keys=True)


@dataclass(frozen=True)
class ProxyCA:
    """The namespace's interception CA: the certificate the sandboxes trust, the key only the
    proxy's pod mounts (from the Secret), and ``roots``: the public roots the sandboxes' bundle
    keeps beside it (the operator image's)."""

    cert_pem: str
    key_pem: str = field(repr=False)
    roots: str = field(default="", repr=False)


def build_config_map(
    namespace: str, settings: ManagedEgressProxySettings, ca: ProxyCA | None = None
) -> ConfigMap:
    """The proxy's config file; with ``ca`` also the CA's certificate and the bundle of public
    roots and the CA (what sandbox pods mount, those two keys only)."""
    data = {CONFIG_FILE: proxy_config_text(settings)}
    if ca is not None:
        data[CA_CERT_KEY] = ca.cert_pem
        roots = ca.roots if not ca.roots or ca.roots.endswith("\n") else ca.roots + "\n"
        data[CA_BUNDLE_KEY] = roots + ca.cert_pem
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _proxy_metadata(namespace),
        "data": data,
    }


def build_ca_secret(namespace: str, ca: ProxyCA) -> Secret:
    """The CA's key (and certificate) for the proxy's pod: the only pod that mounts it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _proxy_metadata(namespace),
        "type": "Opaque",
        "data": {
            CA_CERT_KEY: base64.b64encode(ca.cert_pem.encode()).decode(),
            CA_KEY_KEY: base64.b64encode(ca.key_pem.encode()).decode(),
        },
    }


def build_deployment(
    namespace: str, settings: ManagedEgressProxySettings, ca: ProxyCA | None = None
) -> Deployment:
    """One proxy pod, hardened like a sandbox pod; a changed config file (or a new CA: the pod
    must sign with the key whose certificate the sandboxes are given) rolls it."""
    rolled_by = proxy_config_text(settings) + (ca.cert_pem if ca is not None else "")
    checksum = hashlib.sha256(rolled_by.encode()).hexdigest()
    labels = proxy_labels()
    intercepting = settings.config.interception.enabled
    container: Container = {
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
            *(["--ca-dir", PROXY_CA_DIR] if intercepting else []),
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
        "resources": _proxy_resources(settings),
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
    pod_spec: PodSpec = {
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
    if intercepting:
        # The CA's key from the Secret (this pod only), and a private in-memory /tmp where each
        # leaf's pair is written for the ssl module to load and removed at once.
        container["volumeMounts"] += [
            {"name": "ca", "mountPath": PROXY_CA_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ]
        pod_spec["securityContext"]["fsGroup"] = PROXY_UID  # the key file's group
        pod_spec["volumes"] += [
            {"name": "ca", "secret": {"secretName": PROXY_NAME, "defaultMode": 0o440}},
            {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        ]
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
        "metadata": _proxy_metadata(namespace),
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


def _proxy_resources(settings: ManagedEgressProxySettings) -> ResourceRequirements:
    """The proxy container's requests and limits, each only where configured."""
    resources: ResourceRequirements = {}
    if settings.resources.requests:
        resources["requests"] = {k: v for k, v in settings.resources.requests.items()}
    if settings.resources.limits:
        resources["limits"] = {k: v for k, v in settings.resources.limits.items()}
    return resources


def build_service(
    namespace: str, settings: ManagedEgressProxySettings, cluster_ip: str | None = None
) -> Service:
    """The ClusterIP Service; ``cluster_ip`` asks for a given address (recovery)."""
    spec: ServiceSpec = {
        "type": "ClusterIP",
        "selector": proxy_labels(),
        "ports": [
            {"name": "proxy", "port": settings.port, "targetPort": settings.port, "protocol": "TCP"}
        ],
    }
    if cluster_ip:
        spec["clusterIP"] = cluster_ip
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _proxy_metadata(namespace),
        "spec": spec,
    }


#: Applied too (before the ConfigMap) while the proxy terminates TLS
#: (``egressProxy.config.interception.enabled``): the Secret holding its CA.
INTERCEPTION_APPLIED: tuple[tuple[str, str, str, str], ...] = (("v1", "Secret", "", "secrets"),)


def build_objects(
    namespace: str,
    settings: ManagedEgressProxySettings,
    cluster_ip: str | None = None,
    ca: ProxyCA | None = None,
) -> list[ProxyObject]:
    """Every proxy object of a namespace, in :data:`APPLIED` order, without owners (the Secret
    only with ``ca``: while the proxy terminates TLS; the credentials RoleBinding only with
    ``credentialsClusterRole``)."""
    role = settings.credentials_cluster_role
    return [
        build_service_account(namespace),
        build_role(namespace),
        build_role_binding(namespace),
        *([build_credentials_binding(namespace, role)] if role else []),
        *([build_ca_secret(namespace, ca)] if ca is not None else []),
        build_config_map(namespace, settings, ca),
        build_deployment(namespace, settings, ca),
        build_service(namespace, settings, cluster_ip),
    ]


def with_owner(obj: ProxyObject, sandbox: SandboxRef | PoolRef) -> ProxyObject:
    """A copy of ``obj`` with the Sandbox's ownerReference (what the common manager applies)."""
    out = copy.deepcopy(obj)
    if sandbox.uid:
        out["metadata"]["ownerReferences"] = [owner_reference(sandbox, controller=False)]
    return out


def owner_only(obj: ProxyObject, sandbox: SandboxRef | PoolRef) -> OwnerReferencesOnly:
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


def recorded_address(pods: Iterable[PodView]) -> ProxyAddress | None:
    """The proxy address most live sandbox pods of a namespace were given, if any."""
    seen: Counter[ProxyAddress] = Counter()
    for pod in pods:
        meta = pod.metadata
        if meta.deleting or pod.status.phase in ("Failed", "Succeeded"):
            continue
        address = ProxyAddress.parse(str(meta.annotations.get(PROXY_ADDRESS_ANNOTATION, "")))
        if address is not None:
            seen[address] += 1
    return seen.most_common(1)[0][0] if seen else None


def service_address(service: ServiceView | None) -> ProxyAddress | None:
    """The address a (live) proxy Service serves on; None if absent, deleting or headless."""
    if service is None or not service or service.metadata.deleting:
        return None
    ip, port = service.cluster_ip, service.first_port
    if not ip or ip == "None" or port is None:
        return None
    return ProxyAddress(ip, port)
