"""What a runtime-class sandbox is made of, as pure functions over the request: its pod, its
work volume's PersistentVolumeClaim and the NetworkPolicy of its backend and egress mode. Kept
apart from the driver so what gets created is testable without a cluster (the security profile
is in the package docstring)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from sandbox_operator import kubeobj, naming
from sandbox_operator import labels as lbl
from sandbox_operator.backends.base import EnsureRequest
from sandbox_operator.backends.egress_proxy import (
    PROXY_ADDRESS_ANNOTATION,
    PROXY_NAME,
    ProxyAddress,
    proxy_labels,
)
from sandbox_operator.backends.manifests import (
    Container,
    EmptyDirVolumeSource,
    EnvVar,
    KeyToPath,
    NetworkPolicy,
    NetworkPolicyPeer,
    NetworkPolicySpec,
    ObjectMeta,
    PersistentVolumeClaim,
    PersistentVolumeClaimSpec,
    Pod,
    PodSecurityContext,
    PodSpec,
    ResourceRequirements,
    RunAs,
    SecurityContext,
    Volume,
    VolumeMount,
)
from sandbox_operator.backends.owners import owner_reference
from sandbox_operator.backends.runtimeclass.config import PodSettings, RuntimeClassBackendConfig
from sandbox_operator.contract import Egress, SandboxSpec
from sandbox_operator.contract.ports import port_slot_name
from sandbox_operator.egress.config import (
    CA_BUNDLE_KEY,
    CA_CERT_KEY,
    CA_MOUNT_DIR,
    ManagedEgressProxySettings,
)
from sandbox_operator.views import ObjectView

CONTAINER_NAME = "sandbox"
WORK_VOLUME = "work"
TMP_VOLUME = "tmp"
CA_VOLUME = "egress-ca"

#: The kinds of what this backend creates per sandbox (spelled once, in ``kubeobj``).
POD = kubeobj.POD_KIND
NETWORK_POLICY = kubeobj.NETWORK_POLICY_KIND
#: The work volume of a sandbox with ``spec.storage`` (named ``naming.work_volume_name``).
CLAIM = kubeobj.PERSISTENT_VOLUME_CLAIM_KIND

#: The only name server of a sandbox that may reach none (see :func:`dns_settings`): the pod's
#: own loopback, where nothing listens, so every lookup is refused inside the pod.
NO_DNS_NAMESERVER = "127.0.0.1"
#: ``use-vc``: glibc and Go ask over TCP, which the closed port refuses with a RST, no ICMP error
#: (gVisor's netstack rate-limits those even on loopback: 300 lookups over UDP, 18 took 5 s).
#: Resolvers that ignore it ask over UDP: busybox gets the loopback ICMP error; musl's unconnected
#: socket never sees one, so ``timeout:1 attempts:1`` bound its lookups to a second, not five.
NO_DNS_OPTIONS: Final = (("use-vc", None), ("timeout", "1"), ("attempts", "1"))

#: The version of what :func:`pod_manifest` makes of a spec. Bump it whenever the same spec gives
#: a different pod (version 2: closed sandboxes got the no-DNS settings), so idle warm pool pods
#: made the old way stop matching their pool's shape and are replaced rather than claimed.
POD_TEMPLATE_VERSION: Final = 2


def _metadata(request: EnsureRequest, name: str) -> ObjectMeta:
    meta: ObjectMeta = {
        "name": name,
        "namespace": request.sandbox.namespace,
        "labels": dict(request.labels),
        "annotations": dict(request.annotations),
    }
    if request.sandbox.uid:
        meta["ownerReferences"] = [owner_reference(request.sandbox)]
    return meta


def _resources(spec: SandboxSpec) -> ResourceRequirements:
    """Requests and limits of the sandbox container, always both for cpu and memory.

    ``spec`` is expected to carry resources resolved under the host policy (the reconciler passes
    ``policy.resolve_spec(host, spec)``); whatever is still unset gets the built-in defaults, so a
    pod never runs without limits or with requests above them. Resolving is idempotent.
    """
    from sandbox_operator.contract import HostPolicy
    from sandbox_operator.policy import resolve_resources

    resolved = resolve_resources(HostPolicy(), spec)
    requests, limits = resolved.requests, resolved.limits
    return {
        "requests": {"cpu": str(requests.cpu), "memory": str(requests.memory)},
        "limits": {"cpu": str(limits.cpu), "memory": str(limits.memory)},
    }


def container_security_context(pod: PodSettings) -> SecurityContext:
    ctx: SecurityContext = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
        "readOnlyRootFilesystem": pod.read_only_root_filesystem,
        "runAsNonRoot": pod.run_as_non_root,
    }
    _run_as(pod, ctx)
    return ctx


def _run_as(pod: PodSettings, context: RunAs) -> None:
    """The backend's user and group where set, into a container's or the pod's context."""
    if pod.run_as_user is not None:
        context["runAsUser"] = pod.run_as_user
    if pod.run_as_group is not None:
        context["runAsGroup"] = pod.run_as_group


