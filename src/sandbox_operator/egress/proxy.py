"""The allowlist egress proxy: an asyncio HTTP forward proxy (CONNECT + absolute-form HTTP).

Order of checks for one connection (each failure answers and closes; each outcome is one
decision record):

1. connection caps (global, per client address) -> 503 TooManyConnections
2. request head read within ``header_timeout_seconds`` and ``max_header_bytes``
   -> 408 HeaderTimeout / 431 HeaderTooLarge / 400 BadRequest
3. sandbox identified (source IP and/or Proxy-Authorization) -> 403 UnknownSandbox /
   407 ProxyAuthRequired / 403 IdentityMismatch; per-sandbox cap -> 503 TooManyConnections
4. host and port on that sandbox's allowlist -> 403 HostNotAllowed / PortNotAllowed; for a host
   with method and path rules (``requestrules``): a CONNECT -> 403 TunnelNotInspectable, a plain
   request -> 403 MethodNotAllowed / PathNotAllowed, unclear body framing -> 400 BadRequest
5. name resolved once -> 502 ResolveFailed
6. addresses checked against the refused ranges -> 403 AddressRefused / MetadataAddressRefused
7. connect by number to an address that passed -> 502 ConnectFailed / 504 ConnectTimeout
8. ALLOW: tunnel (CONNECT) or forward one request with ``Connection: close``, then relay bytes
   until both sides finish, the connection is idle for ``idle_timeout_seconds`` or it has lasted
   ``max_connection_seconds``. To a ruled host only the judged request and its body go up
   (``framing``): nothing the client sends after it reaches the upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from sandbox_operator.egress.addresses import (
    AddressPolicy,
    IPAddress,
    ResolveError,
    Resolver,
    SystemResolver,
)
from sandbox_operator.egress.config import ProxyConfig, SandboxEgress
from sandbox_operator.egress.credentials import CredentialSource
from sandbox_operator.egress.decisions import (
    Decision,
    DecisionReason,
    DecisionSink,
    FanoutSink,
    RingBufferSink,
    now_utc,
    verdict_of,
)
from sandbox_operator.egress.framing import Framing, copy_body
from sandbox_operator.egress.http import (
    BadRequest,
    RequestHead,
    Target,
    parse_head,
    request_target,
    response,
    upstream_head,
)
from sandbox_operator.egress.identity import SandboxEntry, SandboxTable
from sandbox_operator.egress.inspected import Conn, RuledRequests, Upstream
from sandbox_operator.egress.opened import OpenConnection, OpenConnections
from sandbox_operator.egress.requestrules import RequestRule, for_scheme, rules_for

if TYPE_CHECKING:  # cryptography only where a CA is made (egress/__main__.py)
    from sandbox_operator.egress.interception import InterceptionCA

log = logging.getLogger(__name__)

_STATUS: dict[DecisionReason, int] = {
    DecisionReason.HOST_NOT_ALLOWED: 403,
    DecisionReason.PORT_NOT_ALLOWED: 403,
    DecisionReason.ADDRESS_REFUSED: 403,
    DecisionReason.METADATA_REFUSED: 403,
    DecisionReason.UNKNOWN_SANDBOX: 403,
    DecisionReason.IDENTITY_MISMATCH: 403,
    DecisionReason.AUTH_REQUIRED: 407,
    DecisionReason.TOO_MANY_CONNECTIONS: 503,
    DecisionReason.BAD_REQUEST: 400,
    DecisionReason.HEADER_TOO_LARGE: 431,
    DecisionReason.HEADER_TIMEOUT: 408,
    DecisionReason.RESOLVE_FAILED: 502,
    DecisionReason.CONNECT_FAILED: 502,
    DecisionReason.CONNECT_TIMEOUT: 504,
    DecisionReason.METHOD_NOT_ALLOWED: 403,
    DecisionReason.PATH_NOT_ALLOWED: 403,
    DecisionReason.NOT_INSPECTABLE: 403,
    DecisionReason.SCHEME_NOT_ALLOWED: 403,
    DecisionReason.HOST_MISMATCH: 403,
    DecisionReason.UPSTREAM_TLS_FAILED: 502,
    DecisionReason.CREDENTIAL_MISSING: 403,
    DecisionReason.CREDENTIAL_EXPIRED: 403,
    DecisionReason.CREDENTIAL_UNREADABLE: 403,
    DecisionReason.CREDENTIAL_UNUSABLE: 403,
}

_RELAY_CHUNK = 65536


class _Idle(Exception):
    pass


def _peer_ip(writer: asyncio.StreamWriter) -> IPAddress | None:
    peer = writer.get_extra_info("peername")
    if not peer:
        return None
    try:
        return ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    except ValueError:
        return None


class EgressProxy:
    """One proxy listener serving many sandboxes, each with its own allowlist.

    Run it in the operator's event loop (``await proxy.start()``) or as its own process
    (``python -m sandbox_operator.egress``). The sandbox table is changed with
    ``upsert_sandbox`` / ``remove_sandbox`` / ``replace_sandboxes`` from the same loop.
    Every decision goes to ``proxy.decisions`` (a ring buffer) and to the ``sink`` given.
    """

    def __init__(
        self,
        config: ProxyConfig,
        *,
        sink: DecisionSink | None = None,
        resolver: Resolver | None = None,
        interception: InterceptionCA | None = None,
        credentials: CredentialSource | None = None,
    ) -> None:
        self.config = config
        self.table = SandboxTable(config.sandboxes)
        self.decisions = RingBufferSink(config.decision_buffer)
        self._sink = FanoutSink([self.decisions] + ([sink] if sink is not None else []))
        self._resolver: Resolver = resolver if resolver is not None else SystemResolver()
        self._policy = self._address_policy(config)
        self._seq = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._active = 0
        self._active_by_sandbox: dict[str, int] = {}
        self._active_by_client: dict[str, int] = {}
        self.opened = OpenConnections()  # past the allowlist: closed when an edit disallows
        # Without a CA a CONNECT to a ruled host is refused (TunnelNotInspectable).
        self.ruled = RuledRequests(
            emit=self._emit,
            refuse=self._refuse,
            relay=self._relay,
            ca=interception,
            header_timeout=lambda: self.config.limits.header_timeout_seconds,
            connect_timeout=lambda: self.config.limits.connect_timeout_seconds,
            credentials=credentials,
        )

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> tuple[str, int]:
        """Listen; returns the bound (host, port) (port 0 in the config picks a free one)."""
        self._server = await asyncio.start_server(
            self._accept,
            host=self.config.listen_host,
            port=self.config.listen_port,
            limit=self.config.limits.max_header_bytes,
            backlog=1024,
        )
        sockname = self._server.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("proxy not started")
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> EgressProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- what the operator changes ---------------------------------------------------------

    def upsert_sandbox(self, sandbox: SandboxEgress) -> None:
        """Add or change one sandbox (raises IdentityConflict; the table is then unchanged).

        Raises ValueError when the sandbox lacks what the identity mode needs (source IPs for
        ``sourceIP``, a token digest for ``token``).
        """
        ProxyConfig.model_validate(
            {"identity": self.config.identity, "sandboxes": [sandbox]}
        )  # the same per-sandbox checks as a config file gets
        self.table.upsert(sandbox)
        entry = self.table.get(sandbox.id)
        closing = self.opened.disallowed(entry, self.config.allowed_ports) if entry else []
        for conn in closing:  # a narrowed allowlist: what it no longer allows ends now
            conn.task.cancel()
        if closing:
            log.info(
                "sandbox %s: %d connections closed by its new allowlist", sandbox.id, len(closing)
            )

    def remove_sandbox(self, sandbox_id: str, *, forget_counts: bool = True) -> bool:
        """Forget a sandbox; new connections from its IP are refused (UnknownSandbox).

        Its per-verdict counters go too (read ``decisions.summary`` first if it is still
        wanted), so a long-running proxy does not grow with every sandbox it ever served.
        Connections already open run on until they end or time out.
        """
        if forget_counts:
            self.decisions.forget(sandbox_id)
        return self.table.remove(sandbox_id)

    def replace_sandboxes(self, sandboxes: Iterable[SandboxEgress]) -> None:
        self.table.replace(sandboxes)

    def reconfigure(self, config: ProxyConfig) -> None:
        """Apply a new config (all but the listen address) to new connections."""
        self.table.replace(config.sandboxes)
        self._policy = self._address_policy(config)
        self.config = config

    def active_connections(self, sandbox_id: str | None = None) -> int:
        if sandbox_id is None:
            return self._active
        return self._active_by_sandbox.get(sandbox_id, 0)

    @staticmethod
    def _address_policy(config: ProxyConfig) -> AddressPolicy:
        return AddressPolicy(
            refused_networks=config.refused_networks,
            admitted_networks=config.admitted_networks,
            metadata_networks=config.metadata_networks,
        )

    # ---- decisions -------------------------------------------------------------------------

    def _emit(self, conn: Conn, reason: DecisionReason, address: IPAddress | None = None) -> None:
        decision = Decision(
            seq=next(self._seq),
            time=now_utc(),
            verdict=verdict_of(reason),
            reason=reason,
            sandbox=conn.sandbox,
            host=conn.host,
            port=conn.port,
            method=conn.method,
            address=str(address) if address is not None else None,
            client=str(conn.client) if conn.client is not None else None,
        )
        try:
            self._sink.emit(decision)
        except Exception:  # a sink must never take a connection down
            log.exception("decision sink failed")

    async def _refuse(
        self,
        writer: asyncio.StreamWriter,
        conn: Conn,
        reason: DecisionReason,
        body: str,
        address: IPAddress | None = None,
    ) -> None:
        self._emit(conn, reason, address)
        extra: tuple[tuple[str, str], ...] = ()
        if reason is DecisionReason.AUTH_REQUIRED:
            extra = (("Proxy-Authenticate", 'Basic realm="sandbox-egress"'),)
        text = f"egress refused ({reason}): {body}\n"
        with contextlib.suppress(OSError, RuntimeError):
            writer.write(response(_STATUS[reason], str(reason), text, extra))
            async with asyncio.timeout(5):
                await writer.drain()

    # ---- one connection --------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._active += 1
        conn = Conn(client=_peer_ip(writer))
        client_key = str(conn.client)
        self._active_by_client[client_key] = self._active_by_client.get(client_key, 0) + 1
        try:
            await self._handle(reader, writer, conn)
        except asyncio.CancelledError:
            # Only stop() cancels these tasks, and it awaits them. Ending normally keeps the
            # stream machinery of Python 3.11 from logging each cancelled handler as an error.
            pass
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        except Exception:
            log.exception("egress connection failed")
        finally:
            self._active -= 1
            left = self._active_by_client.get(client_key, 1) - 1
            if left:
                self._active_by_client[client_key] = left
            else:
                self._active_by_client.pop(client_key, None)
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1):
                    await writer.wait_closed()

    async def _handle(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: Conn
    ) -> None:
        cfg = self.config
        limits = cfg.limits
        ip_entry = self.table.by_ip(conn.client)
        conn.sandbox = ip_entry.id if ip_entry is not None else None
        if self._active > limits.max_connections:
            await self._refuse(writer, conn, DecisionReason.TOO_MANY_CONNECTIONS, "proxy is full")
            return
        # Counted from accept, so connections still sending their head (slowloris) count too.
        if self._active_by_client.get(str(conn.client), 0) > limits.max_connections_per_client:
            await self._refuse(
                writer,
                conn,
                DecisionReason.TOO_MANY_CONNECTIONS,
                "too many open connections from this address",
            )
            return

        # 2. the request head, bounded in size and in total time (slowloris)
        try:
            async with asyncio.timeout(limits.header_timeout_seconds):
                raw = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            await self._refuse(
                writer, conn, DecisionReason.HEADER_TIMEOUT, "request head not received in time"
            )
            return
        except asyncio.LimitOverrunError:
            await self._refuse(
                writer,
                conn,
                DecisionReason.HEADER_TOO_LARGE,
                f"request head exceeds {limits.max_header_bytes} bytes",
            )
            return
        except asyncio.IncompleteReadError as exc:
            if exc.partial.strip():
                self._emit(conn, DecisionReason.BAD_REQUEST)
            return  # closed before a full head: nothing to answer
        try:
            head = parse_head(raw)
            conn.method = head.method
            target = request_target(head)
        except BadRequest as exc:
            await self._refuse(writer, conn, DecisionReason.BAD_REQUEST, exc.why)
            return
        conn.host, conn.port = target.host, target.port

        # 3. which sandbox
        who = self.table.identify(cfg.identity, conn.client, head.header("Proxy-Authorization"))
        if who.entry is not None:
            conn.sandbox = who.entry.id
        if who.entry is None or who.reason is not DecisionReason.ALLOWED:
            await self._refuse(
                writer, conn, who.reason, "this connection is not from a known sandbox"
            )
            return
        entry = who.entry
        if self._active_by_sandbox.get(entry.id, 0) >= limits.max_connections_per_sandbox:
            await self._refuse(
                writer,
                conn,
                DecisionReason.TOO_MANY_CONNECTIONS,
                "this sandbox has too many open connections",
            )
            return
        self._active_by_sandbox[entry.id] = self._active_by_sandbox.get(entry.id, 0) + 1
        try:
            await self._serve(reader, writer, conn, head, target, entry)
        finally:
            left = self._active_by_sandbox.get(entry.id, 1) - 1
            if left:
                self._active_by_sandbox[entry.id] = left
            else:
                self._active_by_sandbox.pop(entry.id, None)

    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        conn: Conn,
        head: RequestHead,
        target: Target,
        entry: SandboxEntry,
    ) -> None:
        cfg = self.config
        shown = f"{target.host}:{target.port}"

        # 4. allowlist
        verdict = entry.check(target.host, target.port, cfg.allowed_ports)
        if verdict is not DecisionReason.ALLOWED:
            what = "port" if verdict is DecisionReason.PORT_NOT_ALLOWED else "host"
            await self._refuse(
                writer, conn, verdict, f"{what} of {shown} is not on this sandbox's allowlist"
            )
            return
        rules = rules_for(entry.rules, target.host)
        task = asyncio.current_task()
        assert task is not None
        opened = OpenConnection(task, target.host, target.port, rules)
        self.opened.add(entry.id, opened)
        try:
            await self._serve_allowed((reader, writer), conn, (head, target), rules)
        finally:
            self.opened.discard(entry.id, opened)

    async def _serve_allowed(
        self,
        streams: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        conn: Conn,
        request: tuple[RequestHead, Target],
        rules: tuple[RequestRule, ...],
    ) -> None:
        """Steps 4 (a ruled host's request) to 8 for a host the sandbox's allowlist names (its
        connection registered in ``opened`` meanwhile)."""
        (reader, writer), (head, target) = streams, request
        limits = self.config.limits
        shown = f"{target.host}:{target.port}"
        framing: Framing | None = None
        intercept = False
        if rules and head.method == "CONNECT":
            intercept = self.ruled.intercepts(rules)
            if not intercept:
                await self.ruled.refuse_tunnel(writer, conn, target)
                return
        elif rules:
            judged = await self.ruled.judge(writer, conn, head, target, for_scheme(rules, "http"))
            if judged is None:
                return
            head, framing = judged

        # 5. resolve once
        try:
            literal: IPAddress | None = ipaddress.ip_address(target.host)
        except ValueError:
            literal = None
        if literal is not None:
            addresses: list[IPAddress] = [literal]
        else:
            try:
                async with asyncio.timeout(limits.connect_timeout_seconds):
                    addresses = list(await self._resolver.resolve(target.host, target.port))
            except (ResolveError, TimeoutError):
                await self._refuse(
                    writer, conn, DecisionReason.RESOLVE_FAILED, f"{target.host} does not resolve"
                )
                return

        # 6. refuse internal ranges
        usable, refused = self._policy.partition(addresses)
        if not usable:
            first = refused[0]
            reason = (
                DecisionReason.METADATA_REFUSED
                if first.metadata
                else DecisionReason.ADDRESS_REFUSED
            )
            await self._refuse(
                writer,
                conn,
                reason,
                f"{target.host} resolves only to addresses this proxy does not connect to",
                first.address,
            )
            return

        # 7. connect by number to a checked address
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        used: IPAddress | None = None
        timed_out = False
        try:
            async with asyncio.timeout(limits.connect_timeout_seconds):
                for addr in usable:
                    try:
                        upstream = await asyncio.open_connection(
                            str(addr), target.port, flags=socket.AI_NUMERICHOST
                        )
                        used = addr
                        break
                    except OSError:
                        continue
        except TimeoutError:
            timed_out = True
        if upstream is None or used is None:
            reason = DecisionReason.CONNECT_TIMEOUT if timed_out else DecisionReason.CONNECT_FAILED
            await self._refuse(writer, conn, reason, f"{shown} did not accept a connection")
            return
        up_reader, up_writer = upstream

        # 8. relay (or, for a ruled host over https, open the tunnel and judge inside)
        try:
            if intercept:
                await self.ruled.intercept(
                    reader, writer, conn, target, rules, Upstream(up_reader, up_writer, used)
                )
                return
            self._emit(conn, DecisionReason.ALLOWED, used)
            if head.method == "CONNECT":
                writer.write(response(200))
            else:
                up_writer.write(upstream_head(head, target))
            body = framing
            if body is None:
                await self._relay(reader, writer, up_reader, up_writer)
            else:
                await self._relay(
                    reader, writer, up_reader, up_writer, lambda: copy_body(reader, up_writer, body)
                )
        finally:
            up_writer.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1):
                    await up_writer.wait_closed()

    async def _relay(
        self,
        a_reader: asyncio.StreamReader,
        a_writer: asyncio.StreamWriter,
        b_reader: asyncio.StreamReader,
        b_writer: asyncio.StreamWriter,
        upward_only: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Relay both ways; ``upward_only`` replaces the client-to-upstream copy (one judged
        request's body, then nothing more)."""
        loop = asyncio.get_running_loop()
        idle = self.config.limits.idle_timeout_seconds
        last = [loop.time()]

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while True:
                try:
                    async with asyncio.timeout(idle):  # no extra task per read, unlike wait_for
                        data = await src.read(_RELAY_CHUNK)
                except TimeoutError:
                    if loop.time() - last[0] >= idle:
                        raise _Idle() from None
                    continue
                if not data:
                    if dst.can_write_eof():
                        with contextlib.suppress(OSError):
                            dst.write_eof()
                    return
                last[0] = loop.time()
                dst.write(data)
                await dst.drain()

        # Client EOF is a half-close (the upstream may still answer); upstream EOF, an error or
        # idleness in either direction ends the whole relay.
        up: Awaitable[None] = upward_only() if upward_only is not None else copy(a_reader, b_writer)
        upward: asyncio.Task[None] = asyncio.ensure_future(up)
        downward = asyncio.create_task(copy(b_reader, a_writer))
        tasks = [upward, downward]
        try:
            async with asyncio.timeout(self.config.limits.max_connection_seconds):
                pending: set[asyncio.Task[None]] = set(tasks)
                while pending:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    if downward in done or any(t.exception() is not None for t in done):
                        break
        except TimeoutError:
            pass
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
