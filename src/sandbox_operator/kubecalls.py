"""Kubernetes calls shared by the reconcilers and the backend drivers, over kubernetes_asyncio."""

from __future__ import annotations

import json
from typing import Any


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
    parsed: dict[str, Any] = json.loads(data) if data else {}
    return parsed, int(resp.status)


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
