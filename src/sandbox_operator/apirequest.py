"""A request to the Kubernetes API server read the way the API server reads it: its verb
(``list``/``watch``/``deletecollection`` told apart from ``get``/``delete``) and its resource
(``sandboxes/status``). Pure, for the ``verb`` and ``resource`` labels of
:mod:`sandbox_operator.metrics`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

#: ``resource`` label of requests that name no resource: API discovery (``/api``, ``/apis``,
#: ``/apis/<group>[/<version>]``) and everything else (``/version``, ``/openapi/...``, ...).
DISCOVERY = "discovery"
NONRESOURCE = "nonresource"

_METHOD_VERBS = {
    "GET": "get",
    "HEAD": "get",
    "POST": "create",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}
# Subresources of a namespace itself (/api/v1/namespaces/NAME/status); anything else after a
# namespace's name is a namespaced resource (k8s.io/apiserver's RequestInfoFactory).
_NAMESPACE_SUBRESOURCES = {"status", "finalize"}
_TRUE = {"1", "t", "true"}


def parse_api_request(
    method: str,
    url: str,
    query: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
    *,
    prefix: str = "",
) -> tuple[str, str]:
    """``(verb, resource)`` of a request to the API server, as the API server itself reads it.

    verb: POST create, PUT update, PATCH patch, DELETE delete (deletecollection without a name),
    GET/HEAD get (list without a name, watch with ``watch=true`` or the legacy ``/watch/``
    prefix). resource: the plural, with ``/subresource`` when one is named (``sandboxes/status``,
    ``pods/log``). ``query`` adds to the URL's own query string; ``prefix`` is the path of the
    server's URL (a proxy path such as ``/k8s/clusters/c-1``), dropped first.
    """
    parts = urlsplit(url)
    path = parts.path
    prefix = prefix.rstrip("/")
    if prefix and (path == prefix or path.startswith(prefix + "/")):
        path = path[len(prefix) :]
    segments = [unquote(s) for s in path.split("/") if s]
    verb = _METHOD_VERBS.get(method.upper(), method.lower())

    root = next((i for i, s in enumerate(segments) if s in ("api", "apis")), None)
    if root is None:
        return verb, NONRESOURCE
    # /api/VERSION/... (core) or /apis/GROUP/VERSION/...
    rest = segments[root + (2 if segments[root] == "api" else 3) :]
    if not rest:
        return verb, DISCOVERY
    special = None
    if rest[0] in ("watch", "proxy"):
        special, rest = rest[0], rest[1:]
        if not rest:
            return verb, NONRESOURCE
    if rest[0] == "namespaces" and len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
        rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 and special != "proxy" else ""

    if special is not None:
        verb = special
    elif not name and verb == "get":
        params = parse_qsl(parts.query, keep_blank_values=True) + list(_query_items(query))
        watch = any(k == "watch" and str(v).lower() in _TRUE for k, v in params)
        verb = "watch" if watch else "list"
    elif not name and verb == "delete":
        verb = "deletecollection"
    return verb, f"{resource}/{subresource}" if subresource else resource


def _query_items(
    query: Mapping[str, Any] | Iterable[tuple[str, Any]] | None,
) -> Iterator[tuple[str, Any]]:
    if not query:
        return
    if isinstance(query, Mapping):
        yield from query.items()
        return
    for item in query:
        if isinstance(item, tuple | list) and len(item) == 2:
            yield item[0], item[1]


def _server_prefix(server: str) -> str:
    return urlsplit(server).path.rstrip("/") if server else ""
