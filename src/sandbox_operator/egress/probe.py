"""The egress probe: what a sandbox can really reach, measured from inside it.

A small Python program (:data:`PROBE_SCRIPT`, standard library only, needs ``python3`` in the
image) runs inside the sandbox and tries each :class:`ProbeTarget` once, with a hard per-target
deadline, in one of three ways:

- ``direct``: a TCP connection to ``host:port`` and one ``GET`` (what traffic that ignores the
  proxy variables does);
- ``connect``: ``CONNECT host:port`` through the proxy, then one ``GET`` through the tunnel;
- ``http``: one absolute-form ``GET http://host:port/path`` through the proxy.

Each attempt ends in exactly one :class:`Outcome` with the time it took, so a caller can assert
both *that* a host is unreachable and that the attempt failed fast instead of hanging.

:func:`run_probe` takes any async ``execute(argv) -> stdout`` (a ``Sandbox`` handle's exec, a
pod exec), so the same probe runs against every backend; :func:`judge` turns results into the
verdicts the egress modes promise (closed reaches nothing; allowed answers; denied is refused).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from sandbox_operator import kubeobj
from sandbox_operator.contract.resources import GROUP, SANDBOX_PLURAL, VERSION
from sandbox_operator.views import SandboxView


class Via(StrEnum):
    DIRECT = "direct"
    CONNECT = "connect"
    HTTP = "http"


class Outcome(StrEnum):
    ANSWERED = "answered"  # the origin server answered (any HTTP status)
    PROXY_REFUSED = "proxy_refused"  # the proxy answered with a refusal (403, 502, ...)
    REFUSED = "refused"  # TCP connection refused (RST / ICMP port unreachable)
    UNREACHABLE = "unreachable"  # ICMP host/net unreachable or administratively prohibited
    TIMEOUT = "timeout"  # nothing within the deadline (packets dropped)
    RESOLVE_FAILED = "resolve_failed"  # the name did not resolve (or not within the deadline)
    NO_PROXY = "no_proxy"  # a proxied probe, but no proxy was given or set in the environment
    ERROR = "error"  # anything else (detail says what)


#: Outcomes that mean "the packet did not get through to anything".
BLOCKED = frozenset({Outcome.REFUSED, Outcome.UNREACHABLE, Outcome.TIMEOUT, Outcome.RESOLVE_FAILED})


@dataclass(frozen=True)
class ProbeTarget:
    name: str
    host: str
    port: int = 80
    path: str = "/"
    via: Via = Via.DIRECT
    proxy: str = ""  # "host:port"; empty: from HTTPS_PROXY (connect) / HTTP_PROXY (http)
    tls: bool = False  # speak TLS to the origin (direct, or inside a CONNECT tunnel)


@dataclass(frozen=True)
class ProbeResult:
    name: str
    outcome: Outcome
    seconds: float
    status: int | None = None
    reason: str = ""  # the proxy's X-Egress-Reason, when it refused
    body: str = ""  # the first bytes of the answer's body
    detail: str = ""  # the exception, for anything not answered

    def describe(self) -> str:
        extra = f" {self.status}" if self.status is not None else ""
        extra += f" {self.reason}" if self.reason else ""
        extra += f" ({self.detail})" if self.detail else ""
        return f"{self.name}: {self.outcome.value}{extra} in {self.seconds:.2f}s"


PROBE_SCRIPT = r"""
import errno, json, os, socket, ssl, sys, threading, time

args = json.loads(sys.argv[1])
deadline_s = float(args["timeout"])

def resolve(host, port, budget):
    box = {}
    def work():
        try:
            box["v"] = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
        except Exception as exc:
            box["e"] = exc
    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(budget)
    if "v" in box:
        return box["v"][0][4]
    raise LookupError(str(box.get("e", "no answer within %.1fs" % budget)))

def head(sock, end):
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536:
        sock.settimeout(max(0.05, end - time.monotonic()))
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data

def parse(data):
    text = data.decode("latin-1")
    top, _, body = text.partition("\r\n\r\n")
    lines = top.split("\r\n")
    status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else None
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, body

def rest(sock, end, have):
    while len(have) < 4096 and time.monotonic() < end:
        sock.settimeout(max(0.05, end - time.monotonic()))
        try:
            chunk = sock.recv(4096)
        except socket.timeout:
            break
        if not chunk:
            break
        have += chunk
    return have

