"""Warm pool pods on a runtime-class backend: made before anyone asks, claimed by one Sandbox.

A pool pod is a sandbox pod like any other (same hardened manifest, ``pod_manifest``) made for a
template rather than a Sandbox. While idle it is owned by its SandboxWarmPool, carries the pool
and shape labels and no key, and the pool's NetworkPolicy denies it all traffic. A claim is one
metadata patch with the pod's ``resourceVersion`` as precondition: the Sandbox's key labels,
sandbox label and annotations go on, and the Sandbox replaces the pool as owner. Two claimers of
one pod cannot both win (the loser gets 409); a pod never goes back to a pool.

The pool's deny-all NetworkPolicy selects every pod with the pool label, claimed ones too: policies
add up, so a claimed pod gets exactly what its Sandbox's own policy allows, and there is no moment
at which a pool pod is selected by no policy at all.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sandbox_operator import kubeobj
from sandbox_operator import labels as lbl
from sandbox_operator.backends.base import (
    EnsureRequest,
    PoolRef,
    ServedBy,
    TransientError,
    WatchedObjects,
)
from sandbox_operator.backends.egress_proxy import ProxyAddress
from sandbox_operator.backends.manifests import (
    MetadataPatch,
    NetworkPolicy,
    ObjectMeta,
    OwnerReference,
    Pod,
)
from sandbox_operator.backends.owners import owner_reference
from sandbox_operator.contract import (
    SANDBOX_WARM_POOL_KIND,
    SERVED_FROM_COLD,
    SandboxSpec,
)
from sandbox_operator.kubecalls import call_json
from sandbox_operator.naming import SANDBOX_OBJECT_PREFIX, slug
from sandbox_operator.views import ObjectView, PodView

if TYPE_CHECKING:  # the runtime-class package imports this module: no import cycle at run time
    from sandbox_operator.backends.runtimeclass.config import RuntimeClassBackendConfig

#: Pool pods are named ``sbx-wp-<pool>-<random>`` (the API server picks the random part): the
#: ``sbx-`` prefix keeps them sandbox pods to the agent exec policy once claimed.
POOL_POD_PREFIX = f"{SANDBOX_OBJECT_PREFIX}wp-"


def pool_owner(pool: PoolRef) -> OwnerReference:
    """The pool as the controlling owner of its idle pods and its NetworkPolicy: deleting the
    pool lets the garbage collector delete them."""
    return owner_reference(pool)


def pool_labels(pool: str, backend: str) -> dict[str, str]:
    return {
        lbl.MANAGED_BY_LABEL: lbl.MANAGED_BY_VALUE,
        lbl.POOL_LABEL: lbl.sandbox_label_value(pool),
        lbl.BACKEND_LABEL: backend,
    }


def pool_network_policy_name(pool: str) -> str:
    return f"{POOL_POD_PREFIX}{slug(pool, 50)}"


def build_pool_network_policy(pool: PoolRef, backend: str) -> NetworkPolicy:
    """Deny all ingress and egress to every pod of the pool (idle or claimed)."""
    labels = pool_labels(pool.name, backend)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": kubeobj.NETWORK_POLICY_KIND,
        "metadata": {
            "name": pool_network_policy_name(pool.name),
            "namespace": pool.namespace,
            "labels": labels,
            "annotations": {lbl.POOL_NAME_ANNOTATION: pool.name},
            "ownerReferences": [pool_owner(pool)],
        },
        "spec": {
            "podSelector": {"matchLabels": {lbl.POOL_LABEL: labels[lbl.POOL_LABEL]}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [],
        },
    }


def build_pool_pod(
    pool: PoolRef,
    spec: SandboxSpec,
    backend: RuntimeClassBackendConfig,
    shape: str,
    managed_proxy: ProxyAddress | None = None,
) -> Pod:
    """An idle pod of the pool: the sandbox pod for ``spec`` (resolved under the host policy),
    owned by the pool, named by the API server. ``managed_proxy``: the namespace's egress proxy
    address, for an allowlist template on a backend whose proxy the operator runs."""
    from sandbox_operator.backends.runtimeclass.pods import pod_manifest

    labels = pool_labels(pool.name, backend.name)
    labels[lbl.POOL_SHAPE_LABEL] = shape
    metadata: ObjectMeta = {
        "generateName": f"{POOL_POD_PREFIX}{slug(pool.name, 40)}-",
        "namespace": pool.namespace,
        "labels": labels,
        "annotations": {lbl.POOL_NAME_ANNOTATION: pool.name},
        "ownerReferences": [pool_owner(pool)],
    }
    return pod_manifest(spec, backend, metadata, managed_proxy)


def pod_origin(pod: ObjectView) -> str:
    """``status.servedFrom`` for a Sandbox served by ``pod``: the pool that made it, or cold.
    Read off the pod itself, so it is right whoever (whichever replica, before or after a
    restart) reports it."""
    name = pool_name_of(pod)
    return f"{SANDBOX_WARM_POOL_KIND}/{name}" if name else SERVED_FROM_COLD


def pool_name_of(obj: ObjectView) -> str | None:
    """The warm pool a pod or NetworkPolicy was made by, idle or claimed: its pool-name
    annotation (the pool label, which holds a long name shortened, for an object without one)."""
    meta = obj.metadata
    label = meta.labels.get(lbl.POOL_LABEL)
    if not label:
        return None
    return str(meta.annotations.get(lbl.POOL_NAME_ANNOTATION) or label)


def claim_patch(pod: PodView, request: EnsureRequest, now: datetime | None = None) -> MetadataPatch:
    """The merge patch that gives an idle pool pod to one Sandbox, conditional on the pod being
    unchanged since it was seen (its resourceVersion)."""
    meta = pod.metadata
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "metadata": {
            "resourceVersion": meta.resource_version,
            # The egress label puts the pod under its backend's policy for the spec's egress
            # mode (the pool's deny-all holds it until then, and still applies: policies add).
            "labels": {**request.labels, lbl.EGRESS_LABEL: request.spec.egress.value},
            "annotations": {**request.annotations, lbl.CLAIMED_AT_ANNOTATION: stamp},
            # Replaces the pool: the Sandbox alone owns the pod from now on.
            "ownerReferences": [owner_reference(request.sandbox)],
        }
    }


def is_idle(pod: PodView, pool_uid: str | None = None) -> bool:
    """Whether a pool pod is still unclaimed (owned by its pool, no sandbox label) and not being
    deleted. ``pool_uid``: owned by that very pool."""
    meta = pod.metadata
    if meta.deleting or lbl.SANDBOX_LABEL in meta.labels:
        return False
    return any(
        o.kind == SANDBOX_WARM_POOL_KIND and (pool_uid is None or o.uid == pool_uid)
        for o in meta.owner_references
    )


#: Kubernetes's PodReady condition type (the pod's, not a Sandbox's ``ConditionType.READY``).
POD_READY = "Ready"


def is_ready(pod: PodView) -> bool:
    status = pod.status
    if status.phase != "Running":
        return False
    return any(c.type == POD_READY and c.is_true for c in status.conditions)


class WarmPoolPods:
    """The API calls of warm pools on one runtime-class backend (the driver's API objects and
    views: every answer goes into the views at once)."""

    def __init__(
        self,
        api: Any,
        pods: WatchedObjects[PodView],
        network_policies: WatchedObjects[ObjectView],
    ) -> None:
        from kubernetes_asyncio import client

        self._core: Any = client.CoreV1Api(api)
        self._net: Any = client.NetworkingV1Api(api)
        self._pods = pods
        self._network_policies = network_policies

    async def ensure_network_policy(self, pool: PoolRef, backend: str) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        np = build_pool_network_policy(pool, backend)
        if self._network_policies.get(pool.namespace, np["metadata"]["name"]) is not None:
            return
        try:
            created = await call_json(
                self._net.create_namespaced_network_policy, pool.namespace, np
            )
        except ApiException as exc:
            if exc.status == 409:
                return
            raise TransientError(
                f"creating the pool's NetworkPolicy failed (HTTP {exc.status})"
            ) from None
        self._network_policies.upsert(created)

    async def create(self, manifest: Pod) -> PodView:
        """Create a pool pod; the API server's answer goes into the views at once."""
        ns = manifest["metadata"]["namespace"]
        return self._pods.upsert(await call_json(self._core.create_namespaced_pod, ns, manifest))

    async def delete(self, pod: PodView) -> bool:
        """Delete an idle pod only if it is still as seen (not claimed meanwhile). False: it
        changed (or went) first."""
        from kubernetes_asyncio.client.exceptions import ApiException

        meta = pod.metadata
        body = {
            "preconditions": {
                "uid": meta.uid or None,
                "resourceVersion": meta.resource_version,
            }
        }
        try:
            await call_json(self._core.delete_namespaced_pod, meta.name, meta.namespace, body=body)
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def claim(self, pod: PodView, request: EnsureRequest) -> ServedBy | None:
        """Give ``pod`` to the Sandbox of ``request``; None when another claim (or a deletion)
        changed the pod first."""
        from kubernetes_asyncio.client.exceptions import ApiException

        meta = pod.metadata
        try:
            claimed = await call_json(
                self._core.patch_namespaced_pod,
                meta.name,
                meta.namespace,
                claim_patch(pod, request),
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status in (404, 409, 422):
                return None
            raise
        cmeta = self._pods.upsert(claimed).metadata
        return ServedBy(kubeobj.POD_KIND, cmeta.name, cmeta.namespace)