def proxy_by_name(url: str | None) -> bool:
    """Whether a proxy URL names its host (which the sandbox must then resolve) rather than
    giving a number (an IP literal, as the operator-run proxy's address always is)."""
    host = urlsplit(url).hostname if url else None
    if not host:
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return True
    return False


def dns_settings(spec: SandboxSpec, proxy_url: str | None) -> PodSpec:
    """``dnsPolicy``/``dnsConfig`` of a sandbox pod: the cluster's resolver only where one is
    reachable and needed; otherwise a configuration that fails every lookup at once.

    Why: under the cluster's resolver a closed sandbox's lookups are REJECTed by its deny-all
    NetworkPolicy with ICMP errors, which the node rate-limits to about one a second, so every
    other lookup waited out the resolver's 5 s timeout (0.1, 5.0, 0.003, 5.0 s back to back).

    * ``unrestricted``: the cluster's resolver (``ClusterFirst``, the Kubernetes default).
    * ``allowlist`` with a proxy URL that names its host (an external proxy given by name): the
      cluster's resolver, because the sandbox must resolve that name itself (the platform's own
      policies then have to let it reach the resolver: the sandbox's policy allows the proxy only).
    * everything else (``closed``; ``allowlist`` with the proxy as a number, which the operator-run
      proxy always is, or with no proxy): nothing reachable to ask, so ``dnsPolicy: None`` with
      :data:`NO_DNS_NAMESERVER` and :data:`NO_DNS_OPTIONS`, no search domains. ``/etc/hosts``
      (``hostAliases``) is still read first.
    """
    if spec.egress is Egress.UNRESTRICTED or (
        spec.egress is Egress.ALLOWLIST and proxy_by_name(proxy_url)
    ):
        return {"dnsPolicy": "ClusterFirst"}
    return {
        "dnsPolicy": "None",
        "dnsConfig": {
            "nameservers": [NO_DNS_NAMESERVER],
            "options": [
                {"name": name} if value is None else {"name": name, "value": value}
                for name, value in NO_DNS_OPTIONS
            ],
        },
    }


def build_pod(
    request: EnsureRequest,
    backend: RuntimeClassBackendConfig,
    managed_proxy: ProxyAddress | None = None,
) -> Pod:
    """The pod manifest that serves a sandbox on a runtime-class backend.

    ``managed_proxy``: the address of the namespace's operator-run egress proxy (for a backend
    whose ``egressProxy`` is ``managed``), given to the sandbox as a number (an allowlisted
    sandbox resolves no names) and recorded on the pod for recovery.
    """
    metadata = _metadata(request, naming.pod_name(request.sandbox.name))
    metadata["labels"][lbl.EGRESS_LABEL] = request.spec.egress.value
    claim = naming.work_volume_name(request.sandbox.name) if request.spec.storage else None
    return pod_manifest(request.spec, backend, metadata, managed_proxy, work_claim=claim)


def build_work_volume_claim(request: EnsureRequest) -> PersistentVolumeClaim:
    """The PersistentVolumeClaim of a sandbox's work directory (``spec.storage``): labelled and
    owned like its pod (so disposal, scope purges and the garbage collector find it), sized and
    classed by the spec (no ``storageClassName``: the cluster's default class)."""
    storage = request.spec.storage
    if storage is None:
        raise ValueError("the spec asks for no storage")
    spec: PersistentVolumeClaimSpec = {
        "accessModes": [str(storage.access_mode)],
        "resources": {"requests": {"storage": str(storage.size)}},
    }
    if storage.storage_class_name is not None:
        spec["storageClassName"] = storage.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": CLAIM,
        "metadata": _metadata(request, naming.work_volume_name(request.sandbox.name)),
        "spec": spec,
    }