def tls(sock, host, end):
    ctx = ssl.create_default_context(cadata=args.get("cadata") or None)
    sock.settimeout(max(0.05, end - time.monotonic()))
    return ctx.wrap_socket(sock, server_hostname=host)

def proxy_addr(t):
    p = t.get("proxy") or ""
    if not p:
        var = "HTTPS_PROXY" if t["via"] == "connect" else "HTTP_PROXY"
        p = os.environ.get(var) or os.environ.get(var.lower()) or ""
    p = p.split("://", 1)[-1].rstrip("/")
    if not p:
        return None
    h, _, port = p.rpartition(":")
    return h, int(port)

def one(t):
    start = time.monotonic()
    end = start + deadline_s
    r = {"name": t["name"]}
    try:
        if t["via"] == "direct":
            addr = resolve(t["host"], t["port"], end - time.monotonic())
        else:
            pa = proxy_addr(t)
            if pa is None:
                r["outcome"] = "no_proxy"
                return r
            addr = resolve(pa[0], pa[1], end - time.monotonic())
        sock = socket.create_connection(addr, timeout=max(0.05, end - time.monotonic()))
        with sock:
            hostport = "%s:%d" % (t["host"], t["port"])
            get = "GET %s HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n"
            get += "User-Agent: egress-probe\r\n\r\n"
            if t["via"] == "connect":
                connect = "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (hostport, hostport)
                sock.sendall(connect.encode())
                data = head(sock, end)
                status, headers, body = parse(data)
                if status != 200:
                    text = rest(sock, end, body.encode("latin-1"))[:200].decode("latin-1")
                    reason = headers.get("x-egress-reason", "")
                    r.update(outcome="proxy_refused", status=status, reason=reason, body=text)
                    return r
                if t.get("tls"):
                    sock = tls(sock, t["host"], end)
                sock.sendall((get % (t["path"], hostport)).encode())
            elif t["via"] == "http":
                url = "http://%s%s" % (hostport, t["path"])
                sock.sendall((get % (url, hostport)).encode())
            else:
                if t.get("tls"):
                    sock = tls(sock, t["host"], end)
                sock.sendall((get % (t["path"], hostport)).encode())
            data = head(sock, end)
            if not data:
                r.update(outcome="error", detail="connection closed without an answer")
                return r
            status, headers, body = parse(data)
            body = rest(sock, end, body.encode("latin-1")).decode("latin-1")
            if t["via"] != "direct" and "x-egress-reason" in headers:
                reason = headers["x-egress-reason"]
                r.update(outcome="proxy_refused", status=status, reason=reason, body=body[:200])
            else:
                r.update(outcome="answered", status=status, body=body[:200])
    except LookupError as exc:
        r.update(outcome="resolve_failed", detail=str(exc)[:200])
    except ssl.SSLError as exc:
        r.update(outcome="error", detail="TLS: %s" % str(exc)[:200])
    except socket.timeout:
        r.update(outcome="timeout", detail="no answer within %.1fs" % deadline_s)
    except ConnectionRefusedError as exc:
        r.update(outcome="refused", detail=str(exc)[:200])
    except OSError as exc:
        if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EACCES, errno.EPERM):
            r.update(outcome="unreachable", detail=str(exc)[:200])
        elif isinstance(exc, TimeoutError):
            r.update(outcome="timeout", detail="no answer within %.1fs" % deadline_s)
        else:
            r.update(outcome="error", detail="%s: %s" % (type(exc).__name__, str(exc)[:200]))
    except Exception as exc:
        r.update(outcome="error", detail="%s: %s" % (type(exc).__name__, str(exc)[:200]))
    finally:
        r["seconds"] = round(time.monotonic() - start, 3)
    return r

for t in args["targets"]:
    print(json.dumps(one(t)), flush=True)
