"""Counting kopf's own API requests (its watches, lists, patches, events, peering).

kopf opens its own aiohttp session, which no hook on the operator's ``ApiClient`` reaches; a
login handler (kopf's documented ``kopf.AiohttpSession``) hands it a session whose trace counts
each request into the same metrics (``requests.py``) under ``client="kopf"``. Its own module
because it is how kopf is made to use that session, apart from how a request is counted.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from types import SimpleNamespace
from typing import Any

from sandbox_operator.apirequest import _server_prefix
from sandbox_operator.metrics import CLIENT_KOPF, CODE_CANCELLED, CODE_ERROR
from sandbox_operator.metrics.requests import LabelledRequest, label_request, safely

log = logging.getLogger(__name__)


def api_trace_config(server: str = "", client: str = CLIENT_KOPF) -> Any:
    """An ``aiohttp.TraceConfig`` counting every request of a session into the API metrics.

    ``server`` is the API server's URL, whose path (if any) is dropped before parsing.
    """
    import aiohttp

    prefix = _server_prefix(server)
    config = aiohttp.TraceConfig()

    async def on_start(_session: Any, ctx: SimpleNamespace, params: Any) -> None:
        ctx.metrics_request = label_request(params.method, str(params.url), None, prefix, client)

    async def on_end(_session: Any, ctx: SimpleNamespace, params: Any) -> None:
        req: LabelledRequest | None = getattr(ctx, "metrics_request", None)
        if req is not None:
            safely(req.answered, str(params.response.status))
            safely(req.read_at_eof, params.response)

    async def on_exception(_session: Any, ctx: SimpleNamespace, params: Any) -> None:
        req: LabelledRequest | None = getattr(ctx, "metrics_request", None)
        if req is not None:
            cancelled = isinstance(params.exception, asyncio.CancelledError)
            safely(req.answered, CODE_CANCELLED if cancelled else CODE_ERROR)

    config.on_request_start.append(on_start)
    config.on_request_end.append(on_end)
    config.on_request_exception.append(on_exception)
    return config


def instrumented_session(info: Any) -> Any:
    """An aiohttp session for kopf from a ``kopf.ConnectionInfo``, built as kopf builds its own
    (kopf/_cogs/clients/auth.py: no connection limit, the info's SSL context, headers, proxy and
    trust_env) plus ``api_trace_config``. Must be called on the event loop."""
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(),
        proxy=info.proxy_url or None,  # None: no proxy (aiohttp's default)
        trust_env=info.trust_env,
        trace_configs=[api_trace_config(info.server)],
    )


async def kopf_login(*, logger: Any, settings: Any, **_: Any) -> Any:
    """kopf login handler: kopf's default credentials (``kopf.login_via_client``, what kopf
    uses when no login handler is declared and the kubernetes library is installed) in an
    instrumented session. If the session cannot be built, the plain credentials (uncounted)."""
    import kopf

    info = await asyncio.to_thread(kopf.login_via_client, logger=logger, settings=settings)
    if info is None:
        return None
    try:
        session = instrumented_session(info)
    except Exception:
        log.warning("metrics: kopf's API requests are not counted", exc_info=True)
        return info
    return kopf.AiohttpSession(
        server=info.server,
        default_namespace=info.default_namespace,
        priority=info.priority,
        expiration=info.expiration,
        aiohttp_session=session,
    )


_kopf_registries: weakref.WeakSet[Any] = weakref.WeakSet()


def instrument_kopf(registry: Any = None) -> bool:
    """Count kopf's own API requests (and its watch restarts): register ``kopf_login`` as the
    login handler of ``registry`` (default: kopf's default registry), once per registry.

    It replaces kopf's implicit login (a declared login handler disables the fallbacks) with the
    same credentials. Returns False, counting nothing, on a kopf without ``kopf.AiohttpSession``.
    """
    import kopf

    if not hasattr(kopf, "AiohttpSession"):
        log.warning("metrics: this kopf has no AiohttpSession; its API requests are not counted")
        return False
    target = registry if registry is not None else kopf.get_default_registry()
    if target in _kopf_registries:
        return True
    kopf.on.login(id="metrics-login", errors=kopf.ErrorsMode.IGNORED, registry=target)(kopf_login)
    _kopf_registries.add(target)
    return True
