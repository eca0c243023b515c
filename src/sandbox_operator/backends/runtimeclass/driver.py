"""The runtime-class backend's driver: ensures a sandbox (NetworkPolicy, work volume, then its
pod), observes its pod, suspends and resumes it, and keeps an eye on the namespace's managed
egress proxy. What it creates comes from the pure builders in :mod:`.pods`, what a pod's status
means from :mod:`.observe`; the API calls on the sandbox's other objects and disposal are
:class:`.objects.RuntimeClassObjects`' part."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

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
    WatchedObjects,
)
from sandbox_operator.backends.confinement import (
    confinement_difference,
    confinement_digest,
)
from sandbox_operator.backends.egress_proxy import (
    PROXY_ADDRESS_ANNOTATION,
    ManagedEgressProxy,
    ProxyAddress,
    ProxyError,
)
from sandbox_operator.backends.runtimeclass.config import RuntimeClassBackendConfig
from sandbox_operator.backends.runtimeclass.objects import RuntimeClassObjects
from sandbox_operator.backends.runtimeclass.observe import (
    EGRESS_PENDING,
    RUNTIME_HANDLER_MISSING,
    SANDBOX_EVENTS_AFTER_SECONDS,
    SANDBOX_EVENTS_EVERY_SECONDS,
    awaits_pod_sandbox,
    classify_pod,
    missing_handler,
)
from sandbox_operator.backends.runtimeclass.pod_sandbox_failures import PodSandboxFailures
from sandbox_operator.backends.runtimeclass.pods import (
    POD,
    build_pod,
    pod_manifest,
)
from sandbox_operator.backends.warmpool import WarmPoolPods, pod_origin
from sandbox_operator.contract import (
    SANDBOX_KIND,
    SANDBOX_WARM_POOL_KIND,
    ConditionReason,
    Egress,
    SandboxSpec,
)
from sandbox_operator.egress.config import ManagedEgressProxySettings
from sandbox_operator.kubeapi import api_message
from sandbox_operator.kubecalls import call_json
from sandbox_operator.views import MetaView, ObjectView, OwnerRef, PodView
from sandbox_operator.views.pod import PodSpecView

#: The package's logger (the name it had when the package was one module).
log = logging.getLogger(__package__)


class RuntimeClassDriver(RuntimeClassObjects):
    """Creates, observes and disposes sandbox pods on one RuntimeClass.

    ``api`` is a :class:`kubernetes_asyncio.client.ApiClient`.
    """

    _proxy: ManagedEgressProxy | None = None
    _proxy_task: asyncio.Task[None] | None = None
    _warm: WarmPoolPods | None = None

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
        self._bind_api(api)
        self._node: Any = client.NodeV1Api(api)
        self._dispose_timeout = dispose_timeout
        self._poll = poll_interval
        # The operator's watched views of its pods and NetworkPolicies (``use_views``). Without
        # them (tools, tests) every read goes to the API server, as a one-off caller expects.
        self._pods: WatchedObjects[PodView] | None = None
        self._network_policies: WatchedObjects[ObjectView] | None = None

    async def start(self, notify: Callable[[str, str], None]) -> None:
        """With a managed egress proxy: look at each namespace's proxy Service periodically
        (one read per namespace) and wake the allowlisted sandboxes of a namespace whose
        Service went away or moved (``notify(namespace, sandbox)``)."""
        if self._proxy is None or self._pods is None:
            return
        pods = self._pods

        def changed(namespace: str) -> None:
            for pod in pods:
                meta = pod.metadata
                if meta.namespace != namespace:
                    continue
                if PROXY_ADDRESS_ANNOTATION not in meta.annotations:
                    continue
                for owner in meta.owner_references:
                    if owner.kind == SANDBOX_KIND and owner.name:
                        notify(namespace, owner.name)
                    elif owner.kind == SANDBOX_WARM_POOL_KIND and self.on_pool_change:
                        self.on_pool_change(namespace, owner.name)

        self._proxy_task = asyncio.create_task(
            self._proxy.watch_services(changed), name=f"{self.name}-egress-proxy-services"
        )

    def use_pod_sandbox_failures(self, failures: PodSandboxFailures) -> None:
        """Learn that a pod's node lacks the runtime handler from the operator's watch of the
        kubelet's ``FailedCreatePodSandBox`` events from now on, instead of reading a starting
        pod's Events (pod_sandbox_failures.py)."""
        self._failures = failures

    def use_views(
        self,
        pods: WatchedObjects[PodView],
        network_policies: WatchedObjects[ObjectView],
        claims: WatchedObjects[ObjectView] | None = None,
    ) -> None:
        """Read pods, NetworkPolicies and PersistentVolumeClaims (the work volumes of sandboxes
        with ``spec.storage``) from the operator's watched views from now on, and put what this
        driver creates into them at once (so the next pass sees its own writes)."""
        self._pods = pods
        self._network_policies = network_policies
        self._claims = claims

    #: Called with (namespace, pool) when an idle pod of that pool was given a proxy address
    #: that is no longer the namespace's proxy (the operator then replaces the pod).
    on_pool_change: Callable[[str, str], None] | None = None

    #: The operator's watch of FailedCreatePodSandBox events (``use_pod_sandbox_failures``);
    #: None: a starting pod's Events are read, as a one-off caller expects.
    _failures: PodSandboxFailures | None = None

    async def pool_proxy(self, pool: PoolRef, spec: SandboxSpec) -> ProxyAddress | None:
        """For an allowlist template on a backend whose egress proxy the operator runs: the
        namespace's proxy, applied with the pool among its owners, and its address (given to
        each pod the pool makes). None otherwise.

        Raises :class:`TransientError` or :class:`StartupError` as ``ensure`` does."""
        if spec.egress is not Egress.ALLOWLIST or self._proxy is None:
            return None
        return await self._ensure_proxy(pool.namespace, pool)

    async def _ensure_proxy(self, namespace: str, owner: SandboxRef | PoolRef) -> ProxyAddress:
        """The namespace's managed proxy, applied with ``owner`` among its owners: its address.
        A refusal that will not pass by itself is a :class:`StartupError`, else transient."""
        assert self._proxy is not None
        try:
            return await self._proxy.ensure(namespace, owner)
        except ProxyError as exc:
            if exc.permanent:
                raise StartupError(ConditionReason.STARTUP_FAILED, exc.message) from None
            raise TransientError(exc.message) from None

    def pool_pod_current(self, pod: PodView) -> bool:
        """Whether an idle pool pod can serve as it is: a pod given a managed proxy's address is
        current only while the namespace's proxy Service is seen at that very address."""
        meta = pod.metadata
        given = _proxy_address(meta)
        if given is None:
            return True
        if self._proxy is None:
            return False
        return self._proxy.seen_address(meta.namespace) == given

    def confines_as_made(
        self, pod: PodView, spec: SandboxSpec, managed_proxy: ProxyAddress | None
    ) -> bool:
        """Whether ``pod`` (a slim pod from the views, or a full one) is confined exactly as the
        pod this backend makes for ``spec``: its runtime class, service account and token, host
        namespaces, security contexts, volumes and containers (see
        :mod:`sandbox_operator.backends.confinement`). Labels and owners prove nothing: anyone
        who may create pods can copy them."""
        expected = confinement_digest(pod_manifest(spec, self._config, {}, managed_proxy)["spec"])
        have = pod.confinement or confinement_digest(pod.spec)
        return bool(have == expected)

    def pool_pod_serves(self, pod: PodView, spec: SandboxSpec) -> bool:
        """Whether an idle pool pod may be claimed for ``spec``: current (see
        :meth:`pool_pod_current`) and confined as this backend makes the pool's pods."""
        if not self.pool_pod_current(pod):
            return False
        given = _proxy_address(pod.metadata)
        if given is not None and self._proxy is not None:
            given = dataclasses.replace(given, intercepting=self._proxy.intercepting)
        return self.confines_as_made(pod, spec, given)

    def warm_pool_pods(self) -> WarmPoolPods | None:
        """The warm pool calls on this backend (only with the operator's views: a pool is
        counted and claimed from them)."""
        if self._pods is None or self._network_policies is None:
            return None
        if self._warm is None:
            self._warm = WarmPoolPods(self._api, self._pods, self._network_policies)
        return self._warm

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

    async def ensure(self, request: EnsureRequest) -> ServedBy:
        from kubernetes_asyncio.client.exceptions import ApiException

        ns = request.sandbox.namespace
        address: ProxyAddress | None = None
        if request.spec.egress is Egress.ALLOWLIST and self._proxy is not None:
            # The namespace's proxy first: the pod is given its Service's address.
            address = await self._ensure_proxy(ns, request.sandbox)
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
                held = self._pods.upsert(created_pod)
                return ServedBy(POD, held.metadata.name or name, ns)
            created = await self._core.create_namespaced_pod(ns, manifest)
            return ServedBy(POD, created.metadata.name, ns)
        except ApiException as exc:
            if exc.status != 409:
                raise StartupError(
                    ConditionReason.STARTUP_FAILED,
                    f"pod was refused by the API server (HTTP {exc.status}): "
                    f"{api_message(exc)[:500]}",
                ) from None
        existing = await self._read_pod(ns, name)
        if existing is None and self._pods is not None:
            # Not in the view yet (created by another replica a moment ago): ask once.
            with contextlib.suppress(ApiException):
                existing = PodView(self._sanitize(await self._core.read_namespaced_pod(name, ns)))
        if existing is None:  # deleted between our create and read: next pass creates it
            return ServedBy(POD, name, ns)
        owners = existing.metadata.owner_references
        if request.sandbox.uid and request.sandbox.uid not in [o.uid for o in owners]:
            raise StartupError(
                ConditionReason.KEY_UNCLEAN, foreign_pod_message(name, owners, request.sandbox)
            )
        if not self.confines_as_made(existing, request.spec, address):
            # An owner reference is only a claim: whoever made this pod, it is not the one this
            # backend makes, so it is never adopted (and never reported as this sandbox).
            field = None
            with contextlib.suppress(ApiException):
                full = PodView(await call_json(self._core.read_namespaced_pod, name, ns))
                field = confinement_difference(
                    PodSpecView(full.spec), PodSpecView(manifest["spec"])
                )
            raise StartupError(
                ConditionReason.KEY_UNCLEAN,
                f"pod {name} exists and names this Sandbox as its owner, but it is not the pod "
                f"this backend makes (it differs in {field or 'what confines it'}); it is never "
                "adopted: delete it",
            )
        return ServedBy(POD, name, ns)

    def _claimed_pod(self, sandbox: SandboxRef) -> PodView | None:
        """A pod claimed from a warm pool for the sandbox (another name than its own): found in
        the views by the sandbox label and its owner, even before status.servedBy records it."""
        if self._pods is None or not sandbox.uid:
            return None
        value = lbl.sandbox_label_value(sandbox.name)
        for pod in self._pods.select(sandbox.namespace, lbl.SANDBOX_LABEL, value):
            meta = pod.metadata
            if lbl.POOL_LABEL not in meta.labels:
                continue
            if any(o.uid == sandbox.uid for o in meta.owner_references):
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
            and recorded.kind == POD
            and recorded.name != naming.pod_name(sandbox.name)
        ):
            pod = await self._read_pod(recorded.namespace or sandbox.namespace, recorded.name)
        if pod is None:
            pod = self._claimed_pod(sandbox)
        if pod is not None and sandbox.uid:
            owners = [o.uid for o in pod.metadata.owner_references]
            if sandbox.uid not in owners:
                # Someone else's pod under our name; not ours to report as our sandbox.
                return Observation(
                    ObservedPhase.ABSENT, None, "Foreign", "pod belongs to another Sandbox"
                )
        observation = classify_pod(pod)
        if pod is not None:
            observation = replace(observation, served_from=pod_origin(pod))
        if (
            pod is not None
            and observation.phase is ObservedPhase.STARTING
            and self._failures is not None
        ):
            # The operator watches the kubelet's FailedCreatePodSandBox events (no read here; a
            # new one wakes the Sandbox).
            uid = pod.metadata.uid
            handler = self._failures.missing_handler(uid)
            if handler is not None:
                observation = self._handler_missing(pod, handler, observation)
        elif pod is not None and observation.phase is ObservedPhase.STARTING:
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

    async def _check_handler(self, pod: PodView, observation: Observation) -> Observation:
        """A pod stuck before its containers exist: does the node lack the runtime handler?
        (Read from the pod's Events: for a driver used without the operator's watch.)"""
        events = await self._sandbox_events(pod)
        if events is None:
            return observation
        handler = missing_handler(events)
        if handler is None:
            return observation
        return self._handler_missing(pod, handler, observation)

    def _handler_missing(self, pod: PodView, handler: str, observation: Observation) -> Observation:
        rc = self._config.runtime_class_name
        node = pod.node_name
        return Observation(
            ObservedPhase.STARTUP_FAILED,
            observation.served_by,
            RUNTIME_HANDLER_MISSING,
            f"node {node} cannot run RuntimeClass {rc!r}: its container runtime has no handler "
            f"{handler!r} configured",
            observation.created_at,
        )

    async def _check_proxy(
        self, sandbox: SandboxRef, pod: PodView, observation: Observation
    ) -> Observation:
        """A live pod given a managed proxy's address: is the proxy still there (one GET), and
        has it admitted the sandbox? A ready pod the proxy does not serve yet would meet
        connection refused or 403 UnknownSandbox on its first request, so it is reported
        ``pending`` until the proxy has written ``status.egress.admitted``."""
        if observation.phase not in (ObservedPhase.READY, ObservedPhase.STARTING):
            return observation
        assert self._proxy is not None
        given = _proxy_address(pod.metadata)
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
                        await self._delete_and_wait(POD, obj.namespace, obj.name, graceful=True)
                pod = naming.pod_name(sandbox.name)
                await self._delete_and_wait(POD, sandbox.namespace, pod, graceful=True)
                return []
            pods = [o for o in self._seen_children(sandbox) if o.kind == POD]
            for obj in pods:
                if not obj.deleting:
                    await self._delete(obj.kind, obj.namespace, obj.name, graceful=True)
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

    @property
    def follows_egress_edits(self) -> bool:
        """Under its managed proxy only: that proxy enforces what the Sandbox's status admits
        (``admittedEgressAllow``) and follows it by a watch; an external proxy is someone
        else's, and nothing says it reads the status."""
        return self._proxy is not None

    # ---- reset (spec.resets): the pod goes at once, a never-used one takes its place -----------

    @property
    def resets(self) -> bool:
        """Only under the operator (its views say which pods serve the sandbox, and a pool's
        idle pods are in them to claim)."""
        return self._pods is not None

    async def retire(self, sandbox: SandboxRef) -> list[BackendObject]:
        """Delete the pod(s) serving the sandbox as a disposal deletes them, and nothing else:
        its NetworkPolicy and identity stay for the pod that replaces it. As a disposal: with
        the backend's ``pod.disposalGracePeriodSeconds``, so by default a pod stays (its egress
        confined by the NetworkPolicy that selects it) until the node has stopped it, and with
        ``0`` it is gone with the delete's answer (docs/disposal.md).

        Returns the pods in the replacement's way: still there under the sandbox's own pod name,
        which a new pod would take, and which ``observe`` reads first (the deletion event of
        each brings the operator back). A pool pod that served it stops in the background: the
        replacement shares nothing with it, the egress proxy answers only the pod the status
        names, and the Sandbox's disposal still waits for it (it keeps the sandbox's label).

        Raises :class:`TransientError` when the API server refuses or cannot be reached."""
        if self._pods is None:
            raise TransientError("resetting needs the operator's views of pods")
        own = naming.pod_name(sandbox.name)
        try:
            still = []
            for obj in [o for o in self._seen_children(sandbox) if o.kind == POD]:
                if obj.deleting or await self._delete(obj.kind, obj.namespace, obj.name):
                    still.append(obj)
            return [o for o in still if o.name == own]
        except DisposalError as exc:
            raise TransientError(f"resetting: {exc.failure.detail}") from None

    async def close(self) -> None:
        task = self._proxy_task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._proxy_task = None