"""


Execute = Callable[[Sequence[str]], Awaitable[str]]


def probe_argv(
    targets: Sequence[ProbeTarget], *, timeout: float = 3.0, cadata: str = ""
) -> list[str]:
    """The command that runs the probe inside a sandbox (``python3`` must be on its PATH).
    ``cadata``: PEM certificates TLS targets are verified against (default: the image's).
    Isolated (``-I``): a ``usercustomize`` or ``PYTHON*`` variable in the sandbox could
    otherwise answer for the probe."""
    payload = {"timeout": timeout, "cadata": cadata, "targets": [asdict(t) for t in targets]}
    return ["python3", "-I", "-c", PROBE_SCRIPT, json.dumps(payload)]


class ProbeOutputError(RuntimeError):
    """The probe did not report on every target (no python3, killed, ...)."""

    def __init__(self, missing: list[str], output: str) -> None:
        super().__init__(f"egress probe reported nothing for {missing}: {output[-300:]!r}")
        self.missing = missing
        self.output = output


def parse_results(output: str, targets: Sequence[ProbeTarget]) -> list[ProbeResult]:
    found: dict[str, ProbeResult] = {}
    for line in output.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            raw = json.loads(line)
            result = ProbeResult(
                name=str(raw["name"]),
                outcome=Outcome(raw.get("outcome", "error")),
                seconds=float(raw.get("seconds", 0.0)),
                status=raw.get("status"),
                reason=str(raw.get("reason", "")),
                body=str(raw.get("body", "")),
                detail=str(raw.get("detail", "")),
            )
        except (ValueError, KeyError, TypeError):
            continue
        found[result.name] = result
    missing = [t.name for t in targets if t.name not in found]
    if missing:
        raise ProbeOutputError(missing, output)
    return [found[t.name] for t in targets]


async def run_probe(
    execute: Execute,
    targets: Sequence[ProbeTarget],
    *,
    timeout: float = 3.0,  # noqa: ASYNC109
    cadata: str = "",
) -> list[ProbeResult]:
    """Run every target once inside the sandbox behind ``execute``; results in target order."""
    if not targets:
        return []
    output = await execute(probe_argv(targets, timeout=timeout, cadata=cadata))
    return parse_results(output, targets)


@dataclass(frozen=True)
class Expectation:
    """One expectation about one result, and whether it held."""

    name: str
    expected: str
    ok: bool
    result: ProbeResult

    def describe(self) -> str:
        mark = "ok" if self.ok else "FAILED"
        return f"[{mark}] expected {self.expected}; got {self.result.describe()}"


def expect_blocked(result: ProbeResult, *, within: float) -> Expectation:
    """Nothing got through, and the attempt ended within ``within`` seconds."""
    ok = result.outcome in BLOCKED and result.seconds <= within
    return Expectation(result.name, f"blocked within {within:.1f}s", ok, result)


def expect_answered(result: ProbeResult, *, body_contains: str = "") -> Expectation:
    ok = result.outcome is Outcome.ANSWERED and body_contains in result.body
    want = "answered" + (f" with {body_contains!r}" if body_contains else "")
    return Expectation(result.name, want, ok, result)


def expect_proxy_refused(
    result: ProbeResult, *, status: int = 403, reason: str | None = None
) -> Expectation:
    ok = result.outcome is Outcome.PROXY_REFUSED and result.status == status
    if reason is not None:
        ok = ok and result.reason == reason
    want = f"refused by the proxy with {status}" + (f" {reason}" if reason else "")
    return Expectation(result.name, want, ok, result)


def judge(expectations: Sequence[Expectation]) -> str:
    """A multi-line report; raise nothing (callers decide)."""
    return "\n".join(v.describe() for v in expectations)


def shell_quote(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


# ---- check-egress: the probe against a live Sandbox ------------------------------------------


def parse_target(value: str, name: str = "", via: Via = Via.DIRECT) -> ProbeTarget:
    """``host:port`` (port required) -> a target."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"not host:port: {value!r}")
    return ProbeTarget(name or value, host.strip("[]"), int(port), via=via)


def expectations_for(
    mode: str,
    results: dict[str, ProbeResult],
    *,
    deadline: float,
    body_contains: str = "",
) -> list[Expectation]:
    """What each probed target must have done under ``mode`` (names as :func:`targets_for`)."""
    within = deadline + 2.0
    out: list[Expectation] = []
    for name, r in results.items():
        kind = name.split(" ", 1)[0]
        if kind == "reachable":
            if mode == "unrestricted":
                out.append(expect_answered(r, body_contains=body_contains))
            else:
                out.append(expect_blocked(r, within=within))
        elif kind == "allowed":
            out.append(expect_answered(r, body_contains=body_contains))
        elif kind == "denied":
            out.append(expect_proxy_refused(r, status=403))
    return out


def targets_for(
    mode: str, reachable: Sequence[str], allowed: Sequence[str], denied: Sequence[str]
) -> list[ProbeTarget]:
    targets = [parse_target(v, f"reachable {v}") for v in reachable]
    if mode == "allowlist":
        for via in (Via.CONNECT, Via.HTTP):
            targets += [parse_target(v, f"allowed {v} {via.value}", via) for v in allowed]
            targets += [parse_target(v, f"denied {v} {via.value}", via) for v in denied]
    return targets


class _CannotProbe(Exception):
    """The Sandbox cannot be probed as asked (its message is printed as it is)."""


async def _probe_live_sandbox(args: argparse.Namespace) -> tuple[str, list[ProbeResult]]:
    """Read the Sandbox, run the probe in its pod over ``pods/exec``: (egress mode, results).

    The operator's own async client (kubernetes_asyncio, through ``kubeapi.new_api_client``:
    ``$KUBECONFIG``, else in-cluster), so ``check-egress`` needs nothing the operator does not
    install."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.stream import WsApiClient

    from sandbox_operator.kubeapi import new_api_client

    api = await new_api_client()
    ws_api = WsApiClient(configuration=api.configuration)
    try:
        obj: Any = await client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, args.namespace, SANDBOX_PLURAL, args.sandbox
        )
        view = SandboxView(obj)
        mode = view.egress_mode or "closed"
        served = view.status.served_by
        if served.kind != kubeobj.POD_KIND:
            raise _CannotProbe(f"sandbox {args.sandbox} is not served by a pod: {dict(served)}")
        targets = targets_for(mode, args.reachable, args.allowed, args.denied)
        if not targets:
            raise _CannotProbe(
                "nothing to probe: give --reachable (and --allowed/--denied for allowlist)"
            )
        within = len(targets) * (args.deadline + 2) + 30

        async def execute(command: Sequence[str]) -> str:
            return await asyncio.wait_for(
                pod_exec_output(ws_api, args.namespace, str(served["name"]), command), within
            )

        return mode, await run_probe(execute, targets, timeout=args.deadline)
    finally:
        await ws_api.close()
        await api.close()


async def pod_exec_output(ws_api: Any, namespace: str, pod: str, argv: Sequence[str]) -> str:
    """Run ``argv`` in the pod over ``pods/exec`` (``ws_api``: a kubernetes_asyncio
    ``WsApiClient``); its stdout and stderr, as they came, as text.

    The frames are read here rather than by the generated client, which would parse an output
    that happens to be one JSON document (the probe's report on a single target) and hand back
    its Python repr."""
    from aiohttp import WSMsgType
    from kubernetes_asyncio import client

    connect: Any = await client.CoreV1Api(ws_api).connect_get_namespaced_pod_exec(
        pod,
        namespace,
        command=list(argv),  # type: ignore[arg-type]  # one query parameter per item
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
        _preload_content=False,
    )
    out = bytearray()
    async with connect as ws:
        async for msg in ws:
            if msg.type is WSMsgType.BINARY and msg.data[:1] in (b"\x01", b"\x02"):
                out += msg.data[1:]
    return out.decode("utf-8", errors="replace")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sandbox_operator.egress.probe --namespace NS --sandbox NAME ...``: run the
    probe inside a live Sandbox's pod (through pods/exec, $KUBECONFIG or in-cluster) and check
    it against the Sandbox's ``spec.egress``. Exit 0 when every expectation held, 1 when one did
    not, 2 when the probe could not run."""
    parser = argparse.ArgumentParser(prog="python -m sandbox_operator.egress.probe")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--sandbox", required=True, help="Sandbox name")
    parser.add_argument(
        "--reachable",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a host an unrestricted pod reaches (closed/allowlist: blocked)",
    )
    parser.add_argument(
        "--allowed",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="allowlist: must answer through the proxy (CONNECT and HTTP)",
    )
    parser.add_argument(
        "--denied",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="allowlist: must be refused by the proxy with 403",
    )
    parser.add_argument("--body-contains", default="")
    parser.add_argument("--deadline", type=float, default=3.0)
    args = parser.parse_args(argv)  # fmt: skip

    try:
        mode, results = asyncio.run(_probe_live_sandbox(args))
    except _CannotProbe as exc:
        print(exc)
        return 2
    except (ValueError, ProbeOutputError) as exc:
        print(f"egress probe could not run: {exc}")
        return 2
    except Exception as exc:
        print(f"egress probe could not run: {type(exc).__name__}")
        return 2
    exps = expectations_for(
        mode, {r.name: r for r in results}, deadline=args.deadline,
        body_contains=args.body_contains,
    )  # fmt: skip
    print(f"sandbox {args.namespace}/{args.sandbox}: egress {mode}")
    print(judge(exps))
    return 0 if all(e.ok for e in exps) else 1


if __name__ == "__main__":
    import sys

    sys.exit(main())
