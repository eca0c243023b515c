"""The little HTTP/1.x the proxy needs: parse a request head, build responses.

Strict on purpose: a request head the parser is unsure about is refused (400), never guessed at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from sandbox_operator.contract.egressrules import HOP_BY_HOP_HEADERS
from sandbox_operator.egress.hostmatch import InvalidHost, split_host_port

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_VERSION = re.compile(r"^HTTP/1\.[01]$")

HOP_BY_HOP = frozenset(HOP_BY_HOP_HEADERS)

STATUS_TEXT = {
    200: "Connection established",
    400: "Bad Request",
    403: "Forbidden",
    407: "Proxy Authentication Required",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class BadRequest(ValueError):
    """The request head is malformed or asks for something the proxy does not do."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass(frozen=True, slots=True)
class RequestHead:
    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]

    def header(self, name: str) -> str | None:
        name = name.lower()
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None


@dataclass(frozen=True, slots=True)
class Target:
    host: str  # normalised
    port: int
    origin_form: str  # "/path?query" for plain HTTP, "" for CONNECT


def parse_head(data: bytes) -> RequestHead:
    """Parse bytes up to and including the blank line that ends the head."""
    try:
        text = data.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise BadRequest("undecodable head") from None
    if not text.endswith("\r\n\r\n"):
        raise BadRequest("head does not end with CRLF CRLF")
    lines = text[:-4].split("\r\n")
    while lines and lines[0] == "":  # RFC 9112 2.2: ignore leading empty lines
        lines.pop(0)
    if not lines:
        raise BadRequest("empty request")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise BadRequest("request line is not 'METHOD TARGET VERSION'")
    method, target, version = parts
    if not _TOKEN.match(method) or not target or not _VERSION.match(version):
        raise BadRequest("malformed request line")
    if any(c in target for c in "\x00\r\n\t"):
        raise BadRequest("control character in request target")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t"):
            raise BadRequest("obsolete header line folding")
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.match(name):
            raise BadRequest("malformed header line")
        value = value.strip(" \t")
        if any(c in value for c in "\x00\r\n"):
            raise BadRequest("control character in header value")
        headers.append((name, value))
    return RequestHead(method, target, version, tuple(headers))


def request_target(head: RequestHead) -> Target:
    """Where the client wants to go: CONNECT authority (default port 443) or absolute http URL."""
    try:
        if head.method == "CONNECT":
            if "/" in head.target or "@" in head.target:
                raise BadRequest("CONNECT target must be host:port")
            host, port = split_host_port(head.target, 443)
            return Target(host, port, "")
        if not head.target.lower().startswith("http://"):
            if head.target.lower().startswith("https://"):
                raise BadRequest("https:// URLs must be tunnelled with CONNECT")
            raise BadRequest("not a proxy request: target must be an absolute http:// URL")
        url = urlsplit(head.target)
        if "@" in url.netloc:
            raise BadRequest("credentials in the URL are not forwarded")
        if not url.netloc:
            raise BadRequest("URL without host")
        host, port = split_host_port(url.netloc, 80)
        origin = url.path or "/"
        if url.query:
            origin += "?" + url.query
        return Target(host, port, origin)
    except InvalidHost as exc:
        raise BadRequest(f"bad host: {exc.why}") from None


def upstream_head(
    head: RequestHead,
    target: Target,
    default_port: int = 80,
    attach: tuple[str, str] | None = None,
) -> bytes:
    """The origin-form request sent upstream: hop-by-hop headers dropped, Host from the URL
    (with its port unless it is the scheme's ``default_port``), and ``attach`` (a credential's
    header and value) in place of every header of its name the client sent."""
    drop = set(HOP_BY_HOP) | {"host"}
    if attach is not None:
        drop.add(attach[0].lower())
    for key, value in head.headers:
        if key.lower() == "connection":
            drop.update(tok.strip().lower() for tok in value.split(",") if tok.strip())
    drop.discard("transfer-encoding")  # the body is passed through as is, framing included
    drop.discard("content-length")
    host = f"[{target.host}]" if ":" in target.host else target.host
    if target.port != default_port:
        host = f"{host}:{target.port}"
    lines = [f"{head.method} {target.origin_form} {head.version}", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in head.headers if k.lower() not in drop]
    if attach is not None:
        lines.append(f"{attach[0]}: {attach[1]}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def response(
    status: int,
    reason_code: str | None = None,
    body: str = "",
    extra: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """A complete response. Non-200 responses close the connection."""
    lines = [f"HTTP/1.1 {status} {STATUS_TEXT.get(status, 'Error')}"]
    if reason_code is not None:
        lines.append(f"X-Egress-Reason: {reason_code}")
    lines += [f"{k}: {v}" for k, v in extra]
    if status == 200:
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    payload = body.encode("utf-8")
    lines += [
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(payload)}",
        "Connection: close",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload
