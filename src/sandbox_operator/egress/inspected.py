"""Requests to a host with method and path rules: judged plain, or inside TLS the proxy ends.

Its own module because it is the proxy's second kind of hop: for a plain host the proxy decides
once per connection and relays bytes; for a ruled host it reads the request itself. A plain
``http://`` request is judged by the host's ``http`` rules; a CONNECT to a host whose rules name
``https`` is answered 200 and then TLS is terminated here with a leaf of the proxy's own CA
(``interception``), the one request inside is judged by the ``https`` rules (and must name the
host the CONNECT named), and it is sent on over a new TLS connection that verifies the upstream
in full. Only the judged request and its own body go upstream (``framing``), so neither a
pipelined request nor one to another ``Host`` on a kept-alive connection passes unjudged: the
proxy answers one request per connection, and ``Connection: close`` tells the guest so.

The proxy (``proxy.py``) hands in how it records a decision, refuses and relays, so the order of
checks and the one-record-per-connection rule stay its own.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from sandbox_operator.egress.addresses import IPAddress
from sandbox_operator.egress.credentials import (
    CredentialSource,
    CredentialUnavailable,
    NoCredentials,
    header_value,
)
from sandbox_operator.egress.decisions import DecisionReason
from sandbox_operator.egress.framing import Framing, body_framing, copy_body
from sandbox_operator.egress.hostmatch import InvalidHost, split_host_port
from sandbox_operator.egress.http import (
    BadRequest,
    RequestHead,
    Target,
    parse_head,
    response,
    upstream_head,
)
from sandbox_operator.egress.requestrules import (
    RequestRule,
    canonical_method,
    credential_for,
    for_scheme,
    judge,
)

if TYPE_CHECKING:  # cryptography only where a CA is made (egress/__main__.py)
    from sandbox_operator.egress.interception import InterceptionCA

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Conn:
    """What the proxy knows of one client connection, for its decision record."""

    client: IPAddress | None
    sandbox: str | None = None
    method: str = ""
    host: str = ""
    port: int = 0


Emit = Callable[[Conn, DecisionReason, IPAddress | None], None]
Refuse = Callable[[asyncio.StreamWriter, Conn, DecisionReason, str], Awaitable[None]]
Relay = Callable[
    [
        asyncio.StreamReader,
        asyncio.StreamWriter,
        asyncio.StreamReader,
        asyncio.StreamWriter,
        Callable[[], Awaitable[None]],
    ],
    Awaitable[None],
]


@dataclass(frozen=True, slots=True)
class Upstream:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    address: IPAddress


class RuledRequests:
    """Judges and forwards requests to ruled hosts for one proxy."""

    def __init__(
        self,
        *,
        emit: Emit,
        refuse: Refuse,
        relay: Relay,
        ca: InterceptionCA | None,
        header_timeout: Callable[[], float],
        connect_timeout: Callable[[], float],
        credentials: CredentialSource | None = None,
    ) -> None:
        self._emit = emit
        self._credentials: CredentialSource = credentials or NoCredentials()
        self._refuse = refuse
        self._relay = relay
        self.ca = ca
        self._header_timeout = header_timeout
        self._connect_timeout = connect_timeout

    def intercepts(self, rules: tuple[RequestRule, ...]) -> bool:
        """Whether a CONNECT to a host with these rules is opened and judged inside."""
        return self.ca is not None and bool(for_scheme(rules, "https"))

    async def refuse_tunnel(self, writer: asyncio.StreamWriter, conn: Conn, target: Target) -> None:
        await self._refuse(
            writer,
            conn,
            DecisionReason.NOT_INSPECTABLE,
            f"{target.host}:{target.port} has method or path rules this proxy does not judge "
            "inside a tunnel",
        )

    async def judge(
        self,
        writer: asyncio.StreamWriter,
        conn: Conn,
        head: RequestHead,
        target: Target,
        rules: tuple[RequestRule, ...],
    ) -> tuple[RequestHead, Framing] | None:
        """One request (``head``) to a ruled host under ``rules`` (those of its scheme): its head
        with the canonical method and its body's framing, or None once refused and recorded."""
        shown = f"{target.host}:{target.port}"
        method = canonical_method(head.method)
        conn.method = method
        if not rules:
            await self._refuse(
                writer,
                conn,
                DecisionReason.SCHEME_NOT_ALLOWED,
                f"{shown}'s egress rules do not cover this scheme",
            )
            return None
        reason = judge(rules, method, target.origin_form)
        if reason is not DecisionReason.ALLOWED:
            what = "method" if reason is DecisionReason.METHOD_NOT_ALLOWED else "path"
            await self._refuse(
                writer, conn, reason, f"this {what} is not allowed by {shown}'s egress rules"
            )
            return None
        try:
            framing = body_framing(head)
        except BadRequest as exc:
            await self._refuse(writer, conn, DecisionReason.BAD_REQUEST, exc.why)
            return None
        return replace(head, method=method), framing

    async def _attach(
        self,
        writer: asyncio.StreamWriter,
        conn: Conn,
        head: RequestHead,
        inner: Target,
        rules: tuple[RequestRule, ...],
    ) -> tuple[bool, tuple[str, str] | None]:
        """Whether the allowed request goes on, and the credential header it carries (None when
        its rule names none). A credential that cannot be attached fails closed: refused and
        recorded, (False, None)."""
        ref = credential_for(rules, head.method, inner.origin_form)
        if ref is None:
            return True, None
        namespace = (conn.sandbox or "").partition("/")[0]
        try:
            value = await self._credentials.value(namespace, ref)
            return True, (ref.header, header_value(ref, value))
        except CredentialUnavailable as exc:
            log.warning("sandbox %s: credential not attached: %s", conn.sandbox, exc.why)
            await self._refuse(
                writer,
                conn,
                exc.reason,
                f"{inner.host}:{inner.port}'s credential cannot be attached, so the request "
                "was not sent",
            )
            return False, None

    async def _inner_head(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: Conn
    ) -> RequestHead | None:
        try:
            async with asyncio.timeout(self._header_timeout()):
                raw = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            await self._refuse(
                writer, conn, DecisionReason.HEADER_TIMEOUT, "request head not received in time"
            )
            return None
        except asyncio.LimitOverrunError:
            await self._refuse(
                writer, conn, DecisionReason.HEADER_TOO_LARGE, "request head too large"
            )
            return None
        except (asyncio.IncompleteReadError, ssl.SSLError, ConnectionError):
            self._emit(conn, DecisionReason.BAD_REQUEST, None)
            return None
        try:
            return parse_head(raw)
        except BadRequest as exc:
            await self._refuse(writer, conn, DecisionReason.BAD_REQUEST, exc.why)
            return None

    async def intercept(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        conn: Conn,
        target: Target,
        rules: tuple[RequestRule, ...],
        upstream: Upstream,
    ) -> None:
        """The CONNECT was allowed and ``upstream`` is connected (TCP): answer 200, end TLS
        here, judge the one request inside, and send it on over verified TLS."""
        assert self.ca is not None
        writer.write(response(200))
        await writer.drain()
        try:
            async with asyncio.timeout(self._header_timeout()):
                await writer.start_tls(self.ca.server_context(target.host))
        except (ssl.SSLError, OSError, TimeoutError):
            self._emit(conn, DecisionReason.CLIENT_TLS_FAILED, None)
            return
        head = await self._inner_head(reader, writer, conn)
        if head is None:
            return
        conn.method = canonical_method(head.method)
        if head.method == "CONNECT" or not head.target.startswith("/"):
            await self._refuse(
                writer,
                conn,
                DecisionReason.BAD_REQUEST,
                "inside a tunnel a request names a path (origin form)",
            )
            return
        hosts = [v for k, v in head.headers if k.lower() == "host"]
        try:
            named = split_host_port(hosts[0], 443) if len(hosts) == 1 else None
        except InvalidHost:
            named = None
        if named != (target.host, target.port):
            await self._refuse(
                writer,
                conn,
                DecisionReason.HOST_MISMATCH,
                "the request's Host is not the host this tunnel was opened to",
            )
            return
        inner = Target(target.host, target.port, head.target)
        judged = await self.judge(writer, conn, head, inner, for_scheme(rules, "https"))
        if judged is None:
            return
        head, framing = judged
        sent, attach = await self._attach(writer, conn, head, inner, for_scheme(rules, "https"))
        if not sent:
            return
        try:
            async with asyncio.timeout(self._connect_timeout()):
                await upstream.writer.start_tls(
                    self.ca.upstream_context(), server_hostname=target.host
                )
        except (ssl.SSLError, OSError, TimeoutError):
            await self._refuse(
                writer,
                conn,
                DecisionReason.UPSTREAM_TLS_FAILED,
                f"{target.host}:{target.port} did not present a certificate that verifies",
            )
            return
        self._emit(conn, DecisionReason.ALLOWED, upstream.address)
        upstream.writer.write(upstream_head(head, inner, default_port=443, attach=attach))
        await self._relay(
            reader,
            writer,
            upstream.reader,
            upstream.writer,
            lambda: copy_body(reader, upstream.writer, framing),
        )
