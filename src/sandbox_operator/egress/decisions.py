"""Decision records and the sinks they go to.

A record says what the proxy decided about one connection attempt: which sandbox, which host and
port, when, the verdict and a machine-readable reason. It never carries a request path, query,
header value, credential or token: only what a Kubernetes Event may show to anyone who can read
the Sandbox.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import IO, Protocol, TypedDict


class Verdict(StrEnum):
    ALLOW = "ALLOW"
    DENY = "DENY"
    UNREACHABLE = "UNREACHABLE"


class DecisionReason(StrEnum):
    """Machine-readable reason; also sent to the client in the X-Egress-Reason header."""

    ALLOWED = "Allowed"
    HOST_NOT_ALLOWED = "HostNotAllowed"
    PORT_NOT_ALLOWED = "PortNotAllowed"
    ADDRESS_REFUSED = "AddressRefused"
    METADATA_REFUSED = "MetadataAddressRefused"
    UNKNOWN_SANDBOX = "UnknownSandbox"
    AUTH_REQUIRED = "ProxyAuthRequired"
    IDENTITY_MISMATCH = "IdentityMismatch"
    TOO_MANY_CONNECTIONS = "TooManyConnections"
    BAD_REQUEST = "BadRequest"
    HEADER_TOO_LARGE = "HeaderTooLarge"
    HEADER_TIMEOUT = "HeaderTimeout"
    RESOLVE_FAILED = "ResolveFailed"
    CONNECT_FAILED = "ConnectFailed"
    CONNECT_TIMEOUT = "ConnectTimeout"
    #: A request to a host with method or path rules (``egressRules``), refused by them.
    METHOD_NOT_ALLOWED = "MethodNotAllowed"
    PATH_NOT_ALLOWED = "PathNotAllowed"
    #: A CONNECT tunnel to a host whose rules do not cover https (or a proxy without an
    #: interception CA): the proxy cannot see inside it.
    NOT_INSPECTABLE = "TunnelNotInspectable"
    #: A plain http:// request to a host whose rules cover https only.
    SCHEME_NOT_ALLOWED = "SchemeNotAllowed"
    #: Inside an intercepted tunnel: a request naming another host than the CONNECT did.
    HOST_MISMATCH = "HostMismatch"
    #: Inside an intercepted tunnel: the guest did not complete TLS with the proxy (e.g. it
    #: does not trust the proxy's CA), or the upstream's certificate did not verify.
    CLIENT_TLS_FAILED = "ClientTLSFailed"
    UPSTREAM_TLS_FAILED = "UpstreamTLSFailed"
    #: Inside an intercepted tunnel, a request its rules let through whose credential
    #: (``egressRules[].credential``) cannot be attached: it is refused, never sent without it.
    #: The Secret or its key does not exist; its expiry annotation has passed; the proxy could
    #: not read it (forbidden, the API unreachable); its value cannot be a header value.
    CREDENTIAL_MISSING = "CredentialMissing"
    CREDENTIAL_EXPIRED = "CredentialExpired"
    CREDENTIAL_UNREADABLE = "CredentialUnreadable"
    CREDENTIAL_UNUSABLE = "CredentialUnusable"


VERDICT_OF: dict[DecisionReason, Verdict] = {
    DecisionReason.ALLOWED: Verdict.ALLOW,
    DecisionReason.RESOLVE_FAILED: Verdict.UNREACHABLE,
    DecisionReason.CONNECT_FAILED: Verdict.UNREACHABLE,
    DecisionReason.CONNECT_TIMEOUT: Verdict.UNREACHABLE,
    DecisionReason.UPSTREAM_TLS_FAILED: Verdict.UNREACHABLE,
}


def verdict_of(reason: DecisionReason) -> Verdict:
    return VERDICT_OF.get(reason, Verdict.DENY)


class DecisionLine(TypedDict):
    """A decision as :class:`JsonLinesSink` writes it: one JSON object per line, keys as here."""

    seq: int
    time: str
    verdict: str
    reason: str
    sandbox: str | None
    host: str
    port: int
    method: str
    address: str | None
    client: str | None


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision. ``host`` is "" when the request never named one (bad or slow request)."""

    seq: int
    time: datetime
    verdict: Verdict
    reason: DecisionReason
    sandbox: str | None  # None when the connection could not be attributed to a sandbox
    host: str
    port: int
    method: str  # "CONNECT", "GET", ...; "" when no request line was read
    address: str | None = None  # the address connected to (ALLOW) or refused (AddressRefused)
    client: str | None = None  # source address of the connection (a pod IP, not a secret)

    def as_dict(self) -> DecisionLine:
        return {
            "seq": self.seq,
            "time": self.time.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "verdict": str(self.verdict),
            "reason": str(self.reason),
            "sandbox": self.sandbox,
            "host": self.host,
            "port": self.port,
            "method": self.method,
            "address": self.address,
            "client": self.client,
        }

    def summary(self) -> str:
        """One human line, suitable as a Kubernetes Event message."""
        target = f"{self.host}:{self.port}" if self.host else "(no target)"
        where = f" via {self.address}" if self.address else ""
        return f"{self.verdict} {self.method or '-'} {target}{where}: {self.reason}"


