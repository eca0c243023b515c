"""The kubelet's ``FailedCreatePodSandBox`` events, from a watch instead of a read per pod.

A pod whose node has no handler for its RuntimeClass stays Pending for ever: nothing in the pod's
own status says why, only the kubelet's Events do. Listing a starting pod's Events after 3 s, and
every 5 s while it waits, cost the API server about 3.5 lists per Sandbox in a burst on a busy
node (issue 26). Here one watch per served namespace (or one for all), with the server-side field
selector ``reason=FailedCreatePodSandBox``, delivers only those Events: nothing at all while every
pod starts. What they say is kept by pod uid; the Sandbox owning the pod is woken at once.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from sandbox_operator import kubeobj
from sandbox_operator.backends.runtimeclass.observe import missing_handler
from sandbox_operator.kubecalls import list_then_watch
from sandbox_operator.views import EventView

log = logging.getLogger(__name__)

#: The only Events the watch asks for.
FIELD_SELECTOR = "reason=FailedCreatePodSandBox"

#: The most pods remembered: a node without the handler fails every pod sent to it, and each is
#: reported once; the oldest are let go first (their Sandboxes have long ended in StartupFailed).
REMEMBERED = 10_000


class PodSandboxFailures:
    """The runtime handler a pod's node lacks, by pod uid, as the kubelet's Events said."""

    def __init__(self, limit: int = REMEMBERED) -> None:
        self._limit = limit
        self._by_uid: OrderedDict[str, str] = OrderedDict()

    def missing_handler(self, pod_uid: str) -> str | None:
        return self._by_uid.get(pod_uid)

    def record(self, event: EventView) -> tuple[str, str] | None:
        """Keep what one Event says; the (namespace, pod name) it concerns when it says a handler
        is missing and that was not known yet (its Sandbox is then woken)."""
        handler = missing_handler([event])
        involved = event.involved_object
        uid = involved.uid
        if handler is None or not uid or involved.kind != kubeobj.POD_KIND:
            return None
        if self._by_uid.get(uid) == handler:
            return None
        self._by_uid[uid] = handler
        self._by_uid.move_to_end(uid)
        while len(self._by_uid) > self._limit:
            self._by_uid.popitem(last=False)
        return involved.namespace or event.metadata.namespace, involved.name


async def watch_pod_sandbox_failures(
    api: Any,
    namespace: str | None,
    failures: PodSandboxFailures,
    notify: Callable[[str, str], None],
    *,
    retry_seconds: float = 2.0,
) -> None:
    """List, then watch, the namespace's (None: every namespace's) ``FailedCreatePodSandBox``
    Events for ever, calling ``notify(namespace, pod)`` for each pod newly known to lack a
    handler. A watch the server ends is opened again from the last version seen; an expired
    version (410) or an error lists again (after ``retry_seconds``). Never raises but
    ``CancelledError``."""
    from kubernetes_asyncio import client

    core = client.CoreV1Api(api)
    list_call: Any = core.list_event_for_all_namespaces
    where: tuple[str, ...] = ()
    if namespace is not None:
        list_call, where = core.list_namespaced_event, (namespace,)

    def take(event: EventView) -> None:
        concerned = failures.record(event)
        if concerned is not None and concerned[1]:
            notify(*concerned)

    def listed(items: list[EventView]) -> None:
        for item in items:
            take(item)

    def changed(kind: str, event: EventView) -> None:
        if kind != "DELETED":
            take(event)

    await list_then_watch(
        list_call,
        *where,
        view=EventView,
        on_list=listed,
        on_change=changed,
        what=f"FailedCreatePodSandBox events{f' in {namespace}' if namespace else ''}",
        field_selector=FIELD_SELECTOR,
        retry_seconds=retry_seconds,
    )