def _proxy_address(meta: MetaView) -> ProxyAddress | None:
    """The managed egress proxy's address a pod was given (its annotation), if any."""
    return ProxyAddress.parse(str(meta.annotations.get(PROXY_ADDRESS_ANNOTATION, "")))


def foreign_pod_message(pod: str, owners: Sequence[OwnerRef], sandbox: SandboxRef) -> str:
    """Why the pod at a Sandbox's pod name is not its own, as it is: a previous Sandbox of the
    same name not yet disposed (it clears by itself), another live Sandbox whose pod name this
    Sandbox's name is (it never clears: rename), or something else's pod."""
    sandboxes = [o for o in owners if o.kind == SANDBOX_KIND]
    if any(o.name == sandbox.name for o in sandboxes):
        return (
            f"pod {pod} exists but belongs to a previous Sandbox named {sandbox.name} that was "
            "not disposed yet; this Sandbox is served once it is gone"
        )
    if sandboxes:
        other = sandboxes[0].name
        return (
            f"pod {pod} serves Sandbox {other}: this Sandbox's name is that Sandbox's pod name, so "
            f"it cannot be served while {other} lives; give this Sandbox another name"
        )
    owner = ", ".join(f"{o.kind or None}/{o.name or None}" for o in owners) or "nothing"
    return (
        f"pod {pod} exists and is not this Sandbox's (owned by {owner}); it is never adopted: "
        "delete it, or give this Sandbox another name"
    )
