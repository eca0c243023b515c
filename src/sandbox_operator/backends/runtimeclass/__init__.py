"""The runtime-class backend: one hardened pod (plus a NetworkPolicy) per sandbox.

The pod runs the spec's image on the backend's RuntimeClass (runc, gVisor, Kata, ...) with a
keep-alive command; the workload runs through ``pods/exec``. Builders are pure functions over the
request, so what gets created is testable without a cluster; the driver below only creates, reads
and deletes.

Security profile of every sandbox pod (see docs/operator.md):

* no service-account token (``automountServiceAccountToken: false``), ``enableServiceLinks: false``;
* no host namespaces (hostNetwork/hostPID/hostIPC false), no host paths: only emptyDirs
  (the work dir and ``/tmp``), or for a spec with ``storage`` the sandbox's own
  PersistentVolumeClaim as the work dir (it outlives the pod: suspend deletes the pod only);
* ``allowPrivilegeEscalation: false``, every capability dropped, seccomp ``RuntimeDefault``,
  ``privileged: false``, read-only root filesystem (default);
* non-root: uid/gid 65532 unless the backend's ``pod`` settings say otherwise, and
  ``runAsNonRoot: true`` so the kubelet refuses an image that would run as root;
* ``restartPolicy: Never``: a sandbox whose keep-alive dies has lost its state, so it is reported
  as failed rather than silently restarted empty;
* owned by its Sandbox (garbage-collected with it as a last resort) and labelled with the hashed
  key parts, so a whole conversation is found by a label selector.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from sandbox_operator import labels as lbl
from sandbox_operator import naming
from sandbox_operator.backends.base import (
    Availability,
    BackendObject,
    DisposalError,
    EnsureRequest,
    Observation,
    ObservedPhase,
    PoolRef,
    SandboxRef,
    ServedBy,
    StartupError,
    TransientError,
)
from sandbox_operator.backends.egress_proxy import (
    PROXY_ADDRESS_ANNOTATION,
    ManagedEgressProxy,
    ProxyAddress,
    ProxyError,
    proxy_labels,
)
from sandbox_operator.backends.owners import owner_reference
from sandbox_operator.backends.warmpool import WarmPoolPods, pod_origin
from sandbox_operator.config import (
    ManagedEgressProxySettings,
    PodSettings,
    RuntimeClassBackendConfig,
)
from sandbox_operator.kubecalls import call_json

if TYPE_CHECKING:
    from sandbox_operator.reconcile.views import Store

from sandbox_operator.contract import (
    SANDBOX_WARM_POOL_KIND,
    ConditionReason,
    DisposalCode,
    DisposalFailure,
    Egress,
    SandboxKey,
    SandboxSpec,
)

log = logging.getLogger(__name__)

CONTAINER_NAME = "sandbox"
WORK_VOLUME = "work"
TMP_VOLUME = "tmp"

POD = "Pod"
NETWORK_POLICY = "NetworkPolicy"
#: The work volume of a sandbox with ``spec.storage`` (named ``naming.work_volume_name``).
CLAIM = "PersistentVolumeClaim"

#: Waiting reasons that mean the container will not start without someone changing something.
FATAL_WAITING_REASONS = frozenset(
    {
        "ErrImageNeverPull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImagePull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "StartError",
        "CrashLoopBackOff",
    }
)

PULL_REASONS = frozenset({"ErrImageNeverPull", "ImagePullBackOff", "ErrImagePull"})

#: Why a ready pod under a managed egress proxy is not usable yet (Ready stays False with it).
EGRESS_PENDING = "waiting for the egress proxy to admit the sandbox"

#: What container runtimes answer (in the kubelet's FailedCreatePodSandBox events) when the node
#: has no handler for a RuntimeClass: containerd, then CRI-O. The kubelet retries such a pod
#: forever, so without reading them the sandbox would only ever end as StartupTimeout.
MISSING_HANDLER_PATTERNS = (
    re.compile(r'no runtime for "([^"]*)" is configured'),
    re.compile(r"failed to find runtime handler (\S+)"),
)
#: How long a pod may wait for its pod sandbox before the kubelet's events are read (the normal
#: path never pays for the list call).
SANDBOX_EVENTS_AFTER_SECONDS = 3.0
#: While a pod still waits for its pod sandbox after that, how often its events are read again.
SANDBOX_EVENTS_EVERY_SECONDS = 5.0
RUNTIME_HANDLER_MISSING = "RuntimeHandlerMissing"

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


# --------------------------------------------------------------------------------------------
# Pure builders


def _metadata(request: EnsureRequest, name: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": request.sandbox.namespace,
        "labels": dict(request.labels),
        "annotations": dict(request.annotations),
    }
    if request.sandbox.uid:
        meta["ownerReferences"] = [owner_reference(request.sandbox)]
    return meta


def _resources(spec: SandboxSpec) -> dict[str, Any]:
    """Requests and limits of the sandbox container, always both for cpu and memory.

    ``spec`` is expected to carry resources resolved under the host policy (the reconciler passes
    ``policy.resolve_spec(host, spec)``); whatever is still unset gets the built-in defaults, so a
    pod never runs without limits or with requests above them. Resolving is idempotent.
    """
    from sandbox_operator.contract import HostPolicy
    from sandbox_operator.policy import resolve_resources

    resolved = resolve_resources(HostPolicy(), spec)
    return {
        part: {r: str(getattr(getattr(resolved, part), r)) for r in ("cpu", "memory")}
        for part in ("requests", "limits")
    }


def container_security_context(pod: PodSettings) -> dict[str, Any]:
    ctx: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
        "readOnlyRootFilesystem": pod.read_only_root_filesystem,
        "runAsNonRoot": pod.run_as_non_root,
    }
    if pod.run_as_user is not None:
        ctx["runAsUser"] = pod.run_as_user
    if pod.run_as_group is not None:
        ctx["runAsGroup"] = pod.run_as_group
    return ctx


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


def dns_settings(spec: SandboxSpec, proxy_url: str | None) -> dict[str, Any]:
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
    options = [
        {"name": name} if value is None else {"name": name, "value": value}
        for name, value in NO_DNS_OPTIONS
    ]
    return {
        "dnsPolicy": "None",
        "dnsConfig": {"nameservers": [NO_DNS_NAMESERVER], "options": options},
    }


def build_pod(
    request: EnsureRequest,
    backend: RuntimeClassBackendConfig,
    managed_proxy: ProxyAddress | None = None,
) -> dict[str, Any]:
    """The pod manifest that serves a sandbox on a runtime-class backend.

    ``managed_proxy``: the address of the namespace's operator-run egress proxy (for a backend
    whose ``egressProxy`` is ``managed``), given to the sandbox as a number (an allowlisted
    sandbox resolves no names) and recorded on the pod for recovery.
    """
    metadata = _metadata(request, naming.pod_name(request.sandbox.name))
    claim = naming.work_volume_name(request.sandbox.name) if request.spec.storage else None
    return pod_manifest(request.spec, backend, metadata, managed_proxy, work_claim=claim)


def build_work_volume_claim(request: EnsureRequest) -> dict[str, Any]:
    """The PersistentVolumeClaim of a sandbox's work directory (``spec.storage``): labelled and
    owned like its pod (so disposal, scope purges and the garbage collector find it), sized and
    classed by the spec (no ``storageClassName``: the cluster's default class)."""
    storage = request.spec.storage
    if storage is None:
        raise ValueError("the spec asks for no storage")
    spec: dict[str, Any] = {
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
    metadata: dict[str, Any],
    managed_proxy: ProxyAddress | None = None,
    *,
    work_claim: str | None = None,
) -> dict[str, Any]:
    """The pod for ``spec`` on ``backend`` with the given metadata: everything of a sandbox pod
    but who it serves (a Sandbox's pod, or a warm pool's pod made before it serves anyone).

    ``work_claim``: the PersistentVolumeClaim mounted at the work dir (a spec with ``storage``)
    instead of an emptyDir; ``/tmp`` stays an emptyDir either way."""
    pod = backend.pod
    work_dir = spec.work_dir
    pod_security: dict[str, Any] = {
        "runAsNonRoot": pod.run_as_non_root,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if pod.run_as_user is not None:
        pod_security["runAsUser"] = pod.run_as_user
    if pod.run_as_group is not None:
        pod_security["runAsGroup"] = pod.run_as_group
    if pod.fs_group is not None:
        pod_security["fsGroup"] = pod.fs_group
    work_volume: dict[str, Any] = {"name": WORK_VOLUME, "emptyDir": {}}
    if work_claim is not None:
        work_volume = {"name": WORK_VOLUME, "persistentVolumeClaim": {"claimName": work_claim}}
    elif pod.work_dir_size_limit:
        work_volume["emptyDir"]["sizeLimit"] = pod.work_dir_size_limit
    mounts = [{"name": WORK_VOLUME, "mountPath": work_dir}]
    volumes = [work_volume]
    if work_dir != "/tmp":
        mounts.append({"name": TMP_VOLUME, "mountPath": "/tmp"})
        volumes.append({"name": TMP_VOLUME, "emptyDir": {"sizeLimit": pod.tmp_size_limit}})
    env = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "SANDBOX_WORK_DIR", "value": work_dir},
    ]
    proxy = backend.egress_proxy
    proxy_url = None
    if proxy is not None and proxy.managed:
        proxy_url = managed_proxy.url if managed_proxy is not None else None
    elif proxy is not None:
        proxy_url = proxy.url
    if spec.egress is Egress.ALLOWLIST and proxy is not None and proxy_url:
        for var in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
            env.append({"name": var, "value": proxy_url})
        if proxy.no_proxy:
            env += [{"name": v, "value": proxy.no_proxy} for v in ("NO_PROXY", "no_proxy")]
    container: dict[str, Any] = {
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
    pod_spec: dict[str, Any] = {
        "runtimeClassName": backend.runtime_class_name,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "shareProcessNamespace": False,
        "terminationGracePeriodSeconds": pod.termination_grace_period_seconds,
        "securityContext": pod_security,
        "containers": [container],
        "volumes": volumes,
        **dns_settings(spec, proxy_url),
    }
    if pod.node_selector:
        pod_spec["nodeSelector"] = dict(pod.node_selector)
    if pod.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in pod.tolerations]
    if spec.egress is Egress.ALLOWLIST and proxy is not None and proxy.managed and proxy_url:
        assert managed_proxy is not None
        metadata.setdefault("annotations", {})[PROXY_ADDRESS_ANNOTATION] = managed_proxy.annotation
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def build_network_policy(
    request: EnsureRequest,
    backend: RuntimeClassBackendConfig | None = None,
    managed: ManagedEgressProxySettings | None = None,
) -> dict[str, Any]:
    """The NetworkPolicy of a sandbox pod: no ingress ever; egress by the spec's mode.

    ``closed`` denies all egress (DNS included). ``unrestricted`` leaves egress open (only served
    when the host policy allows it and the backend declares it). ``allowlist`` allows egress only
    to the backend's egress proxy (which enforces the allowlist); without a proxy, none at all.
    The operator-run proxy (``managed``) is its own namespace's pods with the proxy labels, on
    its port: the sandbox dials the Service's cluster IP, which is translated to the pod's
    address before the policy judges the packet.
    """
    name = naming.network_policy_name(request.sandbox.name)
    selector = {lbl.SANDBOX_LABEL: lbl.sandbox_label_value(request.sandbox.name)}
    policy_types = ["Ingress", "Egress"]
    spec: dict[str, Any] = {
        "podSelector": {"matchLabels": selector},
        "policyTypes": policy_types,
        "ingress": [],
        "egress": [],
    }
    if request.spec.egress is Egress.UNRESTRICTED:
        spec["policyTypes"] = ["Ingress"]
        del spec["egress"]
    proxy = backend.egress_proxy if backend is not None else None
    if request.spec.egress is Egress.ALLOWLIST and proxy is not None and proxy.managed:
        if managed is not None:
            spec["egress"] = [
                {
                    "to": [{"podSelector": {"matchLabels": proxy_labels()}}],
                    "ports": [{"protocol": "TCP", "port": managed.port}],
                }
            ]
    elif request.spec.egress is Egress.ALLOWLIST and proxy is not None:
        peer: dict[str, Any] = {"podSelector": {"matchLabels": dict(proxy.pod_selector)}}
        if proxy.namespace_selector is not None:
            peer["namespaceSelector"] = {"matchLabels": dict(proxy.namespace_selector)}
        spec["egress"] = [{"to": [peer], "ports": [{"protocol": "TCP", "port": proxy.port}]}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(request, name),
        "spec": spec,
    }


