"""Where one request's body ends, so the proxy forwards exactly one judged request.

Its own module because it is what keeps a judged request from carrying another one behind it:
for a host with method and path rules the proxy forwards the head it judged and that head's body
(``Content-Length`` bytes, or chunks up to the last chunk and its trailers), and nothing the
client sends after it, so a second request on the same connection (pipelined, or to another
``Host``) never reaches the upstream unjudged. A head whose framing two parsers could read
differently (both ``Content-Length`` and ``Transfer-Encoding``, two lengths, a coding other than
``chunked``) is refused as a bad request: that ambiguity is how requests are smuggled.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sandbox_operator.egress.http import BadRequest, RequestHead

_CHUNK_LINE_MAX = 4096
_COPY = 65536


@dataclass(frozen=True, slots=True)
class Framing:
    """``length`` bytes of body, or chunked (``length`` is then None)."""

    chunked: bool
    length: int | None


def body_framing(head: RequestHead) -> Framing:
    """How ``head``'s body is delimited (RFC 9112 6.3 for requests); BadRequest if unclear."""
    lengths = [v for k, v in head.headers if k.lower() == "content-length"]
    codings = [v for k, v in head.headers if k.lower() == "transfer-encoding"]
    if lengths and codings:
        raise BadRequest("both Content-Length and Transfer-Encoding")
    if codings:
        tokens = [t.strip().lower() for v in codings for t in v.split(",")]
        if tokens != ["chunked"]:
            raise BadRequest("a Transfer-Encoding other than chunked")
        return Framing(chunked=True, length=None)
    if len(lengths) > 1:
        raise BadRequest("more than one Content-Length")
    if lengths:
        text = lengths[0].strip()
        if not text.isdigit() or len(text) > 18:
            raise BadRequest("malformed Content-Length")
        return Framing(chunked=False, length=int(text))
    return Framing(chunked=False, length=0)


async def _copy_exactly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
    while n > 0:
        data = await reader.read(min(n, _COPY))
        if not data:
            raise asyncio.IncompleteReadError(b"", n)
        n -= len(data)
        writer.write(data)
        await writer.drain()


async def _line(reader: asyncio.StreamReader) -> bytes:
    try:
        line = await reader.readuntil(b"\r\n")
    except asyncio.LimitOverrunError:
        raise BadRequest("chunk line too long") from None
    if len(line) > _CHUNK_LINE_MAX:
        raise BadRequest("chunk line too long")
    return line


async def copy_body(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, framing: Framing
) -> None:
    """Forward exactly one body as framed, and not a byte more."""
    if not framing.chunked:
        await _copy_exactly(reader, writer, framing.length or 0)
        return
    while True:
        line = await _line(reader)
        size_text = line[:-2].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise BadRequest("malformed chunk size") from None
        if not size_text or size < 0 or any(c not in b"0123456789abcdefABCDEF" for c in size_text):
            raise BadRequest("malformed chunk size")
        writer.write(line)
        if size == 0:
            while True:  # trailers, then the empty line
                trailer = await _line(reader)
                writer.write(trailer)
                if trailer == b"\r\n":
                    await writer.drain()
                    return
        await _copy_exactly(reader, writer, size)
        end = await reader.readexactly(2)
        if end != b"\r\n":
            raise BadRequest("chunk not followed by CRLF")
        writer.write(end)
