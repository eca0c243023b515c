"""Kubernetes calls shared by the reconcilers and the backend drivers, over kubernetes_asyncio."""

from __future__ import annotations

import json
from typing import Any


async def call_json(call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Make a kubernetes_asyncio call without building its typed model (a V1Pod costs far
    more CPU to deserialize than the JSON it came in) and return the parsed JSON; a non-2xx
    answer raises ``ApiException`` as the ordinary call would."""
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
    return parsed