def pod_manifest(
    spec: SandboxSpec,
    backend: RuntimeClassBackendConfig,
    metadata: ObjectMeta,
    managed_proxy: ProxyAddress | None = None,
    *,
    work_claim: str | None = None,
) -> Pod:
    """The pod for ``spec`` on ``backend`` with the given metadata: everything of a sandbox pod
    but who it serves (a Sandbox's pod, or a warm pool's pod made before it serves anyone).

    ``work_claim``: the PersistentVolumeClaim mounted at the work dir (a spec with ``storage``)
    instead of an emptyDir; ``/tmp`` stays an emptyDir either way."""
    pod = backend.pod
    work_dir = spec.work_dir
    work_volume: Volume
    if work_claim is not None:
        work_volume = {"name": WORK_VOLUME, "persistentVolumeClaim": {"claimName": work_claim}}
    else:
        empty_dir: EmptyDirVolumeSource = {}
        if pod.work_dir_size_limit:
            empty_dir["sizeLimit"] = pod.work_dir_size_limit
        work_volume = {"name": WORK_VOLUME, "emptyDir": empty_dir}
    mounts: list[VolumeMount] = [{"name": WORK_VOLUME, "mountPath": work_dir}]
    volumes = [work_volume]
    if work_dir != "/tmp":
        mounts.append({"name": TMP_VOLUME, "mountPath": "/tmp"})
        volumes.append({"name": TMP_VOLUME, "emptyDir": {"sizeLimit": pod.tmp_size_limit}})
    env: list[EnvVar] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "SANDBOX_WORK_DIR", "value": work_dir},
    ]
    proxy = backend.egress_proxy
    proxy_url = _wire_egress_proxy(spec, backend, managed_proxy, env, mounts, volumes)
    container: Container = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": pod.image_pull_policy,
        "command": list(pod.keep_alive_command),
        "workingDir": work_dir,
        "env": env,
        "resources": _resources(spec),
        "securityContext": container_security_context(pod),
        "volumeMounts": mounts,
        "stdin": False,
        "tty": False,
    }
    if spec.ports:
        # Named by their index, not the spec's names: one NetworkPolicy per namespace admits the
        # router to exactly these names (docs/ports.md), whatever each Sandbox calls its ports.
        container["ports"] = [
            {"name": port_slot_name(i), "containerPort": p.port, "protocol": "TCP"}
            for i, p in enumerate(spec.ports)
        ]
    pod_spec: PodSpec = {
        "runtimeClassName": backend.runtime_class_name,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "shareProcessNamespace": False,
        "terminationGracePeriodSeconds": pod.termination_grace_period_seconds,
        "securityContext": _pod_security_context(pod),
        "containers": [container],
        "volumes": volumes,
    }
    pod_spec.update(dns_settings(spec, proxy_url))
    if pod.node_selector:
        pod_spec["nodeSelector"] = dict(pod.node_selector)
    if pod.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in pod.tolerations]
    if spec.egress is Egress.ALLOWLIST and proxy is not None and proxy.managed and proxy_url:
        assert managed_proxy is not None
        metadata.setdefault("annotations", {})[PROXY_ADDRESS_ANNOTATION] = managed_proxy.annotation
    return {"apiVersion": "v1", "kind": kubeobj.POD_KIND, "metadata": metadata, "spec": pod_spec}


