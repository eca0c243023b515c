"""Upkeep of the namespaces' egress NetworkPolicies (one per runtime-class backend and egress
mode, made by the backend before the first pod it confines: ``ensure_egress_policy``).

They have no owner, so nothing else brings one back: a policy deleted while live sandbox pods
of its backend and mode remain is made again at its watch event (until then those pods, under
no policy, are unconfined), and one that differs from what its backend makes now (an edit, a
proxy changed in the configuration) is replaced at its event, including the events of the
operator's start."""

from __future__ import annotations

import logging

from sandbox_operator import labels as lbl
from sandbox_operator.backends.base import StartupError
from sandbox_operator.backends.runtimeclass import RuntimeClassDriver, egress_policy_key
from sandbox_operator.reconcile.runtime import Runtime
from sandbox_operator.views import ObjectView

log = logging.getLogger(__name__)


def pods_under(rt: Runtime, namespace: str, backend: str, egress: str) -> list[str]:
    """The live (not deleting) sandbox pods a namespace's egress policy of ``backend`` and
    ``egress`` confines, by name (from the views)."""
    metas = (p.metadata for p in rt.views.pods.select(namespace, lbl.EGRESS_LABEL, egress))
    return [
        meta.name
        for meta in metas
        if meta.labels.get(lbl.BACKEND_LABEL) == backend and not meta.deleting
    ]


async def keep_egress_policy(rt: Runtime, type_: str, policy: ObjectView) -> None:
    """Bring a namespace's egress policy back to what its backend makes, after its watch event
    (``type_``: the watch's ADDED, MODIFIED or DELETED; ``policy``: the event's object). Other
    NetworkPolicies are left alone."""
    key = egress_policy_key(policy)
    if key is None:
        return
    backend, egress = key
    driver = rt.drivers.get(backend)
    if not isinstance(driver, RuntimeClassDriver):
        return  # a backend not configured (any more): not ours to keep
    meta = policy.metadata
    namespace, name = meta.namespace, meta.name
    if type_ == "DELETED":
        pods = pods_under(rt, namespace, backend, egress.value)
        if not pods:
            return
        log.warning(
            "NetworkPolicy %s/%s was deleted while it confines %d sandbox pod(s): made again",
            namespace,
            name,
            len(pods),
        )
    elif meta.deleting or driver.egress_policy_current(policy):
        return
    try:
        await driver.ensure_egress_policy(namespace, egress)
    except StartupError as exc:  # refused (a namespace being deleted): its event brings it back
        log.warning("NetworkPolicy %s/%s could not be made again: %s", namespace, name, exc)
