"""``python -m sandbox_operator.router --config FILE``: the router's process (the chart's router
Deployment runs it from the operator image)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

from .activity import ActivityStamps
from .config import RouterConfig, load_router_config
from .kube import KubeSandboxes
from .metrics import serve_metrics
from .reviews import CachedReviewer, KubeReviewer
from .server import Router, Timeouts
from .view import View
from .wake import Waker

log = logging.getLogger("sandbox_operator.router")


async def run(config: RouterConfig, kubeconfig: str | None = None) -> None:
    from sandbox_operator.kubeapi import new_api_client

    api = await new_api_client(kubeconfig=kubeconfig)
    view = View()
    kube = KubeSandboxes(api, view, config.namespaces)
    reviewer = CachedReviewer(KubeReviewer(api, config.audiences), config.review_cache_seconds)
    router = Router(
        view,
        reviewer,
        Waker(view, kube, config.wake_timeout_seconds),
        ActivityStamps(kube.stamp, config.activity_interval_seconds),
        Timeouts(
            connect=config.connect_timeout_seconds,
            response=config.response_timeout_seconds,
            idle=config.idle_timeout_seconds,
        ),
        synced=lambda: kube.synced,
    )
    watches = asyncio.create_task(kube.run())
    server = await router.serve(config.listen_host, config.listen_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("router listening on %s:%d", config.listen_host, config.listen_port)
    if config.metrics_port:
        bound = serve_metrics(config.listen_host, config.metrics_port)
        log.info("router metrics at http://%s:%d/metrics", config.listen_host, bound)
    try:
        await stop.wait()
    finally:
        server.close()
        watches.cancel()
        await api.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox_operator.router")
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--kubeconfig", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = load_router_config(args.config) if args.config else RouterConfig()
    asyncio.run(run(config, args.kubeconfig))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