def _pod_security_context(pod: PodSettings) -> PodSecurityContext:
    """The pod-level security context: never root (unless the backend says so), the runtime's
    default seccomp profile, and the backend's user, group and fsGroup where set."""
    found: PodSecurityContext = {
        "runAsNonRoot": pod.run_as_non_root,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    _run_as(pod, found)
    if pod.fs_group is not None:
        found["fsGroup"] = pod.fs_group
    return found


def _wire_egress_proxy(
    spec: SandboxSpec,
    backend: RuntimeClassBackendConfig,
    managed_proxy: ProxyAddress | None,
    env: list[EnvVar],
    mounts: list[VolumeMount],
    volumes: list[Volume],
) -> str | None:
    """Point an allowlist pod at its egress proxy (the proxy variables, and for an intercepting
    proxy its CA, mounted from the proxy's ConfigMap), adding to ``env``, ``mounts`` and
    ``volumes``; the proxy's URL (None: the backend has none, or the managed one has no address
    yet)."""
    proxy = backend.egress_proxy
    proxy_url = None
    if proxy is not None and proxy.managed:
        proxy_url = managed_proxy.url if managed_proxy is not None else None
    elif proxy is not None:
        proxy_url = proxy.url
    if spec.egress is not Egress.ALLOWLIST or proxy is None or not proxy_url:
        return proxy_url
    for var in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        env.append({"name": var, "value": proxy_url})
    if proxy.no_proxy:
        env += [{"name": v, "value": proxy.no_proxy} for v in ("NO_PROXY", "no_proxy")]
    if proxy.managed and managed_proxy is not None and managed_proxy.intercepting:
        env += proxy_ca_env()
        mounts.append({"name": CA_VOLUME, "mountPath": CA_MOUNT_DIR, "readOnly": True})
        # The proxy's ConfigMap, applied before any pod is given its address; only its CA keys
        # are projected (not the proxy's configuration). Optional: never a pod stuck on a
        # ConfigMap that is being re-applied.
        items: list[KeyToPath] = [{"key": k, "path": k} for k in (CA_CERT_KEY, CA_BUNDLE_KEY)]
        volumes.append(
            {"name": CA_VOLUME, "configMap": {"name": PROXY_NAME, "items": items, "optional": True}}
        )
    return proxy_url


def proxy_ca_env() -> list[EnvVar]:
    """How a guest is told to trust the intercepting proxy's CA: the common TLS stacks' variables
    (OpenSSL and Python's ssl, requests, curl, git) name the bundle of the proxy image's roots
    and the CA; Node.js adds the CA to its own roots. A program that reads none of them must be
    pointed at ``/etc/sandbox-egress/bundle.crt`` itself (docs/egress-proxy.md)."""
    bundle = f"{CA_MOUNT_DIR}/{CA_BUNDLE_KEY}"
    names = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO")
    env: list[EnvVar] = [{"name": n, "value": bundle} for n in names]
    env.append({"name": "NODE_EXTRA_CA_CERTS", "value": f"{CA_MOUNT_DIR}/{CA_CERT_KEY}"})
    return env


def build_egress_policy(
    namespace: str,
    egress: Egress,
    backend: RuntimeClassBackendConfig,
    managed: ManagedEgressProxySettings | None = None,
) -> NetworkPolicy:
    """The NetworkPolicy of every sandbox pod of one backend and egress mode in a namespace (it
    selects them by ``lbl.egress_policy_labels``): no ingress ever; egress by the mode.

    ``closed`` denies all egress (DNS included). ``unrestricted`` leaves egress open (only served
    when the host policy allows it and the backend declares it). ``allowlist`` allows egress only
    to the backend's egress proxy (which enforces the allowlist); without a proxy, none at all.
    The operator-run proxy (``managed``) is its own namespace's pods with the proxy labels, on
    its port: the sandbox dials the Service's cluster IP, which is translated to the pod's
    address before the policy judges the packet.

    One policy per (backend, egress mode), not one per Sandbox: what it allows depends on nothing
    else, and the network plugin's work grows with the number of policies
    (docs/sandbox-objects.md). It has no owner: it stays while the namespace is served, is made
    again when deleted while pods need it, and is replaced when it differs from this.
    """
    labels = lbl.egress_policy_labels(backend.name, egress.value)
    spec: NetworkPolicySpec = {
        "podSelector": {"matchLabels": dict(labels)},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": [],
    }
    if egress is Egress.UNRESTRICTED:
        spec["policyTypes"] = ["Ingress"]
        del spec["egress"]
    proxy = backend.egress_proxy
    if egress is Egress.ALLOWLIST and proxy is not None and proxy.managed:
        if managed is not None:
            spec["egress"] = [
                {
                    "to": [{"podSelector": {"matchLabels": proxy_labels()}}],
                    "ports": [{"protocol": "TCP", "port": managed.port}],
                }
            ]
    elif egress is Egress.ALLOWLIST and proxy is not None:
        peer: NetworkPolicyPeer = {"podSelector": {"matchLabels": dict(proxy.pod_selector)}}
        if proxy.namespace_selector is not None:
            peer["namespaceSelector"] = {"matchLabels": dict(proxy.namespace_selector)}
        assert proxy.port is not None  # an external proxy's port is required (its validator)
        spec["egress"] = [{"to": [peer], "ports": [{"protocol": "TCP", "port": proxy.port}]}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": kubeobj.NETWORK_POLICY_KIND,
        "metadata": {
            "name": naming.egress_policy_name(backend.name, egress.value),
            "namespace": namespace,
            "labels": labels,
        },
        "spec": spec,
    }


def egress_policy_key(policy: ObjectView) -> tuple[str, Egress] | None:
    """(backend, egress mode) of a namespace's egress NetworkPolicy made by
    :func:`build_egress_policy`; None for any other (a pool's deny-all, a per-Sandbox policy of
    an older version)."""
    labels = policy.metadata.labels
    backend, egress = labels.get(lbl.BACKEND_LABEL), labels.get(lbl.EGRESS_LABEL)
    if not backend or egress not in {e.value for e in Egress}:
        return None
    return str(backend), Egress(egress)


def policy_spec_differs(have: Any, want: Any) -> bool:
    """Whether a NetworkPolicy's spec as the API server returns it differs from ``want``: empty
    lists and maps count as absent (the server drops ``ingress: []``)."""
    return bool(_canonical(have) != _canonical(want))


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        out = {k: _canonical(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in ({}, [], None)}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value
