"""Kubernetes calls shared by the reconcilers and the backend drivers, over kubernetes_asyncio."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any, Final, TypeVar

from sandbox_operator.views import ListView, WatchEvent
from sandbox_operator.views.fields import mapping
from sandbox_operator.views.objects import Raw

V = TypeVar("V", bound=Raw)

log = logging.getLogger(__name__)


async def call_json(call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Make a kubernetes_asyncio call without building its typed model (a V1Pod costs far
    more CPU to deserialize than the JSON it came in) and return the parsed JSON; a non-2xx
    answer raises ``ApiException`` as the ordinary call would."""
    parsed, _ = await call_json_status(call, *args, **kwargs)
    return parsed


async def call_json_status(call: Any, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], int]:
    """:func:`call_json`, and the answer's HTTP status (a create answers 201, which the
    generated client does not even decode: its answer comes back as None)."""
    from kubernetes_asyncio.client.exceptions import ApiException

    resp = await call(*args, _preload_content=False, **kwargs)
    try:
        data = await resp.read()
    finally:
        resp.release()
    if not 200 <= resp.status <= 299:
        exc = ApiException(status=resp.status, reason=resp.reason)
        exc.body = data.decode("utf-8", "replace")
        raise exc
    return (json.loads(data) if data else {}), int(resp.status)


async def read_or_none(api: Any, call: Any, *args: Any) -> dict[str, Any] | None:
    """Make a kubernetes_asyncio read call and return its object as JSON data (through
    ``api.sanitize_for_serialization``, ``api`` being the ApiClient), or None when the API server
    answers 404: the object is not there. Any other refusal raises ``ApiException``."""
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        obj = await call(*args)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    out: dict[str, Any] = api.sanitize_for_serialization(obj)
    return out


#: A watch is ended by the server after this long and opened again (from the last version).
WATCH_SECONDS: Final = 300


async def list_then_watch(
    list_call: Any,
    *args: Any,
    view: type[V],
    on_list: Callable[[list[V]], None],
    on_change: Callable[[str, V], None],
    what: str,
    field_selector: str | None = None,
    retry_seconds: float = 2.0,
) -> None:
    """List, then watch, for ever: ``on_list(items)`` with every object a list returns, then
    ``on_change(type, object)`` for each change the watch delivers (``ADDED``, ``MODIFIED``,
    ``DELETED``). A watch the server ends is opened again from the last version seen; an expired
    version (410) or an error lists again, after ``retry_seconds``, and is logged naming
    ``what`` and the error's status or type (never its message, which may echo the request).
    Objects stay JSON dicts (no typed models built), each handed out wrapped in ``view`` (a view
    of ``sandbox_operator.views``: no copy). Never raises but ``CancelledError``."""
    from kubernetes_asyncio import watch

    selector = {"field_selector": field_selector} if field_selector else {}
    version: str | None = None
    while True:
        try:
            if version is None:
                body = ListView(await call_json(list_call, *args, **selector))
                on_list([view(mapping(item)) for item in body.objects])
                version = body.metadata.resource_version or None
            # return_type "object": the changes stay dicts. An expired version arrives as an
            # ApiException (410), below.
            w = watch.Watch(return_type="object")
            async with w.stream(
                list_call,
                *args,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_SECONDS,
                _request_timeout=WATCH_SECONDS + 30,
                **selector,
            ) as stream:
                async for raw in stream:
                    version = w.resource_version or version
                    change = WatchEvent(raw)
                    if change.type in ("ADDED", "MODIFIED", "DELETED"):
                        on_change(change.type, view(mapping(change.object)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            status = getattr(exc, "status", None)
            log.warning(
                "watching %s failed (%s); again in %.0fs",
                what,
                status or type(exc).__name__,
                retry_seconds,
            )
            if status == 410:
                version = None
            await asyncio.sleep(retry_seconds)
