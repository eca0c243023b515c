"""The one way this package opens the Kubernetes API (kubernetes_asyncio) and reads its answers.

The operator, the egress proxy and the client each needed a kubeconfig loader, an RFC 3339 parser
for the API's timestamps and the API server's message out of a failed call; they were four
copies that drifted apart. This module is the shared copy. It imports only kubernetes_asyncio
and the standard library, so the client's base install (no kopf, no sync ``kubernetes``) can use
it. Importing it first also keeps kubernetes_asyncio's generated classes out of memory until one is
used (``_lazy_exports``): they were a third of the operator's resident memory. Every client it
makes reads the environment's proxy settings once, not on every request (``_env_read_once``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import json
import os
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

#: kubernetes_asyncio's packages whose ``__init__`` imports every generated API class and model
#: (about 1,600 modules, 30 MiB of a process that uses a dozen of them). Their ``from ... import
#: Name`` lines are turned into lazy exports (PEP 562), as the sync ``kubernetes`` client already
#: does upstream: a name is imported when it is first read, and is the very same class.
_LAZY_PACKAGES = frozenset(
    {
        "kubernetes_asyncio.client",
        "kubernetes_asyncio.client.api",
        "kubernetes_asyncio.client.models",
    }
)
_EXPORT = re.compile(r"^from (kubernetes_asyncio\.client\.(?:api|models)\.\w+) import (\w+)$", re.M)


class _LazyExportsLoader(importlib.abc.Loader):
    """Runs a package's ``__init__`` without its generated ``from ... import Name`` lines, which
    become a module ``__getattr__``: everything else in the file (the ApiClient, Configuration,
    exceptions) runs as written. A file without such lines runs unchanged."""

    def __init__(self, real: importlib.machinery.SourceFileLoader) -> None:
        self.real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        source = self.real.get_source(module.__name__) or ""
        exports = {name: where for where, name in _EXPORT.findall(source)}

        def __getattr__(name: str) -> Any:  # PEP 562: read for a missing name
            where = exports.get(name)
            if where is None:
                raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
            value = getattr(importlib.import_module(where), name)
            setattr(module, name, value)
            return value

        def __dir__() -> list[str]:
            return sorted(set(module.__dict__) | set(exports))

        module.__dict__.update(__getattr__=__getattr__, __dir__=__dir__)
        code = compile(_EXPORT.sub("", source), self.real.get_filename(module.__name__), "exec")
        exec(code, module.__dict__)  # the library's own file, minus those lines


class _LazyExportsFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _LAZY_PACKAGES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return spec  # no source to read: the library loads as it always does
        spec.loader = _LazyExportsLoader(spec.loader)
        return spec


def _lazy_exports() -> None:
    """Install the finder before kubernetes_asyncio is first imported (kopf imports it too, for
    its owner-reference helpers). Once the library is loaded, nothing changes."""
    if "kubernetes_asyncio.client" in sys.modules:
        return
    if not any(isinstance(f, _LazyExportsFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _LazyExportsFinder())


_lazy_exports()

from kubernetes_asyncio import client as k8s  # noqa: E402 (after the finder, on purpose)
from kubernetes_asyncio import config as k8s_config  # noqa: E402
from kubernetes_asyncio.client.exceptions import ApiException  # noqa: E402

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
    return _env_read_once(k8s.ApiClient(configuration=cfg))


def in_cluster_api_client(*, configuration: k8s.Configuration | None = None) -> k8s.ApiClient:
    """An ApiClient from the pod's service account (raises ``ConfigException`` outside a pod).
    Synchronous: reading the mounted token needs no I/O loop, so a constructor can call it."""
    cfg = configuration if configuration is not None else k8s.Configuration()
    k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    return _env_read_once(k8s.ApiClient(configuration=cfg))


def _env_read_once(api: k8s.ApiClient) -> k8s.ApiClient:
    """The client's aiohttp session, told not to consult the environment on every request.

    kubernetes_asyncio opens its session with ``trust_env=True``: aiohttp then looks up a
    ``.netrc`` entry and the proxy variables for each request, in a worker thread each (two
    thread hops and a file lookup per call: about half of a write's CPU in the operator). The
    proxy the environment names for the API server (``HTTPS_PROXY``, ``NO_PROXY``, ...) is read
    here once instead, as aiohttp would read it, unless the kubeconfig set one; a ``.netrc``
    entry, basic auth for the API server's host, is not used (a Kubernetes API is reached with a
    token or a client certificate)."""
    from aiohttp.helpers import get_env_proxy_for_url
    from yarl import URL

    rest: Any = getattr(api, "rest_client", None)
    session = getattr(rest, "pool_manager", None)
    if session is None or not getattr(session, "_trust_env", False):
        return api
    if rest.proxy is None:
        try:
            proxy, auth = get_env_proxy_for_url(URL(str(api.configuration.host)))
        except LookupError:
            pass  # no proxy for this host
        else:
            rest.proxy = str(proxy)
            if auth is not None:
                rest.proxy_headers = {
                    **(rest.proxy_headers or {}),
                    "Proxy-Authorization": auth.encode(),
                }
    session._trust_env = False
    return api


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
