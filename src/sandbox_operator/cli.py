"""``sandbox-operator``: run the operator, or check a configuration without a cluster.

* ``sandbox-operator run --config FILE [--namespace NS ...|--all-namespaces] [--health-port N]
  [--metrics-port N]`` validates the configuration (refusing to start on any error, naming the
  entry), then runs the kopf operator with an HTTP health endpoint at ``/healthz`` and Prometheus
  metrics at ``/metrics`` (``sandbox_operator.metrics``; ``--metrics-port 0`` disables them).
* ``sandbox-operator check-config FILE [--spec sandbox.yaml] [--scope sandboxscope.yaml]`` gives
  the same verdict on the file without a cluster and, with ``--spec``, says whether that spec
  would be served, by which backend, or why not. (RuntimeClass existence needs a cluster and is
  checked by ``run`` only.)
* ``sandbox-operator shell SANDBOX [-n NS] [--kubeconfig FILE] [--context C] [-t|-T] [-- ARGV]``
  runs ``sh`` (or ARGV) in a Sandbox by name, as ``kubectl exec -it`` would in its pod, with the
  caller's own RBAC (:mod:`sandbox_operator.client.terminal`); it exits with the command's code.

Exit codes: 0 ok / would be served; 1 configuration invalid; 2 usage error or unreadable spec;
3 the spec would be refused; ``shell``: the command's own, or 255 for a failure of the client.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import yaml
from pydantic import ValidationError

from sandbox_operator.config import OperatorConfig, load_config, operator_namespace, profiles
from sandbox_operator.contract import (
    ConfigurationError,
    SandboxRefusal,
    SandboxResourceSpec,
    SandboxScopeResourceSpec,
    SandboxSpec,
)
from sandbox_operator.policy import admit_request

EXIT_OK = 0
EXIT_CONFIG = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sandbox-operator", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator")
    run.add_argument("--config", required=True, help="operator configuration file (YAML)")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace", "-n", action="append", default=[], help="namespace to serve (repeatable)"
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="serve all namespaces")
    run.add_argument("--health-port", type=int, default=8080, help="port of GET /healthz")
    run.add_argument("--health-host", default="0.0.0.0")
    run.add_argument("--no-health", action="store_true", help="do not serve /healthz")
    run.add_argument(
        "--metrics-port",
        type=int,
        default=8081,
        help="port of GET /metrics (Prometheus); 0 disables the endpoint and kopf's request counts",
    )
    run.add_argument("--metrics-host", default="0.0.0.0")
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    run.add_argument(
        "--priority",
        type=int,
        default=None,
        help="kopf peering priority (default: derived from POD_NAME or the host name, so "
        "replicas differ and only the highest one acts)",
    )
    run.add_argument("--peering", default=None, help="kopf peering object name (default: auto)")
    run.add_argument(
        "--standalone", action="store_true", help="no peering (a single replica, e.g. in tests)"
    )
    run.add_argument(
        "--pool-seal",
        default=None,
        metavar="POLICY",
        help="the ValidatingAdmissionPolicy sealing idle warm-pool pods (the chart's "
        "sealIdlePoolPods; POLICY-update is its pair): checked, and recorded by each claim "
        "(status.sealedUntilClaim); without it no pool pod is vouched for",
    )

    check = sub.add_parser("check-config", help="validate a configuration without a cluster")
    check.add_argument("file")
    check.add_argument("--spec", help="a Sandbox manifest (or bare spec) to judge")
    check.add_argument(
        "--scope", help="the SandboxScope manifest it references (for the scope's floors)"
    )
    # The egress probe owns its own flags; this subcommand only forwards them to it.
    sub.add_parser(
        "check-egress",
        help="probe a live Sandbox's egress against its declared mode "
        "(flags: see `sandbox-operator check-egress --help`)",
        add_help=False,
    )
    shell = sub.add_parser("shell", help="run a shell (or a command) in a Sandbox, by name")
    shell.add_argument("sandbox", help="the Sandbox's name")
    shell.add_argument("-n", "--namespace", help="its namespace (default: the context's)")
    shell.add_argument("--kubeconfig", help="a kubeconfig (default: $KUBECONFIG)")
    shell.add_argument("--context", help="one of the kubeconfig's contexts")
    mode = shell.add_mutually_exclusive_group()
    mode.add_argument("-t", "--tty", dest="tty", action="store_true", default=None)
    mode.add_argument("-T", "--no-tty", dest="tty", action="store_false")
    shell.set_defaults(argv=[])  # the command: what follows ``--`` (default: sh)
    return p


def _default_priority() -> int:
    ident = os.environ.get("POD_NAME") or os.uname().nodename
    return 100 + int(hashlib.sha256(ident.encode()).hexdigest()[:6], 16) % 10000


def _peering_identity() -> str | None:
    """The operator's identity in the peering object: the pod's, when it runs in one.

    The priority is derived from the pod name, so it survives a container restart; the identity
    must too. kopf's own identity is made anew by each process (user, host, start time, random),
    so a container restarted after a SIGKILL would find its dead predecessor's record, with its
    own priority, still within its lifetime, and pause itself until that ran out (up to 60 s).
    With the pod's identity the record is its own: ignored, then overwritten by the first
    keep-alive. One container per pod, so two live processes never share it. Outside a pod
    (no ``POD_NAME``) kopf's per-process identity stays, so two processes on one host still
    see each other."""
    pod = os.environ.get("POD_NAME")
    if not pod:
        return None
    namespace = operator_namespace()
    return f"{namespace}/{pod}" if namespace else pod


def _load_yaml(path: str) -> Any:
    with open(path) as fh:
        return yaml.safe_load(fh)


def _spec_from(doc: Any) -> tuple[SandboxSpec, str, str | None]:
    """A SandboxSpec from a Sandbox manifest or a bare spec; also the scopeRef and callId.

    The callId is None for a bare spec (it has no key, so the per-call check is skipped).
    """
    if not isinstance(doc, dict):
        raise ValueError("the spec file must be a YAML mapping")
    body = doc.get("spec", doc) if doc.get("kind") == "Sandbox" or "apiVersion" in doc else doc
    if "scopeRef" in body or "agentDir" in body:
        res = SandboxResourceSpec.model_validate(body)
        return res.sandbox_spec(), res.scope_ref, res.call_id
    return SandboxSpec.model_validate(body), "", None


def _load(path: str, refusal: str) -> tuple[OperatorConfig, tuple[str, ...]] | None:
    """The validated configuration, or None after saying on stderr why it is invalid."""
    try:
        return load_config(path)
    except ConfigurationError as exc:
        print(f"{refusal}configuration invalid: {exc}", file=sys.stderr)
        return None


def _check_config(args: argparse.Namespace) -> int:
    if (loaded := _load(args.file, "")) is None:
        return EXIT_CONFIG
    config, warnings = loaded
    print(f"configuration ok: {len(config.backends)} backend(s): {', '.join(config.backend_names)}")
    print(
        f"host policy: minIsolation {config.host_policy.min_isolation.value}, "
        f"selection {config.host_policy.selection.value}"
    )
    for w in warnings:
        print(f"warning: {w}")
    if not args.spec:
        return EXIT_OK
    try:
        spec, _scope_ref, call_id = _spec_from(_load_yaml(args.spec))
        scope_spec = None
        if args.scope:
            sdoc = _load_yaml(args.scope)
            scope_spec = SandboxScopeResourceSpec.model_validate(sdoc.get("spec", sdoc))
    except (OSError, ValueError, ValidationError, yaml.YAMLError) as exc:
        print(f"spec invalid: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return _judge(config, spec, scope_spec, call_id)


def _judge(
    config: OperatorConfig,
    spec: SandboxSpec,
    scope: SandboxScopeResourceSpec | None,
    call_id: str | None = None,
) -> int:
    try:
        admission = admit_request(
            config.host_policy,
            profiles(config),
            spec,
            call_id=call_id,
            scope_floor=scope.min_isolation if scope else None,
            scope_min_isolation_scope=scope.min_isolation_scope if scope else None,
        )
    except SandboxRefusal as refusal:
        print(f"refused: {refusal.reason.value}: {refusal.message}")
        return EXIT_REFUSED
    print(
        f"served by backend {admission.backend.name} (isolation {admission.backend.isolation}, "
        f"effective floor {admission.floor.value}, isolation scope "
        f"{admission.isolation_scope.value})"
    )
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    if (loaded := _load(args.config, "refusing to start: ")) is None:
        return EXIT_CONFIG
    config, warnings = loaded
    for w in warnings:
        print(f"config warning: {w}", file=sys.stderr)

    import kopf

    import sandbox_operator.reconcile.handlers  # noqa: F401  (registers the handlers)

    kopf.configure(debug=args.log_level == "debug", quiet=args.log_level in ("warning", "error"))
    logging.getLogger().setLevel(getattr(logging, args.log_level.upper()))
    if args.log_level != "debug":
        # The API client logs whole response bodies at DEBUG; never at lower verbosity.
        logging.getLogger("kubernetes_asyncio").setLevel(logging.WARNING)
        # kopf reports every successful handler and timer run at INFO: noise at this level.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        logging.getLogger("kopf.activities.probe").setLevel(logging.WARNING)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # every health probe
    if args.metrics_port:
        _start_metrics(args.metrics_host, args.metrics_port)
    from sandbox_operator.reconcile.namespaces import ServedNamespaces

    served = ServedNamespaces.of(args.namespace, bool(args.all_namespaces))
    liveness = None if args.no_health else f"http://{args.health_host}:{args.health_port}/healthz"
    kopf.run(
        clusterwide=bool(args.all_namespaces),
        namespaces=tuple(args.namespace),
        standalone=True if args.standalone else None,
        priority=args.priority if args.priority is not None else _default_priority(),
        peering_name=args.peering,
        identity=_peering_identity(),  # type: ignore[arg-type]  # kopf does not export Identity
        liveness_endpoint=liveness,
        # The handlers' only way to the configuration: startup reads memo.config (and where to
        # publish what it serves: reconcile/publish.py).
        memo=kopf.Memo(
            config=config,
            # What it serves: where it publishes (reconcile/publish.py) and where its own
            # watches (reconcile/handlers.py) look: the named namespaces, or all of them (None)
            # when serving all or given a pattern.
            served=served,
            namespaces=served.exact,
            # The policy sealing idle pool pods, to check (reconcile/seal.py); None: none.
            pool_seal=args.pool_seal,
        ),
    )
    return EXIT_OK


def _start_metrics(host: str, port: int) -> None:
    """Serve /metrics and count kopf's own API requests. Metrics are not worth an outage: an
    address that cannot be bound is reported and the operator runs without the endpoint."""
    from sandbox_operator.metrics.kopf_session import instrument_kopf
    from sandbox_operator.metrics.server import start_metrics_server

    try:
        start_metrics_server(host, port)
    except OSError as exc:
        print(
            f"metrics: cannot serve on {host}:{port}: {exc}; running without them", file=sys.stderr
        )
        return
    instrument_kopf()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check-egress"]:
        from sandbox_operator.egress.probe import main as probe_main

        return probe_main(argv[1:])
    # ``shell``'s command is everything after ``--``, whatever it looks like.
    command: list[str] = []
    if argv[:1] == ["shell"] and "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    args = _parser().parse_args(argv)
    if command:
        args.argv = command
    if args.command == "check-config":
        return _check_config(args)
    if args.command == "shell":
        from sandbox_operator.client.terminal import main as shell_main

        return shell_main(args)
    if args.command == "run":
        if not args.all_namespaces and not args.namespace:
            print("run: give --namespace NS (repeatable) or --all-namespaces", file=sys.stderr)
            return EXIT_USAGE
        if args.metrics_port < 0 or args.metrics_port > 65535:
            print(f"run: --metrics-port {args.metrics_port} is not a port", file=sys.stderr)
            return EXIT_USAGE
        if args.metrics_port and not args.no_health and args.metrics_port == args.health_port:
            print("run: --metrics-port and --health-port must differ", file=sys.stderr)
            return EXIT_USAGE
        return _run(args)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
