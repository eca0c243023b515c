"""Publishing what the operator serves: the ConfigMap of :mod:`sandbox_operator.contract.published`.

A maf-sandbox backend reads its declarations synchronously, before any sandbox exists, so a client
must be able to read what this operator really serves without asking it. At startup the operator
writes :data:`~sandbox_operator.contract.published.PUBLISHED_CONFIGMAP` into every namespace it
serves, where a client looks without being told (its own namespace): the named ones
(``--namespace a``) at startup; serving all namespaces or a pattern (``--all-namespaces``,
``--namespace '!t-*'``), each namespace that exists and matches, and each new one as it appears,
from a watch on the namespaces (:func:`publish_into_served`). The document is derived from the
validated configuration only, so it never says more than admission enforces.

Only differences are written: the ConfigMap is read first and applied (server-side apply, which
RBAC can restrict to the one name, unlike a create) only when its document or labels differ, so
a restart with the same configuration changes no resourceVersion: serving named namespaces it
costs one read each; serving all of them, one list of the ConfigMaps of that name in every
namespace (a field selector), then only the namespaces that lack the current document are
written. Publishing never holds up serving Sandboxes and never stops the operator: it
runs in the background, and a namespace that could not be written is logged and retried with
backoff until it is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

from sandbox_operator import labels as lbl
from sandbox_operator.backends.manifests import ConfigMap
from sandbox_operator.config import OperatorConfig
from sandbox_operator.contract.published import (
    PUBLISHED_CONFIGMAP,
    PUBLISHED_KEY,
    PublishedBackend,
    PublishedBackends,
)
from sandbox_operator.kubecalls import call_json, list_then_watch, read_or_none
from sandbox_operator.reconcile.namespaces import ServedNamespaces
from sandbox_operator.views import ConfigMapView, ListView, NamespaceView
from sandbox_operator.views.fields import mapping

log = logging.getLogger(__name__)

#: The field manager of the operator's applies of the published ConfigMap.
FIELD_MANAGER: Final = "sandbox-operator-published"
_APPLY_CONTENT_TYPE: Final = "application/apply-patch+yaml"
#: Backoff between attempts at namespaces not yet published: doubling, capped.
RETRY_FIRST_SECONDS: Final = 1.0
RETRY_MAX_SECONDS: Final = 60.0


def published_backends(config: OperatorConfig) -> PublishedBackends:
    """The document for a validated configuration: its host policy and, in registration order,
    each backend's name, type, configured isolation and declarations."""
    return PublishedBackends(
        host_policy=config.host_policy,
        backends=tuple(
            PublishedBackend(
                name=b.name,
                type=b.type,
                isolation=b.isolation,
                declarations=b.declarations,
                resets=b.resets,
            )
            for b in config.backends
        ),
    )


def document_text(document: PublishedBackends) -> str:
    """The ConfigMap value: the document's JSON in the contract's camelCase spelling."""
    return document.model_dump_json(by_alias=True)


def config_map(namespace: str, text: str) -> ConfigMap:
    """The applied ConfigMap (every field the operator owns in it)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": PUBLISHED_CONFIGMAP,
            "namespace": namespace,
            "labels": {lbl.MANAGED_BY_LABEL: lbl.MANAGED_BY_VALUE},
        },
        "data": {PUBLISHED_KEY: text},
    }


def is_current(current: ConfigMapView | None, text: str) -> bool:
    """Whether the ConfigMap as read already says ``text`` and carries the operator's label."""
    if current is None:
        return False
    labels = current.metadata.labels
    return (
        labels.get(lbl.MANAGED_BY_LABEL) == lbl.MANAGED_BY_VALUE
        and current.data.get(PUBLISHED_KEY) == text
    )


class Publisher:
    """Reads and applies the published ConfigMap in one namespace at a time."""

    def __init__(self, api: Any) -> None:
        from kubernetes_asyncio import client

        self._api = api
        self._core: Any = client.CoreV1Api(api)

    async def current_everywhere(self, text: str) -> set[str]:
        """The namespaces whose ConfigMap already says ``text``: one list across namespaces,
        by name (a field selector, which RBAC authorizes by resourceNames)."""
        body = ListView(
            await call_json(
                self._core.list_config_map_for_all_namespaces,
                field_selector=f"metadata.name={PUBLISHED_CONFIGMAP}",
            )
        )
        maps = (ConfigMapView(mapping(item)) for item in body.objects)
        return {m.metadata.namespace for m in maps if is_current(m, text)}

    async def publish(self, namespace: str, text: str) -> bool:
        """Make the namespace's ConfigMap say ``text``; True when it had to be written."""
        found = await read_or_none(
            self._api, self._core.read_namespaced_config_map, PUBLISHED_CONFIGMAP, namespace
        )
        current = None if found is None else ConfigMapView(found)
        if is_current(current, text):
            return False
        await self._core.patch_namespaced_config_map(
            PUBLISHED_CONFIGMAP,
            namespace,
            config_map(namespace, text),
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type=_APPLY_CONTENT_TYPE,
        )
        return True


