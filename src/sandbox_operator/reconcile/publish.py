"""Publishing what the operator serves: the ConfigMap of :mod:`sandbox_operator.contract.published`.

A maf-sandbox backend reads its declarations synchronously, before any sandbox exists, so a client
must be able to read what this operator really serves without asking it. At startup the operator
writes :data:`~sandbox_operator.contract.published.PUBLISHED_CONFIGMAP` into every namespace it
serves (``--namespace``) or, serving all namespaces, into its own (``POD_NAMESPACE``): the
document is derived from the validated configuration only, so it never says more than admission
enforces.

Only differences are written: the ConfigMap is read first and applied (server-side apply, which
RBAC can restrict to the one name, unlike a create) only when its document or labels differ, so
a restart with the same configuration costs one read per namespace and changes no
resourceVersion. Publishing never holds up serving Sandboxes and never stops the operator: it
runs in the background, and a namespace that could not be written is logged and retried with
backoff until it is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from sandbox_operator import labels as lbl
from sandbox_operator.config import OperatorConfig
from sandbox_operator.contract.published import (
    PUBLISHED_CONFIGMAP,
    PUBLISHED_KEY,
    PublishedBackend,
    PublishedBackends,
)
from sandbox_operator.kubecalls import read_or_none

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
                name=b.name, type=b.type, isolation=b.isolation, declarations=b.declarations
            )
            for b in config.backends
        ),
    )


def document_text(document: PublishedBackends) -> str:
    """The ConfigMap value: the document's JSON in the contract's camelCase spelling."""
    return document.model_dump_json(by_alias=True)


def publication_namespaces(
    namespaces: Sequence[str], all_namespaces: bool, own_namespace: str | None
) -> tuple[str, ...]:
    """Where to publish: every served namespace or, serving all of them, the operator's own
    (empty when it is not known: outside a pod, without ``POD_NAMESPACE``)."""
    if all_namespaces:
        return (own_namespace,) if own_namespace else ()
    return tuple(dict.fromkeys(namespaces))


def config_map(namespace: str, text: str) -> dict[str, Any]:
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


def is_current(current: Mapping[str, Any] | None, text: str) -> bool:
    """Whether the ConfigMap as read already says ``text`` and carries the operator's label."""
    if current is None:
        return False
    labels = (current.get("metadata") or {}).get("labels") or {}
    data = current.get("data") or {}
    return (
        labels.get(lbl.MANAGED_BY_LABEL) == lbl.MANAGED_BY_VALUE and data.get(PUBLISHED_KEY) == text
    )


class Publisher:
    """Reads and applies the published ConfigMap in one namespace at a time."""

    def __init__(self, api: Any) -> None:
        from kubernetes_asyncio import client

        self._api = api
        self._core: Any = client.CoreV1Api(api)

    async def publish(self, namespace: str, text: str) -> bool:
        """Make the namespace's ConfigMap say ``text``; True when it had to be written."""
        current = await read_or_none(
            self._api, self._core.read_namespaced_config_map, PUBLISHED_CONFIGMAP, namespace
        )
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


async def publish_until_done(
    publish: Callable[[str, str], Awaitable[bool]],
    namespaces: Iterable[str],
    text: str,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Publish into every namespace, retrying the ones that failed with doubling backoff until
    all are done; each failure is logged with its namespace and the error's type and status (the
    API server's message may echo the request)."""
    pending = list(dict.fromkeys(namespaces))
    delay = RETRY_FIRST_SECONDS
    while pending:
        failed: list[str] = []
        for namespace in pending:
            try:
                wrote = await publish(namespace, text)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failed.append(namespace)
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
            log.info(
                "ConfigMap %s in namespace %s: %s",
                PUBLISHED_CONFIGMAP,
                namespace,
                "published" if wrote else "already current",
            )
        if not failed:
            return
        pending = failed
        await sleep(delay)
        delay = min(delay * 2, RETRY_MAX_SECONDS)
