"""Reading what the operator publishes about its backends, and choosing the one a maf backend
stands for (:func:`read_published`, :func:`select_backend`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from sandbox_operator.client import SandboxClient
from sandbox_operator.contract import Selection
from sandbox_operator.contract.published import (
    PUBLISHED_CONFIGMAP,
    PUBLISHED_KEY,
    PublishedBackend,
    PublishedBackends,
)


@dataclass(eq=False)
class PublishedBackendsMissing(LookupError):
    """The operator's published backends could not be read: ``what`` says which part is missing
    or invalid (``configmap``, ``key``, ``document``), in ConfigMap ``configmap`` of
    ``namespace`` under ``key``. Is an operator serving this namespace? (Every operator
    publishes the document in each namespace it serves.)"""

    what: str
    namespace: str
    configmap: str = PUBLISHED_CONFIGMAP
    key: str = PUBLISHED_KEY
    detail: str = ""

    def __post_init__(self) -> None:
        text = (
            f"published backends: {self.what} missing or invalid "
            f"(ConfigMap {self.namespace}/{self.configmap}, key {self.key})"
        )
        super().__init__(f"{text}: {self.detail}" if self.detail else text)


@dataclass(eq=False)
class BackendNotSelected(LookupError):
    """Which operator backend to stand for is not settled: ``backend=`` names none of the
    published ``available`` ones, names one the fixed selection never serves, or (perSpec with
    several backends) none was named. Pass ``backend=``."""

    requested: str | None
    available: tuple[str, ...]
    selection: str

    def __post_init__(self) -> None:
        asked = f"backend {self.requested!r}" if self.requested else "no backend named"
        super().__init__(
            f"{asked} under {self.selection} selection; pass backend= one of "
            f"{', '.join(self.available)}"
        )


#: How long :func:`read_published` waits for the document to appear: an operator serving all
#: namespaces publishes into a new one as its watch sees it, a fraction of a second after the
#: namespace is created.
PUBLISHED_WAIT_SECONDS: Final = 10.0


async def read_published(
    client: SandboxClient,
    *,
    namespace: str | None = None,
    wait: float = PUBLISHED_WAIT_SECONDS,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> PublishedBackends:
    """The document the operator published in ``namespace`` (default: the client's). Every
    operator publishes it in each namespace it serves, whether it serves named ones or all of
    them, so the client's own namespace is where to look. A ConfigMap not there (404) is read
    again, with a doubling pause, for up to ``wait`` seconds: a namespace created just now gets
    it moments later. Any other refusal (403: RBAC) raises at once."""
    where = namespace or client.namespace
    core = k8s.CoreV1Api(client.api)
    deadline = time.monotonic() + wait
    pause = 0.1
    while True:
        try:
            cm = await core.read_namespaced_config_map(PUBLISHED_CONFIGMAP, where)
        except ApiException as exc:
            left = deadline - time.monotonic()
            if exc.status != 404 or left <= 0:
                raise PublishedBackendsMissing(
                    "configmap", where, detail=f"HTTP {exc.status}"
                ) from None
            await sleep(min(pause, left))
            pause = min(pause * 2, 1.0)
            continue
        return parse_published(cm.data, where)


def parse_published(data: Mapping[str, str] | None, namespace: str) -> PublishedBackends:
    """The document in a ConfigMap's ``data`` (:data:`PUBLISHED_KEY`), or the typed error
    naming what is missing or invalid."""
    raw = (data or {}).get(PUBLISHED_KEY)
    if not raw:
        raise PublishedBackendsMissing("key", namespace)
    try:
        return PublishedBackends.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        raise PublishedBackendsMissing("document", namespace, detail=type(exc).__name__) from None


def select_backend(published: PublishedBackends, backend: str | None) -> PublishedBackend:
    """The operator backend a maf backend stands for: the named one; else the fixed selection's
    (pinned, or the first); else, under perSpec with exactly one backend, that one."""
    by_name = {b.name: b for b in published.backends}
    policy = published.host_policy
    fixed = policy.selection == Selection.FIXED
    served = by_name.get(policy.pinned_backend or "") if fixed else None
    if fixed and served is None:
        served = published.backends[0]

    def refuse() -> BackendNotSelected:
        return BackendNotSelected(backend, tuple(by_name), policy.selection.value)

    if backend is not None:
        chosen = by_name.get(backend)
        if chosen is None or (served is not None and chosen is not served):
            raise refuse()
        return chosen
    if served is not None:
        return served
    if len(published.backends) == 1:
        return published.backends[0]
    raise refuse()
