"""Credentials the proxy attaches at the egress hop (``egressRules[].credential``, #38 item 3).

Its own module because it is the one place the proxy holds a secret value: where it is read
(a Kubernetes Secret, on demand, cached for a few seconds), when it may no longer be used (an
expiry annotation on the Secret), and what the header it fills looks like. Everything else in the
proxy sees only a :class:`CredentialRef` (a Secret's name and key, not secret) and, on failure, a
:class:`CredentialUnavailable` whose ``reason`` is the decision's: a request whose credential
cannot be attached is refused, never sent without it.

The value never leaves this module but as the header of the one upstream request it is for: not
in a decision record, a log line, an exception's message, an Event, a status or an error page.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from sandbox_operator.egress.decisions import DecisionReason

#: On a credential's Secret: when the grant stops being usable (RFC 3339, UTC). The proxy
#: refuses the origin's requests from then on (``CredentialExpired``), whatever it has cached.
EXPIRES_ANNOTATION: Final = "sandbox-operator.dev/credential-expires-at"
#: How long a read Secret is used before it is read again, and how long a missing one is
#: remembered as missing: a rotated or deleted Secret takes effect within this.
CACHE_SECONDS: Final = 5.0
MISSING_CACHE_SECONDS: Final = 2.0


@dataclass(frozen=True, slots=True)
class CredentialRef:
    """Which Secret value to attach, and as what header. No secret in it."""

    secret_name: str
    key: str
    header: str = "Authorization"
    prefix: str = "Bearer "


class CredentialUnavailable(Exception):
    """The credential cannot be attached; ``reason`` is the decision's. Never carries the value."""

    def __init__(self, reason: DecisionReason, why: str) -> None:
        super().__init__(why)
        self.reason = reason
        self.why = why


class CredentialSource(Protocol):
    """Where the proxy reads a credential's value, for a sandbox's namespace."""

    async def value(self, namespace: str, ref: CredentialRef) -> str:
        """The value, or raise :class:`CredentialUnavailable`."""
        ...


def header_value(ref: CredentialRef, value: str) -> str:
    """The header's value; refused when it could split or bend the request head. A value's
    trailing line end (a Secret made from a file) is not part of the credential."""
    text = ref.prefix + value.rstrip("\r\n")
    if not text or any(ord(c) < 0x20 or ord(c) == 0x7F for c in text) or not text.isascii():
        raise CredentialUnavailable(
            DecisionReason.CREDENTIAL_UNUSABLE,
            f"Secret {ref.secret_name!r} key {ref.key!r} is not a single-line ASCII header value",
        )
    return text


def parse_expiry(text: str | None) -> datetime | None:
    """The expiry annotation's time; an unreadable one counts as already expired."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class _Read:
    data: Mapping[str, str] | None  # None: the Secret does not exist
    expires: datetime | None
    at: float


def _from_secret(ref: CredentialRef, read: _Read, now: datetime) -> str:
    if read.data is None:
        raise CredentialUnavailable(
            DecisionReason.CREDENTIAL_MISSING, f"Secret {ref.secret_name!r} does not exist"
        )
    if read.expires is not None and read.expires <= now:
        raise CredentialUnavailable(
            DecisionReason.CREDENTIAL_EXPIRED, f"Secret {ref.secret_name!r} has expired"
        )
    encoded = read.data.get(ref.key)
    if encoded is None:
        raise CredentialUnavailable(
            DecisionReason.CREDENTIAL_MISSING,
            f"Secret {ref.secret_name!r} has no key {ref.key!r}",
        )
    try:
        value = base64.b64decode(encoded, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise CredentialUnavailable(
            DecisionReason.CREDENTIAL_UNUSABLE,
            f"Secret {ref.secret_name!r} key {ref.key!r} is not UTF-8",
        ) from None
    return value


class SecretCredentials:
    """Reads credentials from the namespace's Secrets: one ``get`` per Secret when it is first
    needed and again after :data:`CACHE_SECONDS` (a missing one after
    :data:`MISSING_CACHE_SECONDS`), never a list or a poll. ``read`` is the API call
    (``CoreV1Api.read_namespaced_secret``), handed in so tests can count it."""

    def __init__(
        self,
        read: Callable[[str, str], Any],
        *,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._read = read
        self._clock = clock
        self._now = now
        self._cache: dict[tuple[str, str], _Read] = {}
        self.reads = 0

    async def _fetch(self, namespace: str, name: str) -> _Read:
        self.reads += 1
        try:
            secret = await self._read(name, namespace)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return _Read(None, None, self._clock())
            raise CredentialUnavailable(
                DecisionReason.CREDENTIAL_UNREADABLE,
                f"Secret {name!r} could not be read ({type(exc).__name__} "
                f"{getattr(exc, 'status', '') or ''})".rstrip(),
            ) from None
        meta = getattr(secret, "metadata", None)
        annotations = getattr(meta, "annotations", None) or {}
        data = getattr(secret, "data", None) or {}
        return _Read(dict(data), parse_expiry(annotations.get(EXPIRES_ANNOTATION)), self._clock())

    async def value(self, namespace: str, ref: CredentialRef) -> str:
        key = (namespace, ref.secret_name)
        cached = self._cache.get(key)
        ttl = MISSING_CACHE_SECONDS if cached is not None and cached.data is None else CACHE_SECONDS
        if cached is None or self._clock() - cached.at >= ttl:
            cached = await self._fetch(namespace, ref.secret_name)
            self._cache[key] = cached
            while len(self._cache) > 4096:  # a bound, not a policy: oldest first
                self._cache.pop(next(iter(self._cache)))
        return _from_secret(ref, cached, self._now())


class StaticCredentials:
    """Values given in-process (tests, an embedding host): ``{(namespace, secret): data}`` with
    ``data`` as a Secret's (base64 values), and optional expiries per Secret."""

    def __init__(
        self,
        secrets: Mapping[tuple[str, str], Mapping[str, str]],
        expires: Mapping[tuple[str, str], datetime] | None = None,
    ) -> None:
        self.secrets = dict(secrets)
        self.expires = dict(expires or {})

    async def value(self, namespace: str, ref: CredentialRef) -> str:
        key = (namespace, ref.secret_name)
        data = self.secrets.get(key)
        read = _Read(dict(data) if data is not None else None, self.expires.get(key), 0.0)
        return _from_secret(ref, read, datetime.now(UTC))


class NoCredentials:
    """A proxy with nowhere to read Secrets (no ``--kube-namespace``): every credential is
    unavailable, so its origin's requests are refused."""

    async def value(self, namespace: str, ref: CredentialRef) -> str:
        raise CredentialUnavailable(
            DecisionReason.CREDENTIAL_UNREADABLE, "this proxy reads no Secrets"
        )
