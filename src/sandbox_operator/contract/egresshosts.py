"""What an ``egressAllow`` entry may name: a lower-case, fully qualified host name (``*.`` for
its subdomains), never an IP literal, a single label, or a cloud metadata or loopback name.

Its own module because these are static rules the same everywhere, carried three ways: the
pattern and the validator here, the CEL rules of the CRD (``crdrules.py``) and admission; the
egress proxy still refuses such addresses after resolving.
"""

from __future__ import annotations

import re
from typing import Annotated, Final

from pydantic import AfterValidator, Field

from .base import HOST_MAX_LENGTH

HOST_PATTERN: Final = (
    r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)

#: A host whose last label is all digits or ``0x`` hex is an IPv4 literal in one of the forms
#: resolvers accept (``169.254.169.254``, ``0x7f.1``); IPv6 literals never match HOST_PATTERN.
IP_LITERAL_PATTERN: Final = r"(^|\.)([0-9]+|0x[0-9a-f]*)$"
#: Names of cloud metadata services (and loopback): reaching one hands a sandbox the node's
#: credentials, so no allowlist may name one, or a wildcard that covers one. Single-label names
#: ("metadata", "instance-data", "localhost") are refused by the two-label rule already.
METADATA_HOSTS: Final[tuple[str, ...]] = (
    "metadata.google.internal",
    "metadata.goog",
    "instance-data.ec2.internal",
)
#: The reserved top-level domain that always means loopback (RFC 6761).
LOOPBACK_SUFFIX: Final = ".localhost"


def egress_host_problem(host: str) -> str | None:
    """Why ``host`` may not be an egressAllow entry, or None.

    Static rules, the same everywhere (the CRD carries them as CEL): an entry names a host by a
    fully qualified name, never an IP literal (a literal bypasses every name the host trusts and is
    how metadata endpoints are reached) and never a metadata or loopback name. The egress proxy
    still refuses such addresses after resolving; this refuses the ask before anything runs.
    """
    if "." not in host:
        return (
            f"{host!r} is a single-label name, resolved through the proxy's search domains "
            "(e.g. 'metadata', 'localhost'); name the host in full, e.g. pypi.org"
        )
    if re.search(IP_LITERAL_PATTERN, host):
        return f"{host!r} is an IP literal; name the host, e.g. pypi.org"
    if host in METADATA_HOSTS or host.endswith(LOOPBACK_SUFFIX):
        return f"{host!r} is a cloud metadata or loopback name"
    if host.startswith("*.") and any(m.endswith(host[1:]) for m in METADATA_HOSTS):
        return f"{host!r} would allow a cloud metadata name"
    return None


def _check_egress_host(value: str) -> str:
    problem = egress_host_problem(value)
    if problem is not None:
        raise ValueError(f"egressAllow entry {problem}")
    return value


EgressHost = Annotated[
    str,
    Field(
        min_length=1,
        max_length=HOST_MAX_LENGTH,
        pattern=HOST_PATTERN,
        description=(
            "A lower-case, fully qualified host name; a leading '*.' allows any subdomain. Not an "
            "IP literal, a single label, or a cloud metadata or loopback name."
        ),
    ),
    AfterValidator(_check_egress_host),
]
