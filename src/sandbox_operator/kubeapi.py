"""The one way this package opens the Kubernetes API (kubernetes_asyncio) and reads its answers.

The operator, the egress proxy and the client each needed a kubeconfig loader, an RFC 3339 parser
for the API's timestamps and the API server's message out of a failed call; they were four
copies that drifted apart. This module is the shared copy. It imports only kubernetes_asyncio
and the standard library, so the client's base install (no kopf, no sync ``kubernetes``) can use
it.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

__all__ = ["api_message", "in_cluster_api_client", "new_api_client", "parse_time"]


async def new_api_client(
    *,
    kubeconfig: str | os.PathLike[str] | None = None,
    context: str | None = None,
    configuration: k8s.Configuration | None = None,
) -> k8s.ApiClient:
    """An ApiClient with a configuration of its own (the library's global default is never
    touched, so two clients in one process cannot change each other's cluster).

    In-cluster credentials when ``KUBERNETES_SERVICE_HOST`` is set and neither ``kubeconfig`` nor
    ``$KUBECONFIG`` (nor a ``context``) is given; otherwise the kubeconfig file (``kubeconfig``,
    else ``$KUBECONFIG``, else ``~/.kube/config``). ``configuration`` is loaded into when given
    (to carry settings such as timeouts); a fresh one is used otherwise.
    """
    cfg = configuration if configuration is not None else k8s.Configuration()
    explicit = kubeconfig is not None or context is not None or bool(os.environ.get("KUBECONFIG"))
    if not explicit and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            return in_cluster_api_client(configuration=cfg)
        except k8s_config.ConfigException:
            pass  # a service host without a service account: try the kubeconfig
    # $KUBECONFIG read now: the library reads it once, at import time.
    config_file = os.fspath(kubeconfig) if kubeconfig is not None else os.environ.get("KUBECONFIG")
    await k8s_config.load_kube_config(
        config_file=config_file or None,
        context=context,
        client_configuration=cfg,
    )
    return k8s.ApiClient(configuration=cfg)


def in_cluster_api_client(*, configuration: k8s.Configuration | None = None) -> k8s.ApiClient:
    """An ApiClient from the pod's service account (raises ``ConfigException`` outside a pod).
    Synchronous: reading the mounted token needs no I/O loop, so a constructor can call it."""
    cfg = configuration if configuration is not None else k8s.Configuration()
    k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    return k8s.ApiClient(configuration=cfg)


def parse_time(value: object) -> datetime | None:
    """An RFC 3339 timestamp from the API (``...Z`` or an offset) as an aware datetime; a naive
    one is taken as UTC. ``None`` for a missing, empty or unparsable value, never an error:
    a timestamp the operator cannot read is one it does not act on."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def api_message(exc: ApiException) -> str:
    """The API server's own words for a refused call: the ``message`` of the Status body, else
    the HTTP reason phrase, else empty. Not truncated; callers bound it where they store it."""
    reason = str(getattr(exc, "reason", None) or "")
    try:
        doc = json.loads(getattr(exc, "body", None) or "{}")
    except (ValueError, TypeError):
        return reason
    if not isinstance(doc, dict):
        return reason
    return str(doc.get("message") or reason)
