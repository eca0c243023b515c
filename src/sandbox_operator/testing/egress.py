"""Egress test kit: local upstream servers, self-signed certificates and proxy clients.

For exercising :mod:`sandbox_operator.egress` (the proxy, a sandbox's reach) on one machine:
servers to stand for "outside" hosts and clients that speak to the proxy from a chosen source
address, the way a sandbox's pod would. Everything listens on and connects to loopback addresses
(127.0.0.0/8) unless the caller passes another local address. Public and versioned with the
package (see docs/testing.md); used by this repository's tests and benchmarks as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import socket
import ssl
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sandbox_operator.egress.config import ProxyConfig, SandboxEgress


@dataclass
class LocalServer:
    """A running upstream; ``connections`` counts accepted connections, ``heads`` HTTP heads."""

    server: asyncio.Server
    port: int
    connections: int = 0
    heads: list[bytes] = field(default_factory=list)

    async def close(self) -> None:
        self.server.close()
        with contextlib.suppress(Exception):
            await self.server.wait_closed()


async def start_echo_server(host: str = "127.0.0.1") -> LocalServer:
    """Echoes every byte back until the client closes."""
    state: list[LocalServer] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state[0].connections += 1
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, 0, backlog=1024)
    state.append(LocalServer(server, server.sockets[0].getsockname()[1]))
    return state[0]


def loopback_proxy_config(
    sandbox_id: str, allow: tuple[str, ...], upstream_port: int
) -> ProxyConfig:
    """A proxy on 127.0.0.1 (any free port) serving one sandbox whose source is 127.0.0.1, with
    127.0.0.1/32 admitted so a local upstream is reachable; every other range stays refused."""
    return ProxyConfig.model_validate(
        {
            "listenHost": "127.0.0.1",
            "listenPort": 0,
            "allowedPorts": [80, 443, upstream_port],
            "admittedNetworks": ["127.0.0.1/32"],
            "sandboxes": [
                SandboxEgress.model_validate(
                    {"id": sandbox_id, "allow": allow, "sourceIPs": ["127.0.0.1"]}
                )
            ],
        }
    )


@contextlib.contextmanager
def serve_http_in_thread(
    body: bytes,
    *,
    host: str = "0.0.0.0",
    tls: ssl.SSLContext | None = None,
    backlog: int = 512,
    seen: list[list[tuple[str, str]]] | None = None,
    methods: tuple[str, ...] = ("GET",),
) -> Iterator[int]:
    """A blocking HTTP(S) server answering each of ``methods`` (GET by default; any other gets
    501) with 200 and ``body``, in a thread; yields its port.

    For "outside" hosts that pods reach: it runs beside the tests' event loops (and outside any),
    on every address of this machine by default. ``backlog`` lets hundreds of tunnels connect at
    once; handler threads are daemons, so a held connection never blocks shutdown. A request's
    own body (``Content-Length``) is read and dropped. ``methods=("GET", "POST")`` serves an
    origin that accepts POST, which a method rule's test needs (or a 405 would pass for the
    proxy's refusal). ``seen`` collects each request's headers as received (what the egress
    hop added, for one), never echoed back.
    """

    def answer(handler: http.server.BaseHTTPRequestHandler) -> None:
        if seen is not None:
            seen.append(list(handler.headers.items()))
        length = int(handler.headers.get("Content-Length") or 0)
        if length:
            handler.rfile.read(length)
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def quiet(handler: http.server.BaseHTTPRequestHandler, *args: object) -> None:
        pass

    members: dict[str, object] = {f"do_{method.upper()}": answer for method in methods}
    handler = type(
        "Handler", (http.server.BaseHTTPRequestHandler,), members | {"log_message": quiet}
    )

    class Server(http.server.ThreadingHTTPServer):
        request_queue_size = backlog
        daemon_threads = True

    server = Server((host, 0), handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def _http_handler(
    state: list[LocalServer], body: Callable[[bytes], bytes]
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state[0].connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    break
                state[0].heads.append(head)
                payload = body(head)
                close = b"connection: close" in head.lower()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                    + f"Content-Length: {len(payload)}\r\n".encode()
                    + (b"Connection: close\r\n" if close else b"")
                    + b"\r\n"
                    + payload
                )
                await writer.drain()
                if close:
                    break
        except OSError:
            pass
        finally:
            writer.close()

    return handle


async def start_http_server(
    host: str = "127.0.0.1",
    ssl_context: ssl.SSLContext | None = None,
    body: Callable[[bytes], bytes] = lambda head: b"hello from upstream\n",
) -> LocalServer:
    """A tiny HTTP/1.1 server (keep-alive unless the request says close), optionally TLS."""
    state: list[LocalServer] = []
    server = await asyncio.start_server(
        _http_handler(state, body), host, 0, ssl=ssl_context, backlog=1024
    )
    state.append(LocalServer(server, server.sockets[0].getsockname()[1]))
    return state[0]


@dataclass(frozen=True)
class SelfSignedCert:
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        return ctx

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.cert))
        return ctx


def make_self_signed_cert(directory: Path, names: tuple[str, ...]) -> SelfSignedCert:
    """A one-day P-256 certificate for ``names`` made with the openssl CLI."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    san = ",".join(f"DNS:{n}" for n in names)
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "1", "-subj", f"/CN={names[0]}", "-addext",
            f"subjectAltName={san}", "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return SelfSignedCert(cert, key)


