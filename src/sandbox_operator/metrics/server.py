"""``GET /metrics``: the default registry served from a daemon thread (``prometheus_client``),
independent of kopf's event loop, so a busy or blocked loop still answers a scrape. Its own module
because it is the process's one endpoint, started and stopped by the CLI, apart from what the
metrics are.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import start_http_server

log = logging.getLogger(__name__)

_server: Any = None


def start_metrics_server(host: str, port: int) -> None:
    """Serve ``GET /metrics`` (the default registry) on ``host:port`` from a daemon thread.

    Raises OSError when the address cannot be bound. A second call stops the first server."""
    global _server
    stop_metrics_server()
    server, _thread = start_http_server(port, addr=host)
    _server = server
    log.info("serving metrics at http://%s:%d/metrics", host, server.server_port)


def stop_metrics_server() -> None:
    global _server
    if _server is not None:
        _server.shutdown()
        _server.server_close()
        _server = None


def metrics_server_port() -> int | None:
    """The bound port of the running metrics server (useful after ``port=0``), else None."""
    return int(_server.server_port) if _server is not None else None
