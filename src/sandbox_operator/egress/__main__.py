"""``python -m sandbox_operator.egress --config FILE``: run the proxy as its own process.

FILE is YAML or JSON in the ProxyConfig shape (camelCase keys). It is re-read on SIGHUP and
whenever its modification time changes (checked every ``--reload-seconds``); an invalid new
version is logged and ignored, the running config stays. Decisions are written to stdout as JSON
lines (one object per decision, see Decision.as_dict); logs go to stderr.

Exit codes: 0 after SIGTERM/SIGINT, 2 for an unreadable or invalid config at start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sandbox_operator.egress.config import CA_CERT_KEY, CA_KEY_KEY, ProxyConfig
from sandbox_operator.egress.decisions import DecisionSink, FanoutSink, JsonLinesSink
from sandbox_operator.egress.identity import IdentityConflict
from sandbox_operator.egress.proxy import EgressProxy

log = logging.getLogger("sandbox_operator.egress")


class ConfigFileError(Exception):
    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why


def load_config(path: Path) -> ProxyConfig:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigFileError(path, exc.strerror or "unreadable") from None
    try:
        data: Any = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigFileError(path, f"not valid YAML/JSON: {type(exc).__name__}") from None
    try:
        return ProxyConfig.model_validate(data or {})
    except ValidationError as exc:
        errors = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigFileError(path, errors) from None


def _write_ready(path: Path, port: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{port}\n")
    tmp.replace(path)


async def run(
    path: Path,
    reload_seconds: float,
    ready_file: Path | None,
    kube_namespace: str = "",
    summary_seconds: float = 5.0,
    kube_service: str = "",
    ca_dir: Path | None = None,
) -> int:
    config = load_config(path)
    interception = None
    if config.interception.enabled:
        if ca_dir is None:
            log.error("interception.enabled needs --ca-dir (the CA's ca.crt and ca.key)")
            return 2
        from sandbox_operator.egress.interception import InterceptionCA

        interception = InterceptionCA(
            (ca_dir / CA_CERT_KEY).read_bytes(),
            (ca_dir / CA_KEY_KEY).read_bytes(),
            extra_upstream_roots=config.interception.extra_upstream_roots,
        )
        log.info("terminating TLS for hosts whose egress rules name https")
    sinks: list[DecisionSink] = [JsonLinesSink(sys.stdout)]
    controller = None
    if kube_namespace:
        from sandbox_operator.egress.kube import KubeEgressController, kube_api_client

        controller = KubeEgressController(
            await kube_api_client(),
            kube_namespace,
            summary_interval=summary_seconds,
            service=kube_service,
        )
        sinks.append(controller)
    credentials = None
    if controller is not None:
        from sandbox_operator.egress.credentials import SecretCredentials

        # Read on demand, only the Secrets the admitted credentials name (credentials.py).
        credentials = SecretCredentials(controller.core.read_namespaced_secret)
    proxy = EgressProxy(
        config, sink=FanoutSink(sinks), interception=interception, credentials=credentials
    )
    host, port = await proxy.start()
    stop_controller = asyncio.Event()
    controller_task = None
    if controller is not None:
        controller.proxy = proxy
        controller_task = asyncio.create_task(controller.run(stop_controller))
        log.info("keeping the sandbox table of namespace %s", kube_namespace)
    log.info("egress proxy listening on %s:%d with %d sandboxes", host, port, len(proxy.table))
    if ready_file is not None:
        _write_ready(ready_file, port)

    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    flags = {"stop": False, "reload": False}

    def on_signal(flag: str) -> None:
        flags[flag] = True
        wake.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, "stop")
    loop.add_signal_handler(signal.SIGHUP, on_signal, "reload")

    def mtime() -> float:
        try:
            return path.stat().st_mtime
        except OSError:
            return 0.0

    seen = mtime()
    while not flags["stop"]:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(reload_seconds):
                await wake.wait()
        wake.clear()
        if flags["stop"]:
            break
        current = mtime()
        if not flags["reload"] and current == seen:
            continue
        flags["reload"] = False
        seen = current
        try:
            proxy.reconfigure(load_config(path))
            log.info("config reloaded: %d sandboxes", len(proxy.table))
        except (ConfigFileError, IdentityConflict) as exc:
            log.error("config reload rejected, keeping the running one: %s", exc)
    if controller_task is not None:
        stop_controller.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(controller_task, 10)
    await proxy.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox_operator.egress")
    parser.add_argument("--config", required=True, type=Path, help="YAML/JSON ProxyConfig")
    parser.add_argument("--reload-seconds", type=float, default=2.0)
    parser.add_argument("--ready-file", type=Path, help="write the bound port here once listening")
    parser.add_argument("--check", action="store_true", help="validate the config and exit")
    parser.add_argument(
        "--kube-namespace",
        default="",
        help="keep the sandbox table from this namespace's allowlist Sandboxes and post "
        "decisions as Events and a status.egress summary on them (sandbox_operator.egress.kube)",
    )
    parser.add_argument(
        "--kube-service",
        default="",
        help="with --kube-namespace: the proxy's own Service there; admissions are reported "
        "(status.egress.admitted) only once a connection through it reaches the proxy",
    )
    parser.add_argument(
        "--ca-dir",
        type=Path,
        help="with interception.enabled: the directory holding the CA's ca.crt and ca.key",
    )
    parser.add_argument(
        "--summary-seconds",
        type=float,
        default=5.0,
        help="with --kube-namespace: write a Sandbox's status.egress at most this often (5)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    try:
        if args.check:
            cfg = load_config(args.config)
            print(f"ok: {len(cfg.sandboxes)} sandboxes")
            return 0
        if args.summary_seconds <= 0:
            parser.error("--summary-seconds must be positive")
        return asyncio.run(
            run(
                args.config,
                args.reload_seconds,
                args.ready_file,
                args.kube_namespace,
                args.summary_seconds,
                args.kube_service,
                args.ca_dir,
            )
        )
    except ConfigFileError as exc:
        log.error("invalid config: %s", exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