class Pending:
    """The namespaces still to publish into, worked off by one task: each is applied until it
    succeeds, with doubling backoff (capped) after a round in which any failed; a namespace
    forgotten meanwhile (deleted) is dropped. Failures are logged with the namespace and the
    error's type and status, never its message (the API server's may echo the request)."""

    def __init__(
        self,
        publish: Callable[[str, str], Awaitable[bool]],
        text: str,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._publish = publish
        self._text = text
        self._sleep = sleep
        self._wanted: dict[str, None] = {}
        self._woken = asyncio.Event()
        #: The namespaces known to hold the current document.
        self.current: set[str] = set()

    def want(self, namespace: str) -> None:
        """Publish into ``namespace`` unless it is known current."""
        if namespace not in self.current and namespace not in self._wanted:
            self._wanted[namespace] = None
            self._woken.set()

    def forget(self, namespace: str) -> None:
        """The namespace is gone (or no longer served): nothing more to do there."""
        self._wanted.pop(namespace, None)
        self.current.discard(namespace)

    def known(self) -> set[str]:
        return self.current | set(self._wanted)

    async def work(self, *, until_empty: bool) -> None:
        """Publish what is wanted; return once nothing is (``until_empty``) or wait for more."""
        delay = RETRY_FIRST_SECONDS
        while True:
            if not self._wanted:
                if until_empty:
                    return
                self._woken.clear()
                await self._woken.wait()
                continue
            failed = 0
            for namespace in list(self._wanted):
                if namespace not in self._wanted:
                    continue
                try:
                    wrote = await self._publish(namespace, self._text)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    failed += 1
                    status = getattr(exc, "status", None)
                    log.error(
                        "publishing ConfigMap %s in namespace %s failed (%s%s); retrying in %.0fs",
                        PUBLISHED_CONFIGMAP,
                        namespace,
                        type(exc).__name__,
                        f", HTTP {status}" if status else "",
                        delay,
                    )
                    continue
                if namespace in self._wanted:  # not forgotten while it was written
                    del self._wanted[namespace]
                    self.current.add(namespace)
                log.info(
                    "ConfigMap %s in namespace %s: %s",
                    PUBLISHED_CONFIGMAP,
                    namespace,
                    "published" if wrote else "already current",
                )
            if failed:
                await self._sleep(delay)
                delay = min(delay * 2, RETRY_MAX_SECONDS)
            else:
                delay = RETRY_FIRST_SECONDS


async def publish_until_done(
    publish: Callable[[str, str], Awaitable[bool]],
    namespaces: Iterable[str],
    text: str,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Publish into every one of ``namespaces``, retrying the ones that failed with doubling
    backoff until all are done (:class:`Pending`)."""
    pending = Pending(publish, text, sleep=sleep)
    for namespace in namespaces:
        pending.want(namespace)
    await pending.work(until_empty=True)


def _active_name(namespace: NamespaceView) -> str | None:
    """A namespace's name, None while it terminates (nothing can be created in it)."""
    if namespace.terminating:
        return None
    return namespace.metadata.name or None


def follow_namespaces(
    pending: Pending, served: ServedNamespaces
) -> tuple[Callable[[list[NamespaceView]], None], Callable[[str, NamespaceView], None]]:
    """The namespace watch's two callbacks: a (re)list wants every served live namespace and
    forgets the rest; a change wants a new served namespace and forgets a deleted one."""

    def listed(items: list[NamespaceView]) -> None:
        live = {n for item in items if (n := _active_name(item)) and served.serves(n)}
        for gone in pending.known() - live:
            pending.forget(gone)
        for namespace in sorted(live):
            pending.want(namespace)
        log.info(
            "ConfigMap %s: %d namespaces served, %d to publish into",
            PUBLISHED_CONFIGMAP,
            len(live),
            len(live - pending.current),
        )

    def changed(kind: str, item: NamespaceView) -> None:
        name = item.metadata.name
        if not name or not served.serves(name):
            return
        if kind == "DELETED" or _active_name(item) is None:
            pending.forget(name)
        else:
            pending.want(name)

    return listed, changed


async def publish_into_served(api: Any, served: ServedNamespaces, text: str) -> None:
    """Publish into every namespace ``served`` covers, for as long as the operator runs: the
    named ones once; all or a pattern's, from a watch on the namespaces (one list of the
    existing ConfigMaps first, so a restart writes only where the document is missing or
    stale)."""
    from kubernetes_asyncio import client

    publisher = Publisher(api)
    pending = Pending(publisher.publish, text)
    if served.exact is not None:
        for namespace in served.exact:
            pending.want(namespace)
        await pending.work(until_empty=True)
        return
    try:
        pending.current |= await publisher.current_everywhere(text)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        # Only a saving: each namespace is then read before it is written.
        log.warning(
            "listing ConfigMaps %s failed (%s); reading each namespace's instead",
            PUBLISHED_CONFIGMAP,
            getattr(exc, "status", None) or type(exc).__name__,
        )
    listed, changed = follow_namespaces(pending, served)
    core = client.CoreV1Api(api)
    await asyncio.gather(
        pending.work(until_empty=False),
        list_then_watch(
            core.list_namespace,
            view=NamespaceView,
            on_list=listed,
            on_change=changed,
            what="namespaces",
        ),
    )