def _parse_time(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def classify_pod(pod: Mapping[str, Any] | None) -> Observation:
    """What a pod's status says about its sandbox (pure; ``pod`` is the API's JSON shape)."""
    if pod is None:
        return Observation(ObservedPhase.ABSENT)
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    served = ServedBy(
        kind="Pod",
        name=meta.get("name", ""),
        namespace=meta.get("namespace", ""),
        uid=meta.get("uid", ""),
    )
    created = _parse_time(meta.get("creationTimestamp"))
    if meta.get("deletionTimestamp"):
        return Observation(
            ObservedPhase.DISPOSING, served, "Terminating", "pod is being deleted", created
        )
    phase = status.get("phase", "Pending")
    statuses = status.get("containerStatuses") or []
    cs = next((c for c in statuses if c.get("name") == CONTAINER_NAME), None)
    ready_cond = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    if phase in ("Failed", "Succeeded"):
        term = ((cs or {}).get("state") or {}).get("terminated") or {}
        why = term.get("reason") or status.get("reason") or phase
        code = term.get("exitCode")
        msg = f"pod {phase.lower()}: {why}" + (f" (exit code {code})" if code is not None else "")
        if status.get("message"):
            msg += f": {status['message']}"
        return Observation(ObservedPhase.FAILED, served, str(why), msg, created)
    if cs is not None:
        state = cs.get("state") or {}
        waiting = state.get("waiting")
        terminated = state.get("terminated")
        if waiting and waiting.get("reason") in FATAL_WAITING_REASONS:
            reason = str(waiting["reason"])
            msg = f"container cannot start: {reason}"
            if reason in PULL_REASONS:
                # The kubelet's pull message names registry endpoints and resolvers: keep it out.
                msg += f" (image {cs.get('image') or 'unknown'} is not available to the node)"
            elif waiting.get("message"):
                msg += f": {str(waiting['message'])[:300]}"
            return Observation(ObservedPhase.STARTUP_FAILED, served, reason, msg, created)
        if terminated:
            reason = str(terminated.get("reason") or "Terminated")
            msg = f"container exited: {reason} (exit code {terminated.get('exitCode')})"
            return Observation(ObservedPhase.FAILED, served, reason, msg, created)
        if state.get("running") is not None and cs.get("ready"):
            ready_at = _parse_time((ready_cond or {}).get("lastTransitionTime"))
            return Observation(
                ObservedPhase.READY, served, "Running", "pod is running", created, ready_at
            )
    # Unschedulable or still creating: not (yet) fatal; the startup timeout bounds it.
    detail = ""
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            detail = f"not scheduled: {cond.get('reason', '')} {cond.get('message', '')}".strip()
    if not detail and cs and (cs.get("state") or {}).get("waiting"):
        detail = str(cs["state"]["waiting"].get("reason") or "")
    return Observation(
        ObservedPhase.STARTING, served, detail or phase, detail or f"pod is {phase}", created
    )


def missing_handler(events: Iterable[Mapping[str, Any]]) -> str | None:
    """The runtime handler a node lacks, as its container runtime told the kubelet, if so."""
    for event in events:
        if event.get("reason") != "FailedCreatePodSandBox":
            continue
        for pattern in MISSING_HANDLER_PATTERNS:
            found = pattern.search(str(event.get("message") or ""))
            if found:
                return found.group(1).strip("\"'")
    return None


def awaits_pod_sandbox(pod: Mapping[str, Any], now: datetime) -> bool:
    """A pod bound to a node for a while whose containers the kubelet has not created yet."""
    status = pod.get("status") or {}
    if status.get("phase", "Pending") != "Pending" or not (pod.get("spec") or {}).get("nodeName"):
        return False
    waiting = [
        ((c.get("state") or {}).get("waiting") or {}).get("reason")
        for c in status.get("containerStatuses") or []
    ]
    if any(reason not in (None, "ContainerCreating") for reason in waiting):
        return False
    created = _parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
    return created is not None and (now - created).total_seconds() >= SANDBOX_EVENTS_AFTER_SECONDS


def foreign_claim(claim: Mapping[str, Any], uid: str) -> str:
    """Why a sandbox (Sandbox ``uid``) may not start on the work volume ``claim`` found under
    its name, or "": the claim belongs to another Sandbox, or is being deleted."""
    meta = claim.get("metadata") or {}
    name = meta.get("name", "")
    owners = [o.get("uid") for o in meta.get("ownerReferences") or []]
    if uid and uid not in owners:
        return (
            f"PersistentVolumeClaim {name} exists but belongs to another Sandbox (a previous one "
            "with this name that was not disposed yet)"
        )
    if meta.get("deletionTimestamp"):
        return f"PersistentVolumeClaim {name} is being deleted (a previous sandbox's work volume)"
    return ""


def backend_object(kind: str, obj: Mapping[str, Any]) -> BackendObject:
    meta = obj.get("metadata") or {}
    labels = dict(meta.get("labels") or {})
    owner = next(
        (o.get("uid", "") for o in meta.get("ownerReferences") or [] if o.get("kind") == "Sandbox"),
        "",
    )
    return BackendObject(
        kind=kind,
        name=meta.get("name", ""),
        namespace=meta.get("namespace", ""),
        sandbox_name=labels.get(lbl.SANDBOX_LABEL, ""),
        owner_uid=owner,
        deleting=bool(meta.get("deletionTimestamp")),
        labels=labels,
    )


# --------------------------------------------------------------------------------------------
# Driver


class RuntimeClassDriver:
    """Creates, observes and disposes sandbox pods on one RuntimeClass.

    ``api`` is a :class:`kubernetes_asyncio.client.ApiClient`.
    """

    _proxy_settings: ManagedEgressProxySettings | None = None
    _proxy: ManagedEgressProxy | None = None
    _proxy_task: asyncio.Task[None] | None = None
    _warm: WarmPoolPods | None = None
    _pods: Store | None = None
    _network_policies: Store | None = None
    _claims: Store | None = None

    def __init__(
        self,
        config: RuntimeClassBackendConfig,
        api: Any,
        *,
        dispose_timeout: float = 30.0,
        poll_interval: float = 0.5,
        egress_proxy: ManagedEgressProxySettings | None = None,
    ) -> None:
        from kubernetes_asyncio import client

        self._config = config
        # The operator-run egress proxy, for a backend whose egressProxy is `managed` (config
        # validation guarantees the operator-level section then exists).
        if config.egress_proxy is not None and config.egress_proxy.managed:
            if egress_proxy is None:
                raise ValueError(f"backend {config.name}: managed egress proxy not configured")
            self._proxy_settings = egress_proxy
            self._proxy = ManagedEgressProxy(egress_proxy, api)
        self._api = api
        # Typed as Any: bodies are plain manifests (dicts), which the client serializes as is.
        self._core: Any = client.CoreV1Api(api)
        self._net: Any = client.NetworkingV1Api(api)
        self._node: Any = client.NodeV1Api(api)
        self._dispose_timeout = dispose_timeout
        self._poll = poll_interval
        # The operator's watched views of its pods and NetworkPolicies (``use_views``). Without
        # them (tools, tests) every read goes to the API server, as a one-off caller expects.
        self._pods: Store | None = None
        self._network_policies: Store | None = None

    async def start(self, notify: Callable[[str, str], None]) -> None:
        """With a managed egress proxy: look at each namespace's proxy Service periodically
        (one read per namespace) and wake the allowlisted sandboxes of a namespace whose
        Service went away or moved (``notify(namespace, sandbox)``)."""
        if self._proxy is None or self._pods is None:
            return
        pods = self._pods

        def changed(namespace: str) -> None:
            for pod in pods:
                meta = pod.get("metadata") or {}
                if meta.get("namespace") != namespace:
                    continue
                if PROXY_ADDRESS_ANNOTATION not in (meta.get("annotations") or {}):
                    continue
                for owner in meta.get("ownerReferences") or []:
                    if owner.get("kind") == "Sandbox" and owner.get("name"):
                        notify(namespace, str(owner["name"]))
                    elif owner.get("kind") == SANDBOX_WARM_POOL_KIND and self.on_pool_change:
                        self.on_pool_change(namespace, str(owner.get("name", "")))

        self._proxy_task = asyncio.create_task(
            self._proxy.watch_services(changed), name=f"{self.name}-egress-proxy-services"
        )

    def use_views(self, pods: Store, network_policies: Store, claims: Store | None = None) -> None:
        """Read pods, NetworkPolicies and PersistentVolumeClaims (the work volumes of sandboxes
        with ``spec.storage``) from the operator's watched views from now on, and put what this
        driver creates into them at once (so the next pass sees its own writes)."""
        self._pods = pods
        self._network_policies = network_policies
        self._claims = claims

    #: Called with (namespace, pool) when an idle pod of that pool was given a proxy address
    #: that is no longer the namespace's proxy (the operator then replaces the pod).
    on_pool_change: Callable[[str, str], None] | None = None

    async def pool_proxy(self, pool: PoolRef, spec: SandboxSpec) -> ProxyAddress | None:
        """For an allowlist template on a backend whose egress proxy the operator runs: the
        namespace's proxy, applied with the pool among its owners, and its address (given to
        each pod the pool makes). None otherwise.

        Raises :class:`TransientError` or :class:`StartupError` as ``ensure`` does."""
        if spec.egress is not Egress.ALLOWLIST or self._proxy is None:
            return None
        try:
            return await self._proxy.ensure(pool.namespace, pool)
        except ProxyError as exc:
            if exc.permanent:
                raise StartupError(ConditionReason.STARTUP_FAILED, exc.message) from None
            raise TransientError(exc.message) from None

    def pool_pod_current(self, pod: Mapping[str, Any]) -> bool:
        """Whether an idle pool pod can serve as it is: a pod given a managed proxy's address is
        current only while the namespace's proxy Service is seen at that very address."""
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        given = ProxyAddress.parse(str(annotations.get(PROXY_ADDRESS_ANNOTATION, "")))
        if given is None:
            return True
        if self._proxy is None:
            return False
        namespace = str((pod.get("metadata") or {}).get("namespace", ""))
        return self._proxy.seen_address(namespace) == given

    def warm_pool_pods(self) -> WarmPoolPods | None:
        """The warm pool calls on this backend (only with the operator's views: a pool is
        counted and claimed from them)."""
        if self._pods is None or self._network_policies is None:
            return None
        if self._warm is None:
            self._warm = WarmPoolPods(self._api, self._pods, self._network_policies)
        return self._warm

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def config(self) -> RuntimeClassBackendConfig:
        return self._config

    async def check_available(self) -> Availability:
        from kubernetes_asyncio.client.exceptions import ApiException

        rc = self._config.runtime_class_name
        try:
            await self._node.read_runtime_class(rc)
        except ApiException as exc:
            if exc.status == 404:
                return Availability(False, f"RuntimeClass {rc!r} does not exist in the cluster")
            return Availability(False, f"RuntimeClass {rc!r} cannot be read (HTTP {exc.status})")
        return Availability(True)

    def _sanitize(self, obj: Any) -> Any:
        return self._api.sanitize_for_serialization(obj)

    async def _read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes_asyncio.client.exceptions import ApiException

        if self._pods is not None:
            return self._pods.get(namespace, name)
        try:
            pod = await self._core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        result: dict[str, Any] = self._sanitize(pod)
        return result

    async def ensure(self, request: EnsureRequest) -> ServedBy:
        from kubernetes_asyncio.client.exceptions import ApiException

        ns = request.sandbox.namespace
        address: ProxyAddress | None = None
        if request.spec.egress is Egress.ALLOWLIST and self._proxy is not None:
            # The namespace's proxy first: the pod is given its Service's address.
            try:
                address = await self._proxy.ensure(ns, request.sandbox)
            except ProxyError as exc:
                if exc.permanent:
                    raise StartupError(ConditionReason.STARTUP_FAILED, exc.message) from None
                raise TransientError(exc.message) from None
        manifest = build_pod(request, self._config, address)
        name = manifest["metadata"]["name"]
        # The NetworkPolicy goes first, so the pod never runs unconfined for a moment.
        await self.ensure_network_policy(request)
        if request.spec.storage is not None:
            # The work volume before the pod that mounts it (a pod naming a missing claim
            # would only wait, unschedulable).
            await self.ensure_work_volume(request)
        try:
            if self._pods is not None:
                created_pod = await call_json(self._core.create_namespaced_pod, ns, manifest)
                self._pods.upsert(created_pod)
                meta = created_pod.get("metadata") or {}
                return ServedBy("Pod", str(meta.get("name", name)), ns, str(meta.get("uid", "")))
            created = await self._core.create_namespaced_pod(ns, manifest)
            return ServedBy("Pod", created.metadata.name, ns, created.metadata.uid or "")
        except ApiException as exc:
            if exc.status != 409:
                raise StartupError(
                    ConditionReason.STARTUP_FAILED,
                    f"pod was refused by the API server (HTTP {exc.status}): {_api_message(exc)}",
                ) from None
        existing = await self._read_pod(ns, name)
        if existing is None and self._pods is not None:
            # Not in the view yet (created by another replica a moment ago): ask once.
            with contextlib.suppress(ApiException):
                existing = self._sanitize(await self._core.read_namespaced_pod(name, ns))
        if existing is None:  # deleted between our create and read: next pass creates it
            return ServedBy("Pod", name, ns, "")
        existing_meta = existing.get("metadata") or {}
        owners = [o.get("uid") for o in existing_meta.get("ownerReferences") or []]
        if request.sandbox.uid and request.sandbox.uid not in owners:
            raise StartupError(
                ConditionReason.KEY_UNCLEAN,
                f"pod {name} exists but belongs to another Sandbox (a previous one with this "
                "name that was not disposed yet)",
            )
        return ServedBy("Pod", name, ns, existing_meta.get("uid", ""))

    async def ensure_network_policy(self, request: EnsureRequest) -> None:
        """Create the sandbox's NetworkPolicy unless it exists (it never changes for a sandbox).

        Raises :class:`StartupError` when the API server refuses it."""
        from kubernetes_asyncio.client.exceptions import ApiException

        ns = request.sandbox.namespace
        np = build_network_policy(request, self._config, self._proxy_settings)
        try:
            if self._network_policies is None:
                await self._net.create_namespaced_network_policy(ns, np)
            elif self._network_policies.get(ns, np["metadata"]["name"]) is None:
                created_np = await call_json(self._net.create_namespaced_network_policy, ns, np)
                self._network_policies.upsert(created_np)
        except ApiException as exc:
            if exc.status != 409:  # 409: already there
                raise StartupError(
                    ConditionReason.STARTUP_FAILED,
                    f"NetworkPolicy was refused by the API server (HTTP {exc.status}): "
                    f"{_api_message(exc)}",
                ) from None

    async def ensure_work_volume(self, request: EnsureRequest) -> None:
        """Create the sandbox's work volume (``spec.storage``) unless it is there: found in the
        views (or created, or already there: 409) and owned by this Sandbox. A claim under its
        name that another Sandbox owns (an earlier one of the same key, not disposed yet) or that
        is being deleted raises :class:`StartupError` ``KeyUnclean``: starting on it would hand
        the sandbox someone else's files, or a volume about to go."""
        from kubernetes_asyncio.client.exceptions import ApiException

        ns = request.sandbox.namespace
        claim = build_work_volume_claim(request)
        name = claim["metadata"]["name"]
        existing = self._claims.get(ns, name) if self._claims is not None else None
        if existing is None:
            try:
                created = await call_json(
                    self._core.create_namespaced_persistent_volume_claim, ns, claim
                )
                if self._claims is not None:
                    self._claims.upsert(created)
                return
            except ApiException as exc:
                if exc.status != 409:  # 409: already there (made by another pass or replica)
                    raise StartupError(
                        ConditionReason.STARTUP_FAILED,
                        f"PersistentVolumeClaim {name} was refused by the API server "
                        f"(HTTP {exc.status}): {_api_message(exc)}",
                    ) from None
            try:
                existing = await call_json(
                    self._core.read_namespaced_persistent_volume_claim, name, ns
                )
            except ApiException as exc:
                if exc.status == 404:  # deleted between our create and read: the next pass
                    raise TransientError(f"PersistentVolumeClaim {name} went away") from None
                raise TransientError(
                    f"reading PersistentVolumeClaim {name}: HTTP {exc.status}"
                ) from None
            if self._claims is not None:
                self._claims.upsert(existing)
        problem = foreign_claim(existing, request.sandbox.uid)
        if problem:
            raise StartupError(ConditionReason.KEY_UNCLEAN, problem)

    def _claimed_pod(self, sandbox: SandboxRef) -> dict[str, Any] | None:
        """A pod claimed from a warm pool for the sandbox (another name than its own): found in
        the views by the sandbox label and its owner, even before status.servedBy records it."""
        if self._pods is None or not sandbox.uid:
            return None
        value = lbl.sandbox_label_value(sandbox.name)
        for pod in self._pods.select(sandbox.namespace, lbl.SANDBOX_LABEL, value):
            meta = pod.get("metadata") or {}
            if lbl.POOL_LABEL not in (meta.get("labels") or {}):
                continue
            if any(o.get("uid") == sandbox.uid for o in meta.get("ownerReferences") or []):
                return pod
        return None

    async def observe(self, sandbox: SandboxRef) -> Observation:
        pod = await self._read_pod(sandbox.namespace, naming.pod_name(sandbox.name))
        recorded = sandbox.served_by
        # A pod named before pods were always `sbx-...` (recorded in status.servedBy) keeps
        # serving its Sandbox until it ends; dispose finds it by the sandbox label.
        if (
            pod is None
            and recorded is not None
            and recorded.kind == "Pod"
            and recorded.name != naming.pod_name(sandbox.name)
        ):
            pod = await self._read_pod(recorded.namespace or sandbox.namespace, recorded.name)
        if pod is None:
            pod = self._claimed_pod(sandbox)
        if pod is not None and sandbox.uid:
            owners = [
                o.get("uid") for o in (pod.get("metadata") or {}).get("ownerReferences") or []
            ]
            if sandbox.uid not in owners:
                # Someone else's pod under our name; not ours to report as our sandbox.
                return Observation(
                    ObservedPhase.ABSENT, None, "Foreign", "pod belongs to another Sandbox"
                )
        observation = classify_pod(pod)
        if pod is not None:
            observation = replace(observation, served_from=pod_origin(pod))
        if pod is not None and observation.phase is ObservedPhase.STARTING:
            now = datetime.now(UTC)
            if awaits_pod_sandbox(pod, now):
                observation = await self._check_handler(pod, observation)
                if observation.phase is ObservedPhase.STARTING:
                    # Nothing in the pod's own status will change while the node cannot run
                    # it: look at the kubelet's events again a little later.
                    observation = replace(
                        observation,
                        recheck_at=now + timedelta(seconds=SANDBOX_EVENTS_EVERY_SECONDS),
                    )
            elif observation.created_at is not None:
                due = observation.created_at + timedelta(seconds=SANDBOX_EVENTS_AFTER_SECONDS)
                if due > now and awaits_pod_sandbox(pod, due):
                    observation = replace(observation, recheck_at=due)
        if pod is not None and self._proxy is not None:
            observation = await self._check_proxy(sandbox, pod, observation)
        return observation

    async def _check_handler(self, pod: Mapping[str, Any], observation: Observation) -> Observation:
        """A pod stuck before its containers exist: does the node lack the runtime handler?"""
        from kubernetes_asyncio.client.exceptions import ApiException

        meta = pod.get("metadata") or {}
        try:
            listed = await self._core.list_namespaced_event(
                meta.get("namespace", ""),
                field_selector=f"involvedObject.uid={meta.get('uid', '')},"
                "reason=FailedCreatePodSandBox",
            )
        except ApiException as exc:
            log.warning("cannot read the events of pod %s (HTTP %s)", meta.get("name"), exc.status)
            return observation
        events: list[dict[str, Any]] = self._sanitize(listed).get("items") or []
        handler = missing_handler(events)
        if handler is None:
            return observation
        rc = self._config.runtime_class_name
        node = (pod.get("spec") or {}).get("nodeName", "")
        return Observation(
            ObservedPhase.STARTUP_FAILED,
            observation.served_by,
            RUNTIME_HANDLER_MISSING,
            f"node {node} cannot run RuntimeClass {rc!r}: its container runtime has no handler "
            f"{handler!r} configured",
            observation.created_at,
        )

    async def _check_proxy(
        self, sandbox: SandboxRef, pod: Mapping[str, Any], observation: Observation
    ) -> Observation:
        """A live pod given a managed proxy's address: is the proxy still there (one GET), and
        has it admitted the sandbox? A ready pod the proxy does not serve yet would meet
        connection refused or 403 UnknownSandbox on its first request, so it is reported
        ``pending`` until the proxy has written ``status.egress.admitted``."""
        if observation.phase not in (ObservedPhase.READY, ObservedPhase.STARTING):
            return observation
        assert self._proxy is not None
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        given = ProxyAddress.parse(str(annotations.get(PROXY_ADDRESS_ANNOTATION, "")))
        if given is None:
            return observation
        problem = await self._proxy.check(sandbox.namespace, sandbox, given)
        if not problem:
            if observation.phase is ObservedPhase.READY and sandbox.egress_admitted is None:
                return replace(observation, pending=EGRESS_PENDING)
            return observation
        return Observation(
            ObservedPhase.FAILED,
            observation.served_by,
            "EgressProxyLost",
            problem,
            observation.created_at,
        )

    def _deleter(self, kind: str) -> Any:
        """The API call that deletes one object of ``kind`` by (name, namespace)."""
        if kind == POD:
            return self._core.delete_namespaced_pod
        if kind == CLAIM:
            return self._core.delete_namespaced_persistent_volume_claim
        return self._net.delete_namespaced_network_policy

    def _reader(self, kind: str) -> Any:
        if kind == POD:
            return self._core.read_namespaced_pod
        if kind == CLAIM:
            return self._core.read_namespaced_persistent_volume_claim
        return self._net.read_namespaced_network_policy

    async def _delete_and_wait(self, kind: str, namespace: str, name: str) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        async def delete() -> None:
            await self._deleter(kind)(name, namespace)

        async def exists() -> bool:
            try:
                await self._reader(kind)(name, namespace)
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
            return True

        try:
            try:
                await delete()
            except ApiException as exc:
                if exc.status != 404:
                    raise
                return
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self._dispose_timeout
            while await exists():
                if loop.time() >= deadline:
                    raise DisposalError(
                        DisposalFailure(
                            code=DisposalCode.TIMEOUT,
                            detail=f"{kind} {name} still present after {self._dispose_timeout:g}s",
                            backend=self.name,
                        )
                    )
                await asyncio.sleep(self._poll)
        except ApiException as exc:
            code = DisposalCode.REFUSED if exc.status in (401, 403) else DisposalCode.UNKNOWN
            raise DisposalError(
                DisposalFailure(
                    code=code,
                    detail=f"deleting {kind} {name}: HTTP {exc.status}",
                    backend=self.name,
                )
            ) from None
        except (TimeoutError, OSError) as exc:
            raise _unreachable(self.name, f"deleting {kind} {name}", exc) from None

    async def dispose(self, sandbox: SandboxRef) -> None:
        name = naming.pod_name(sandbox.name)
        errors: list[DisposalError] = []
        # The pod first: its work volume (if any) is released only once no pod uses it.
        own = (
            (POD, name),
            (NETWORK_POLICY, naming.network_policy_name(sandbox.name)),
            (CLAIM, naming.work_volume_name(sandbox.name)),
        )
        for kind, obj_name in own:
            try:
                await self._delete_and_wait(kind, sandbox.namespace, obj_name)
            except DisposalError as exc:
                errors.append(exc)
        # Anything else carrying this sandbox's label (e.g. left by an older naming scheme).
        for obj in await self._list(sandbox.namespace, lbl.sandbox_selector(sandbox.name)):
            if (obj.kind, obj.name) in own:
                continue
            try:
                await self.dispose_object(obj)
            except DisposalError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    # ---- disposal without waiting: the operator's watches say when it landed ----------------

    def _seen_children(self, sandbox: SandboxRef) -> list[BackendObject]:
        assert self._pods is not None and self._network_policies is not None
        value = lbl.sandbox_label_value(sandbox.name)
        ns = sandbox.namespace
        found = [backend_object("Pod", p) for p in self._pods.select(ns, lbl.SANDBOX_LABEL, value)]
        found += [
            backend_object("NetworkPolicy", n)
            for n in self._network_policies.select(sandbox.namespace, lbl.SANDBOX_LABEL, value)
        ]
        if self._claims is not None:
            found += [
                backend_object(CLAIM, c) for c in self._claims.select(ns, lbl.SANDBOX_LABEL, value)
            ]
        recorded = sandbox.served_by
        if (
            recorded is not None
            and recorded.kind == "Pod"
            and not any(o.kind == "Pod" and o.name == recorded.name for o in found)
        ):
            pod = self._pods.get(recorded.namespace or sandbox.namespace, recorded.name)
            if pod is not None:
                found.append(backend_object("Pod", pod))
        backend = self.name
        return [o for o in found if o.labels.get(lbl.BACKEND_LABEL, backend) == backend]

    @property
    def watches_disposal(self) -> bool:
        """True when disposal is asked for here and its landing is seen through the watches
        (``request_disposal``); False: ``dispose`` deletes and waits by polling."""
        return self._pods is not None

    async def request_disposal(
        self, sandbox: SandboxRef, *, requested: bool = False
    ) -> list[BackendObject]:
        """Delete what serves the sandbox and is not being deleted yet; return what is still
        there (its deletion requested). No wait, no read: the views say what exists, and the
        watch event of each deletion brings the operator back. ``requested``: a collection
        delete already asked for these (a scope purge), whose effect the views may not show
        yet; nothing is deleted again, only what remains is returned.

        Raises :class:`DisposalError` when the API server refuses a deletion.
        """
        remaining = self._seen_children(sandbox)
        if requested:
            return remaining
        for obj in remaining:
            if not obj.deleting:
                await self._delete(obj.kind, obj.namespace, obj.name)
        return remaining

    # ---- suspend and resume (spec.storage): the pod goes, its work volume stays ---------------

    @property
    def suspends(self) -> bool:
        """A sandbox with ``spec.storage`` can be suspended: its work dir is a PVC of its own."""
        return True

    async def suspend(self, sandbox: SandboxRef) -> list[BackendObject]:
        """Delete the pod(s) serving the sandbox and nothing else: its PersistentVolumeClaim,
        NetworkPolicy and identity stay. Returns the pods still there (their deletion requested;
        with the operator's views the pod's deletion event brings it back), empty once none is.
        Without the views, waits for the pod to be gone (like ``dispose``). Idempotent.

        Raises :class:`TransientError` when the API server refuses or cannot be reached."""
        try:
            if self._pods is None:
                for obj in await self._list(sandbox.namespace, lbl.sandbox_selector(sandbox.name)):
                    if obj.kind == POD:
                        await self._delete_and_wait(POD, obj.namespace, obj.name)
                await self._delete_and_wait(POD, sandbox.namespace, naming.pod_name(sandbox.name))
                return []
            pods = [o for o in self._seen_children(sandbox) if o.kind == POD]
            for obj in pods:
                if not obj.deleting:
                    await self._delete(obj.kind, obj.namespace, obj.name)
            return pods
        except DisposalError as exc:
            raise TransientError(f"suspending: {exc.failure.detail}") from None

    async def resume(self, request: EnsureRequest) -> ServedBy:
        """A new pod on the kept work volume (and NetworkPolicy): ``ensure``, which finds both
        and creates the pod. (Never a warm pool's pod: the operator claims none for a spec with
        storage.) A work volume that is gone (deleted by hand while suspended) is not replaced by
        an empty one: the files it held are lost, and starting anyway would hide that."""
        if request.spec.storage is not None and not await self._work_volume_exists(request):
            name = naming.work_volume_name(request.sandbox.name)
            raise StartupError(
                ConditionReason.FAILED,
                f"its work volume (PersistentVolumeClaim {name}) is gone: the files it held are "
                "lost, so the sandbox is not resumed on an empty one",
            )
        return await self.ensure(request)

    async def _work_volume_exists(self, request: EnsureRequest) -> bool:
        """Whether the sandbox's work volume exists: in the views, else asked once (a view not
        synced yet must not read as "gone")."""
        from kubernetes_asyncio.client.exceptions import ApiException

        ns, name = request.sandbox.namespace, naming.work_volume_name(request.sandbox.name)
        if self._claims is not None and self._claims.get(ns, name) is not None:
            return True
        try:
            await call_json(self._core.read_namespaced_persistent_volume_claim, name, ns)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise TransientError(
                f"reading PersistentVolumeClaim {name}: HTTP {exc.status}"
            ) from None
        return True

    async def request_conversation_disposal(
        self, namespace: str, scope: str, thread_id: str
    ) -> None:
        """Delete every pod, NetworkPolicy and PersistentVolumeClaim of one conversation on this
        backend: three calls (``deletecollection`` by label selector), whatever the number of
        sandboxes."""
        from kubernetes_asyncio.client.exceptions import ApiException

        selector = lbl.format_selector(
            {
                lbl.MANAGED_BY_LABEL: lbl.MANAGED_BY_VALUE,
                lbl.CONVERSATION_LABEL: lbl.conversation_value(scope, thread_id),
                lbl.BACKEND_LABEL: self.name,
            }
        )
        try:
            await call_json(
                self._core.delete_collection_namespaced_pod, namespace, label_selector=selector
            )
            await call_json(
                self._net.delete_collection_namespaced_network_policy,
                namespace,
                label_selector=selector,
            )
            await call_json(
                self._core.delete_collection_namespaced_persistent_volume_claim,
                namespace,
                label_selector=selector,
            )
        except ApiException as exc:
            raise _disposal_error(self.name, "deleting the conversation's objects", exc) from None

    async def _delete(self, kind: str, namespace: str, name: str) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            await call_json(self._deleter(kind), name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise _disposal_error(self.name, f"deleting {kind} {name}", exc) from None
        except (TimeoutError, OSError) as exc:
            raise _unreachable(self.name, f"deleting {kind} {name}", exc) from None

    async def _list(self, namespace: str, selector: str) -> list[BackendObject]:
        pods = await self._core.list_namespaced_pod(namespace, label_selector=selector)
        nps = await self._net.list_namespaced_network_policy(namespace, label_selector=selector)
        claims = await self._core.list_namespaced_persistent_volume_claim(
            namespace, label_selector=selector
        )
        out = [backend_object(POD, self._sanitize(p)) for p in pods.items]
        out += [backend_object(NETWORK_POLICY, self._sanitize(n)) for n in nps.items]
        out += [backend_object(CLAIM, self._sanitize(c)) for c in claims.items]
        backend = self.name
        return [o for o in out if o.labels.get(lbl.BACKEND_LABEL, backend) == backend]

    async def list_by_scope(
        self, namespace: str, scope: str, thread_id: str
    ) -> list[BackendObject]:
        return await self._list(namespace, lbl.scope_selector(scope, thread_id))

    async def list_by_key(self, namespace: str, key: SandboxKey) -> list[BackendObject]:
        if self._pods is not None and self._network_policies is not None:
            value = lbl.key_value(key)
            found = [
                backend_object("Pod", p) for p in self._pods.select(namespace, lbl.KEY_LABEL, value)
            ]
            found += [
                backend_object("NetworkPolicy", n)
                for n in self._network_policies.select(namespace, lbl.KEY_LABEL, value)
            ]
            if self._claims is not None:
                found += [
                    backend_object(CLAIM, c)
                    for c in self._claims.select(namespace, lbl.KEY_LABEL, value)
                ]
            backend = self.name
            return [o for o in found if o.labels.get(lbl.BACKEND_LABEL, backend) == backend]
        return await self._list(namespace, lbl.key_selector(key))

    async def dispose_object(self, obj: BackendObject) -> None:
        await self._delete_and_wait(obj.kind, obj.namespace, obj.name)

    async def close(self) -> None:
        task = self._proxy_task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._proxy_task = None


def _unreachable(backend: str, what: str, exc: BaseException) -> DisposalError:
    return DisposalError(
        DisposalFailure(
            code=DisposalCode.UNREACHABLE,
            detail=f"{what}: {type(exc).__name__}",
            backend=backend,
        )
    )


def _disposal_error(backend: str, what: str, exc: Any) -> DisposalError:
    status = getattr(exc, "status", None)
    code = DisposalCode.REFUSED if status in (401, 403) else DisposalCode.UNKNOWN
    return DisposalError(
        DisposalFailure(code=code, detail=f"{what}: HTTP {status}", backend=backend)
    )


def _api_message(exc: Any) -> str:
    import json

    with contextlib.suppress(Exception):
        body = json.loads(exc.body)
        return str(body.get("message", ""))[:500]
    return str(getattr(exc, "reason", ""))