@contextlib.asynccontextmanager
async def self_signed_cert(names: tuple[str, ...]) -> AsyncIterator[SelfSignedCert]:
    with tempfile.TemporaryDirectory(prefix="egress-cert-") as tmp:
        yield await asyncio.to_thread(make_self_signed_cert, Path(tmp), names)


@dataclass
class ProxyReply:
    status: int
    headers: dict[str, str]
    body: bytes
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        self.writer.close()


async def read_reply_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return status, headers


_IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)


async def open_from(
    host: str, port: int, source: str | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """open_connection from a chosen local address (a stand-in for a sandbox's pod IP).

    Binds with IP_BIND_ADDRESS_NO_PORT so the kernel picks the port at connect time, as for an
    unbound socket; a plain bind to port 0 gets slow once many TIME_WAIT sockets exist.
    """
    if source is None:
        return await asyncio.open_connection(host, port)
    sock = socket.socket(socket.AF_INET6 if ":" in source else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_IP, _IP_BIND_ADDRESS_NO_PORT, 1)
        sock.bind((source, 0))
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock)


async def proxy_request(
    proxy_port: int,
    request: bytes,
    *,
    proxy_host: str = "127.0.0.1",
    source: str | None = None,
    limit_seconds: float = 10.0,
) -> ProxyReply:
    """Send ``request`` (a complete head) to the proxy from ``source`` and read the reply head.

    Unless this is a 200 to CONNECT, the body (Content-Length) is read too and the connection
    closed; for a 200 to CONNECT the streams are left open for the tunnel.
    """
    async with asyncio.timeout(limit_seconds):
        reader, writer = await open_from(proxy_host, proxy_port, source)
        writer.write(request)
        await writer.drain()
        status, headers = await read_reply_head(reader)
        body = b""
        if status != 200 or not request.startswith(b"CONNECT "):
            length = headers.get("content-length")
            body = await (reader.readexactly(int(length)) if length else reader.read())
            writer.close()  # nothing more will come on this connection
        return ProxyReply(status, headers, body, reader, writer)


async def connect_through(
    proxy_port: int, authority: str, *, source: str | None = None, extra_headers: str = ""
) -> ProxyReply:
    return await proxy_request(
        proxy_port,
        f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{extra_headers}\r\n".encode(),
        source=source,
    )


async def get_through(
    proxy_port: int, url: str, *, source: str | None = None, extra_headers: str = ""
) -> ProxyReply:
    host = url.split("/", 3)[2]
    return await proxy_request(
        proxy_port,
        f"GET {url} HTTP/1.1\r\nHost: {host}\r\n{extra_headers}\r\n".encode(),
        source=source,
    )
