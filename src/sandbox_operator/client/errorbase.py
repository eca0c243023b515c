"""The root of the client's exception tree and the scrubbing its messages go through.

Kept apart from :mod:`sandbox_operator.client.errors` (the public face, which draws the whole
tree) so the acquire errors and the handle errors can both derive from it without importing
each other.
"""

from __future__ import annotations

import re

# --------------------------------------------------------------------------------------------
# Scrubbing


_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"]+")
_HOSTPORT = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b")
_SECRETISH = re.compile(
    r"(?i)\b(token|password|passwd|secret|authorization|bearer|api[_-]?key)\b\s*[:=]?\s*\S+"
)


def scrub(text: str) -> str:
    """Remove URLs, IP endpoints and credential-looking fragments from a message."""
    text = _URL.sub("<endpoint>", text)
    text = _HOSTPORT.sub("<endpoint>", text)
    text = _SECRETISH.sub(lambda m: f"{m.group(1)}=<redacted>", text)
    return text


# --------------------------------------------------------------------------------------------
# Base


class SandboxClientError(Exception):
    """Base of every error the client raises.

    A subclass declared as a dataclass gets its typed fields from the generated ``__init__`` and
    its message from :meth:`_message`, which :meth:`__post_init__` passes to ``Exception`` (so
    ``str()`` and ``args`` are what a hand-written ``__init__`` would give)."""

    def __post_init__(self) -> None:
        super().__init__(self._message())

    def _message(self) -> str:
        return ""
