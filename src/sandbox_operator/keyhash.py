"""The key's hashes: label-safe digests of a sandbox's key parts, shared by the labels the
operator puts on objects (:mod:`sandbox_operator.labels`) and the names it gives them
(:mod:`sandbox_operator.naming`). A module of its own so neither of those imports the other's
caller."""

from __future__ import annotations

import hashlib
from typing import Protocol

# 32 hex characters = 128 bits of SHA-256: collisions are not a practical concern, and the value
# stays well under the 63-character limit and starts/ends with an alphanumeric character.
_HASH_CHARS = 32


class KeyLike(Protocol):
    """Anything with the four key parts (the contract's SandboxKey satisfies it)."""

    @property
    def scope(self) -> str: ...

    @property
    def thread_id(self) -> str: ...

    @property
    def agent_dir(self) -> str: ...

    @property
    def call_id(self) -> str: ...


def _digest(domain: str, *parts: str) -> str:
    h = hashlib.sha256()
    h.update(domain.encode())
    for part in parts:
        raw = part.encode()
        # Length-prefix every part so ("ab", "c") and ("a", "bc") never hash alike.
        h.update(len(raw).to_bytes(8, "big"))
        h.update(raw)
    return h.hexdigest()


def hash_part(domain: str, *parts: str) -> str:
    """A label-safe hash of the given parts, separated by domain (e.g. "scope", "thread")."""
    return _digest(domain, *parts)[:_HASH_CHARS]
