"""The router's configuration file (the chart renders it from ``router.config``): where it
listens, which namespaces it serves, how long a request may wait for a suspended Sandbox, and
how long review answers are kept. Invalid values refuse to start, naming the field."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import Field

from sandbox_operator.contract.base import ContractModel


class RouterConfig(ContractModel):
    listen_host: str = Field(default="0.0.0.0", min_length=1, max_length=253)
    listen_port: int = Field(default=8080, ge=1, le=65535)
    metrics_port: int = Field(
        default=9090,
        ge=0,
        le=65535,
        description="Where GET /metrics is served (the router's Prometheus metrics, on "
        "listenHost); 0: not served.",
    )
    namespaces: tuple[str, ...] = Field(
        default=(),
        max_length=1000,
        description="Namespaces whose Sandboxes are routed; empty: all of them.",
    )
    wake_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="How long a request to a suspended or starting Sandbox is held until it is "
        "Ready (then 503 NotReadyInTime).",
    )
    review_cache_seconds: float = Field(
        default=10.0,
        ge=0,
        le=300,
        description="How long a TokenReview or SubjectAccessReview answer is kept (a revoked "
        "grant or token still works this long).",
    )
    activity_interval_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Least time between two last-activity stamps of one Sandbox.",
    )
    connect_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    response_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="How long the pod may take to begin its answer (then 504).",
    )
    idle_timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        le=86400,
        description="Silence both ways after which a spliced connection (a WebSocket) is closed.",
    )
    audiences: tuple[str, ...] = Field(
        default=(), max_length=16, description="TokenReview audiences; empty: the API server's."
    )


def load_router_config(path: Path) -> RouterConfig:
    data = yaml.safe_load(path.read_text()) or {}
    return RouterConfig.model_validate(data)
