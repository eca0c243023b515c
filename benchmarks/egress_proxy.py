"""Egress proxy benchmark: added latency per request and memory at N concurrent connections.

Three processes, all on 127.0.0.0/8: the client (this process), the proxy
(``python -m sandbox_operator.egress``, as in a pod) and the upstream HTTP and echo servers (this
script with ``--serve-upstream``), so "direct" and "through the proxy" both cross processes and
differ only by the proxy's hop. Prints:

- median / p90 latency of one HTTP request on a fresh connection, direct vs through the proxy
  (absolute-form GET), for a host given as an IP literal and as a name (getaddrinfo, /etc/hosts);
- the same for a CONNECT tunnel (connect + 200 + one 64-byte echo round trip);
- HTTPS: one GET direct, through a plain CONNECT tunnel (TLS end to end) and to a host whose
  egress rule names https (TLS terminated at the proxy, judged, re-originated with verification,
  #38 item 1), with the proxy process's CPU time per intercepted request;
- the proxy process's RSS idle and while it holds N concurrent tunnels (default 200).

Usage: .venv/bin/python benchmarks/egress_proxy.py [--requests 1000] [--concurrency 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from sandbox_operator.egress.interception import new_ca  # noqa: E402
from sandbox_operator.testing.egress import (  # noqa: E402
    connect_through,
    make_self_signed_cert,
    open_from,
    read_reply_head,
    start_echo_server,
    start_http_server,
)

SOURCE = "127.0.0.2"  # the benchmark's "sandbox" address
RULED = "127.0.0.3"  # a sandbox whose rule for the same host names https (intercepted)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def http_get(host: str, port: int, request: bytes, source: str | None) -> None:
    reader, writer = await open_from(host, port, source)
    writer.write(request)
    status, headers = await read_reply_head(reader)
    await reader.readexactly(int(headers["content-length"]))
    writer.close()
    if status != 200:
        raise RuntimeError(f"status {status}")


async def tunnel_echo(proxy_port: int | None, echo_port: int, payload: bytes) -> None:
    if proxy_port is None:
        reader, writer = await asyncio.open_connection("127.0.0.1", echo_port)
    else:
        reply = await connect_through(proxy_port, f"127.0.0.1:{echo_port}", source=SOURCE)
        if reply.status != 200:
            raise RuntimeError(f"status {reply.status}")
        reader, writer = reply.reader, reply.writer
    writer.write(payload)
    await reader.readexactly(len(payload))
    writer.close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def https_get(
    proxy_port: int | None, port: int, ctx: ssl.SSLContext, source: str = SOURCE
) -> None:
    """GET / over TLS to localhost: direct, or through a CONNECT tunnel of the proxy from
    ``source`` (SOURCE: a plain host, tunnelled; RULED: intercepted)."""
    host = "localhost"
    if proxy_port is None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    else:
        reply = await connect_through(proxy_port, f"{host}:{port}", source=source)
        if reply.status != 200:
            raise RuntimeError(f"status {reply.status}")
        reader, writer = reply.reader, reply.writer
    await writer.start_tls(ctx, server_hostname=host)
    writer.write(f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
    status, headers = await read_reply_head(reader)
    await reader.readexactly(int(headers["content-length"]))
    writer.close()
    if status != 200:
        raise RuntimeError(f"status {status}")


async def timed(n: int, op: Callable[[], Awaitable[None]]) -> list[float]:
    for _ in range(min(50, n)):  # warm-up
        await op()
    out: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        await op()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def fmt(name: str, direct: list[float], proxied: list[float]) -> str:
    d, p = statistics.median(direct), statistics.median(proxied)
    d90 = statistics.quantiles(direct, n=10)[-1]
    p90 = statistics.quantiles(proxied, n=10)[-1]
    return (
        f"{name:<34} direct median {d:7.0f} us (p90 {d90:6.0f})   proxy median {p:7.0f} us "
        f"(p90 {p90:6.0f})   added {p - d:6.0f} us"
    )


async def serve_upstream(cert_dir: Path) -> None:
    """Child mode: print the three ports (HTTP, echo, HTTPS with the certificate in
    ``cert_dir``), serve until stdin closes."""
    upstream = await start_http_server()
    echo = await start_echo_server()
    cert = make_self_signed_cert(cert_dir, ("localhost",))
    tls = await start_http_server(ssl_context=cert.server_context())
    print(upstream.port, echo.port, tls.port, flush=True)
    await asyncio.to_thread(sys.stdin.read)
    for server in (upstream, echo, tls):
        await server.close()


async def main(requests: int, concurrency: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="egress-bench-"))
    servers = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve-upstream", str(tmp),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert servers.stdout is not None and servers.stdin is not None
    http_port, echo_port, tls_port = map(int, (await servers.stdout.readline()).split())
    upstream_cert = (tmp / "cert.pem").read_text()
    ca_cert, ca_key = new_ca()
    (tmp / "ca.crt").write_bytes(ca_cert)
    (tmp / "ca.key").write_bytes(ca_key)
    roots = "".join(f"\n      {line}" for line in upstream_cert.strip().splitlines())
    cfg = tmp / "egress.yaml"
    cfg.write_text(
        "listenHost: 127.0.0.1\nlistenPort: 0\nadmittedNetworks: [127.0.0.1/32]\n"
        f"allowedPorts: [{http_port}, {echo_port}, {tls_port}]\n"
        f"limits: {{maxConnectionsPerSandbox: {concurrency + 10}}}\n"
        f"interception:\n  enabled: true\n  extraUpstreamRoots: |{roots}\n"
        f"sandboxes:\n  - id: bench/sbx\n    sourceIPs: [{SOURCE}]\n"
        "    allow: ['127.0.0.1', localhost]\n"
        # Another sandbox, whose rule for the same host names https: its tunnels are opened.
        f"  - id: bench/ruled\n    sourceIPs: [{RULED}]\n"
        "    rules: [{host: localhost, schemes: [https], methods: [GET]}]\n"
    )
    ready = tmp / "ready"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sandbox_operator.egress", "--config", str(cfg),
        "--ready-file", str(ready), "--ca-dir", str(tmp), stdout=asyncio.subprocess.DEVNULL,
        env=env,
    )  # fmt: skip
    try:
        for _ in range(200):
            if ready.exists():
                break
            await asyncio.sleep(0.05)
        proxy_port = int(ready.read_text())
        up = http_port
        direct_req = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"

        def via(host: str) -> bytes:
            return f"GET http://{host}:{up}/ HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()

        direct = await timed(requests, lambda: http_get("127.0.0.1", up, direct_req, None))
        lit = await timed(
            requests, lambda: http_get("127.0.0.1", proxy_port, via("127.0.0.1"), SOURCE)
        )
        name = await timed(
            requests, lambda: http_get("127.0.0.1", proxy_port, via("localhost"), SOURCE)
        )
        payload = b"x" * 64
        t_direct = await timed(requests, lambda: tunnel_echo(None, echo_port, payload))
        t_proxy = await timed(requests, lambda: tunnel_echo(proxy_port, echo_port, payload))
        print(f"egress proxy benchmark: {requests} sequential requests each, fresh connections")
        print(fmt("HTTP GET, host as IP literal", direct, lit))
        print(fmt("HTTP GET, host by name (getaddrinfo)", direct, name))
        print(fmt("CONNECT + 64 B echo round trip", t_direct, t_proxy))

        upstream_ctx = ssl.create_default_context(cadata=upstream_cert)
        guest_ctx = ssl.create_default_context(cadata=ca_cert.decode())
        s_direct = await timed(requests, lambda: https_get(None, tls_port, upstream_ctx))
        s_tunnel = await timed(requests, lambda: https_get(proxy_port, tls_port, upstream_ctx))
        cpu0 = cpu_seconds(proc.pid)
        s_inter = await timed(requests, lambda: https_get(proxy_port, tls_port, guest_ctx, RULED))
        cpu_per = (cpu_seconds(proc.pid) - cpu0) / (requests + min(50, requests))
        print(fmt("HTTPS GET, plain host (tunnel)", s_direct, s_tunnel))
        print(fmt("HTTPS GET, ruled host (intercepted)", s_direct, s_inter))
        extra = statistics.median(s_inter) - statistics.median(s_tunnel)
        print(
            f"intercepted over tunnelled: median +{extra:.0f} us; "
            f"proxy CPU per intercepted request {cpu_per * 1e3:.2f} ms"
        )

        idle = rss_kib(proc.pid)
        tunnels = await asyncio.gather(
            *(
                connect_through(proxy_port, f"127.0.0.1:{echo_port}", source=SOURCE)
                for _ in range(concurrency)
            )
        )
        if any(t.status != 200 for t in tunnels):
            raise RuntimeError("a tunnel was refused")
        for t in tunnels:
            t.writer.write(payload)
        await asyncio.gather(*(t.reader.readexactly(len(payload)) for t in tunnels))
        held = rss_kib(proc.pid)
        for t in tunnels:
            t.close()
        print(
            f"proxy RSS: idle {idle / 1024:.1f} MiB; with {concurrency} concurrent open tunnels "
            f"{held / 1024:.1f} MiB (+{(held - idle) / concurrency:.1f} KiB per connection)"
        )
    finally:
        proc.terminate()
        await proc.wait()
        servers.stdin.close()
        await servers.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--serve-upstream", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        asyncio.run(serve_upstream(args.serve_upstream))
        sys.exit(0)
    asyncio.run(main(min(args.requests, 20000), min(args.concurrency, 2000)))