class DecisionSink(Protocol):
    """Receives every decision, synchronously, on the proxy's event loop. Must not block."""

    def emit(self, decision: Decision) -> None: ...


class RingBufferSink:
    """The last ``capacity`` decisions, plus per-sandbox, per-verdict counters since start."""

    def __init__(self, capacity: int = 4096) -> None:
        self._buf: deque[Decision] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self.counts: dict[tuple[str | None, Verdict], int] = {}

    def emit(self, decision: Decision) -> None:
        with self._lock:
            self._buf.append(decision)
            key = (decision.sandbox, decision.verdict)
            self.counts[key] = self.counts.get(key, 0) + 1

    def records(self, sandbox: str | None = None, *, after_seq: int = 0) -> list[Decision]:
        """Buffered decisions with seq > after_seq; only ``sandbox``'s when it is given."""
        with self._lock:
            items = list(self._buf)
        return [d for d in items if d.seq > after_seq and (sandbox is None or d.sandbox == sandbox)]

    def forget(self, sandbox: str) -> None:
        """Drop a sandbox's counters (its buffered records age out with the ring)."""
        with self._lock:
            for verdict in Verdict:
                self.counts.pop((sandbox, verdict), None)

    def summary(self, sandbox: str) -> dict[str, int]:
        """{"ALLOW": n, "DENY": n, "UNREACHABLE": n} for the sandbox, counted since start."""
        with self._lock:
            return {str(v): self.counts.get((sandbox, v), 0) for v in Verdict}


class CallbackSink:
    """Calls ``callback(decision)``; an exception in the callback is counted, never raised."""

    def __init__(self, callback: Callable[[Decision], None]) -> None:
        self._callback = callback
        self.errors = 0

    def emit(self, decision: Decision) -> None:
        try:
            self._callback(decision)
        except Exception:
            self.errors += 1


class JsonLinesSink:
    """One JSON object per line (the pod's stdout when run as ``python -m``)."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def emit(self, decision: Decision) -> None:
        self._stream.write(json.dumps(decision.as_dict(), separators=(",", ":")) + "\n")
        self._stream.flush()


@dataclass
class FanoutSink:
    sinks: list[DecisionSink] = field(default_factory=list)

    def emit(self, decision: Decision) -> None:
        for sink in self.sinks:
            sink.emit(decision)


class RateLimiter:
    """Token bucket per key, for the operator's Event writer: ``allow(key)`` -> emit or not.

    Decisions are not dropped by the proxy; this only bounds how many become Kubernetes Events
    (the status summary counts them all).
    """

    def __init__(
        self, rate_per_second: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._rate = rate_per_second
        self._burst = float(burst)
        self._clock = clock
        self._state: dict[object, tuple[float, float]] = {}
        self.suppressed: dict[object, int] = {}

    def allow(self, key: object) -> bool:
        now = self._clock()
        tokens, last = self._state.get(key, (self._burst, now))
        tokens = min(self._burst, tokens + (now - last) * self._rate)
        if tokens >= 1.0:
            self._state[key] = (tokens - 1.0, now)
            return True
        self._state[key] = (tokens, now)
        self.suppressed[key] = self.suppressed.get(key, 0) + 1
        return False

    def forget(self, keys: Iterable[object]) -> None:
        for key in keys:
            self._state.pop(key, None)
            self.suppressed.pop(key, None)


def now_utc() -> datetime:
    return datetime.now(UTC)
