"""An HTTP/1.1 request head: read within bounds, parsed strictly, and rewritten for the pod.

Its own module because the head is the other place a trick could hide (a second Host, a body
framed two ways, a token forwarded to the guest). The router reads one request per connection
and forwards the rest of the connection to the one pod and port it authorized, so a pipelined
second request or a WebSocket's frames can reach nothing else. The rewrite drops the caller's
``Authorization`` (the guest must never hold the caller's Kubernetes token), the client's own
``Forwarded``/``X-Forwarded-*`` claims, and puts the pod's address in ``Host``.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Final

from .errors import Refusal, bad_request

#: Most bytes of a request head (request line and headers).
HEAD_MAX_BYTES: Final = 32 * 1024
#: Most header lines.
HEADERS_MAX: Final = 100
_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_METHOD: Final = _TOKEN
#: Headers the router consumes or sets: never passed on as the client sent them.
_DROPPED: Final = frozenset(
    {
        "authorization",
        "host",
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-forwarded-prefix",
        "x-forwarded-port",
    }
)


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    headers: tuple[tuple[str, str], ...]

    def get(self, name: str) -> list[str]:
        """Every value of header ``name`` (case-insensitive), in order."""
        lowered = name.lower()
        return [v for k, v in self.headers if k.lower() == lowered]

    def bearer_token(self) -> str | None:
        """The caller's bearer token, or None when it sent none (or not one)."""
        values = self.get("authorization")
        if len(values) != 1:
            return None
        scheme, _, token = values[0].partition(" ")
        token = token.strip()
        return token if scheme.lower() == "bearer" and token else None

    def upgrade(self) -> bool:
        """Whether the client asks to switch protocols (a WebSocket)."""
        return any("upgrade" in v.lower() for v in self.get("connection"))


async def read_head(reader: asyncio.StreamReader) -> RequestHead:
    """The next request head on ``reader``; a :class:`~.errors.Refusal` for a malformed one
    (431 when too large)."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError as exc:
        raise Refusal(431, "HeadTooLarge", "the request head is too large") from exc
    except asyncio.IncompleteReadError as exc:
        raise bad_request("the connection closed inside the request head") from exc
    if len(raw) > HEAD_MAX_BYTES:
        raise Refusal(431, "HeadTooLarge", "the request head is too large")
    try:
        text = raw[:-4].decode("ascii")
    except UnicodeDecodeError as exc:
        raise bad_request("the request head is not ASCII") from exc
    return parse_head(text)


def parse_head(text: str) -> RequestHead:
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _METHOD.fullmatch(parts[0]) or parts[2] != "HTTP/1.1":
        raise bad_request("the request line must be '<method> <path> HTTP/1.1'")
    if len(lines) - 1 > HEADERS_MAX:
        raise Refusal(431, "HeadTooLarge", "the request has too many headers")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name) or any(c in value for c in "\r\n\x00"):
            raise bad_request("a header line is malformed (obsolete folding included)")
        headers.append((name, value.strip(" \t")))
    head = RequestHead(parts[0], parts[1], tuple(headers))
    if len(head.get("host")) != 1:
        raise bad_request("the request must have exactly one Host header")
    encodings = head.get("transfer-encoding")
    if encodings and head.get("content-length"):
        raise bad_request("the body is framed twice (Transfer-Encoding and Content-Length)")
    if encodings and [e.strip().lower() for e in ",".join(encodings).split(",")] != ["chunked"]:
        raise bad_request("Transfer-Encoding other than chunked alone is not forwarded")
    lengths = head.get("content-length")
    if lengths and (len(set(lengths)) != 1 or not lengths[0].isdigit()):
        raise bad_request("Content-Length is malformed or given twice")
    return head


def upstream_head(head: RequestHead, target: str, address: str, prefix: str) -> bytes:
    """The head sent to the pod: its own target and Host, the caller's token and forwarding
    claims dropped, the route's prefix in ``X-Forwarded-Prefix``. A request that is no upgrade
    asks the pod to close after its answer (``Connection: close``), so the caller's next request
    comes on a new connection, through the router's judgement and rewrite again."""
    upgrade = head.upgrade()
    dropped = _DROPPED if upgrade else _DROPPED | {"connection", "keep-alive"}
    lines = [f"{head.method} {target} HTTP/1.1", f"Host: {address}"]
    lines += [f"{k}: {v}" for k, v in head.headers if k.lower() not in dropped]
    if not upgrade:
        lines.append("Connection: close")
    lines.append(f"X-Forwarded-Prefix: {prefix}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
