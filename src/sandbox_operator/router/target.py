"""The request target, parsed strictly: ``/<namespace>/<sandbox>/<port>/<rest>``.

Its own module because this is where a path or header trick would reach another pod, so the
rules are few and absolute: only the origin form (no absolute-form URI, no ``*``), no dot
segment and no empty segment anywhere in the path, no percent-encoded slash, backslash or dot,
no raw backslash or control character, and the three routing segments in the shapes Kubernetes
gives them. Whatever the routing segments say is the only route: the Host header is never read
for it. A refusal is a 400 before anything is looked up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from sandbox_operator.contract.ports import PORT_NAME_MAX_LENGTH, PORT_NAME_PATTERN

from .errors import bad_request

#: A namespace: a DNS label.
_NAMESPACE: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
#: A Sandbox name: a DNS subdomain.
_SANDBOX: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_PORT_NAME: Final = re.compile(PORT_NAME_PATTERN)
_PORT_NUMBER: Final = re.compile(r"[1-9][0-9]{0,4}")
#: Percent-encodings of '/', '\\' and '.', any case: decoded by some server, they would make a
#: segment the router did not judge.
_ENCODED_SEPARATOR: Final = re.compile(r"%(2f|5c|2e)", re.IGNORECASE)
_FORBIDDEN: Final = re.compile(r"[\x00-\x20\x7f\\#]")
#: Longest request target the router reads.
TARGET_MAX_LENGTH: Final = 8192


@dataclass(frozen=True)
class Route:
    """Where a request goes: a Sandbox's port, and the path the pod is asked for."""

    namespace: str
    sandbox: str
    #: The port as the path names it: a declared port's name, or its number.
    port: str
    #: What the pod is asked for: '/' and the rest of the path, with the query.
    upstream_target: str

    @property
    def prefix(self) -> str:
        return f"/{self.namespace}/{self.sandbox}/{self.port}"


def parse_target(target: str) -> Route:
    """The route of a request target; :class:`~.errors.Refusal` (400) for anything else."""
    if len(target) > TARGET_MAX_LENGTH:
        raise bad_request("the request target is too long")
    if not target.startswith("/") or target.startswith("//"):
        raise bad_request(
            "the request target must be a path (/<namespace>/<sandbox>/<port>/...): no "
            "absolute-form URI, authority or '*'"
        )
    if _FORBIDDEN.search(target):
        raise bad_request("the request target has a backslash, space, '#' or control character")
    path, query_mark, query = target.partition("?")
    if _ENCODED_SEPARATOR.search(path):
        raise bad_request("the path has a percent-encoded slash, backslash or dot")
    segments = path.split("/")[1:]
    if len(segments) < 3:
        raise bad_request("the path must be /<namespace>/<sandbox>/<port>/...")
    namespace, sandbox, port, rest = segments[0], segments[1], segments[2], segments[3:]
    inner = rest[:-1] if rest else rest  # a trailing '/' leaves one empty last segment
    if any(s in ("", ".", "..") for s in (namespace, sandbox, port, *inner)):
        raise bad_request("the path has an empty, '.' or '..' segment")
    if any(s in (".", "..") for s in rest):
        raise bad_request("the path has an empty, '.' or '..' segment")
    if not _NAMESPACE.fullmatch(namespace):
        raise bad_request("the namespace segment is not a namespace name")
    if len(sandbox) > 253 or not _SANDBOX.fullmatch(sandbox):
        raise bad_request("the sandbox segment is not a Sandbox name")
    named = len(port) <= PORT_NAME_MAX_LENGTH and _PORT_NAME.fullmatch(port)
    numbered = _PORT_NUMBER.fullmatch(port) and int(port) <= 65535
    if not (named or numbered):
        raise bad_request("the port segment is neither a port name nor a port number")
    upstream = "/" + "/".join(rest) + (query_mark + query)
    return Route(namespace, sandbox, port, upstream)
