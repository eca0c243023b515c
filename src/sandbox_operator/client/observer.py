"""The observer seam: keyed, structured records of what a sandbox did, handed to the host.

A log line answers "something happened"; an audit question ("which conversation reached that
host, which host tools ran and under whose authority, what left the sandbox") needs records that
can be joined. This module defines them:

* nine frozen events, each joined by the :class:`~sandbox_operator.contract.SandboxKey` of the
  sandbox it concerns (or, for :class:`ScopeDisposed`, the conversation's ``(scope, thread_id)``)
  and by ``call``, the id of the tool call it happened in;
* :class:`SandboxObserver`, a base class with one do-nothing method per event: a host overrides
  the ones it wants and registers the instance (``SandboxClient(observer=...)``,
  ``HostToolRegistry(observer=...)``);
* :func:`notify`, the one way an event is delivered: with no observer nothing is built, and an
  observer that raises is logged (by exception class name) and otherwise ignored;
* the call context (:func:`tool_call`, :func:`current_call`): a tool body runs inside one, every
  event emitted inside it carries its id, and when it ends a :class:`ToolCallEnded` lists every
  key the call touched;
* :class:`EffectiveState`, what one served acquire actually got, as a value to keep beside a
  transcript.

Failures are always recorded as the exception's *class name*: a message can carry an endpoint,
a path or text the guest chose, and a record outlives the context that made it safe to show.
Observers run inline, on the thread and event loop that serve the call; they must not block.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType, TracebackType
from typing import Literal, Protocol, TypeAlias, TypeVar

from sandbox_operator.contract import DisposalFailure, SandboxKey

log = logging.getLogger(__name__)
T = TypeVar("T")

__all__ = [
    "EffectiveState",
    "EgressObserved",
    "EgressStreamEnded",
    "EgressWatermark",
    "Event",
    "HostToolCalled",
    "OutputsCollected",
    "SandboxAcquired",
    "SandboxDisposed",
    "SandboxObserver",
    "ScopeDisposed",
    "StoreFileRead",
    "ToolCallContext",
    "ToolCallEnded",
    "current_call",
    "failure_name",
    "notify",
    "record_key",
    "tool_call",
]


def failure_name(exc: BaseException | None) -> str | None:
    """What an event records for a failure: the exception's class name, never its message."""
    return None if exc is None else type(exc).__name__


# ---- effective state --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class EffectiveState:
    """What one served acquire got, as the operator reported it: posture, never payload.

    Built only for an acquire that succeeded (a refused one has its exception and a
    :class:`SandboxAcquired` carrying the refusal). It deliberately holds no sandbox key, no
    labels and nothing the model wrote, so it can be stored beside a transcript that is
    classified differently from the audit trail; ``call`` is its one identifier and joins it to
    the events of that call.

    * ``backend``: the backend that serves the sandbox (``status.backend``); ``None`` if the
      operator did not say.
    * ``isolation``: the isolation rung that backend declares (``status.isolation``), and
      ``isolation_floor`` the strictest floor it was admitted against.
    * ``isolation_scope``: the effective isolation scope (``conversation``, ``agent``, ``call``...).
    * ``served_by_kind`` / ``served_from``: what kind of object serves it and whether a warm pool
      did (``cold`` or ``SandboxWarmPool/<name>``).
    * ``egress`` and ``egress_allow``: the egress mode and, for an allowlist, the hosts judged at
      admission (what the proxy enforces), falling back to the spec's list.
    * ``capabilities_required``: what the spec asked for; ``capabilities_matched``: those the
      backend was admitted as serving (every required one, since admission refuses otherwise).
      ``capabilities_offered``: the backend's full declaration, ``None`` when the client cannot
      see it (the operator does not publish it on the Sandbox today).
    * ``host_tools``: the names a sealed host-tool registry carried when the acquire was served
      (empty when none was given).
    * ``call``: the tool call the acquire was served in, or ``None`` outside one.
    """

    backend: str | None
    isolation: str | None
    isolation_floor: str | None
    isolation_scope: str | None
    served_by_kind: str | None
    served_from: str | None
    egress: str
    egress_allow: tuple[str, ...]
    capabilities_required: tuple[str, ...]
    capabilities_matched: tuple[str, ...]
    capabilities_offered: tuple[str, ...] | None
    host_tools: tuple[str, ...]
    call: str | None


# ---- events -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SandboxAcquired:
    """An acquire finished, served or refused. ``refusal`` is the exception class name when it
    raised (including ``SandboxNotReadyInTime`` and a cancellation); ``state`` is the effective
    state when it was served, else ``None``. ``sandbox`` is the Sandbox resource's name.

    ``labels`` is the spec's ``labels``, verbatim, as a read-only copy taken when the event was
    built (a caller changing its own dict afterwards changes no record). They are here and not in
    :class:`EffectiveState` on purpose: they are the host's deployment vocabulary (a tenant, a
    cost centre), and an effective state is kept beside a transcript, which a host may send where
    that vocabulary must not go; here the host's own observer chooses the destination."""

    key: SandboxKey
    call: str | None
    sandbox: str
    namespace: str
    refusal: str | None
    state: EffectiveState | None
    seconds: float
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, kw_only=True)
class SandboxDisposed:
    """A delete of one Sandbox was issued (or failed: ``failure`` is the class name)."""

    key: SandboxKey
    call: str | None
    sandbox: str
    namespace: str
    failure: str | None


@dataclass(frozen=True, kw_only=True)
class ScopeDisposed:
    """The Sandboxes of one SandboxScope were disposed (``dispose_scope``, or ``delete_scope``
    with ``wait``). A scope disposal is answered with a count, not with the sandboxes, so there
    is no key: join on ``(scope, thread_id)``. Either is ``None`` when neither the SandboxScope
    nor any of its Sandboxes could be read to say it; ``scope_ref`` is the SandboxScope's name,
    always known. ``count`` is how many are gone; ``undisposed`` each that is not, with its
    ``DisposalCode``; ``failure`` the class name of an exception that stopped the call."""

    scope: str | None
    thread_id: str | None
    scope_ref: str
    namespace: str
    call: str | None
    count: int
    failure: str | None
    undisposed: tuple[DisposalFailure, ...] = ()


@dataclass(frozen=True, kw_only=True)
class EgressObserved:
    """One decision the egress proxy made about a sandbox's outbound connection, as it wrote it
    to ``status.egress.recent``. ``call`` is always ``None``: decisions are reported in batches
    that span whatever calls ran in between, so they anchor on the key alone.

    ``host``, ``port`` and ``method`` are what the *sandbox* asked for: guest-chosen text.
    ``seq`` is the decision's number in the proxy's counting window (``None`` from a proxy that
    does not number them); one client delivers a sandbox's decisions in that order, each once.
    ``missed_before`` counts decisions the proxy made before this one, since the last one
    delivered, that were never shown to this client (the status keeps only the newest few); it
    is 0 when nothing was lost."""

    key: SandboxKey
    call: None
    sandbox: str
    time: datetime
    verdict: Literal["ALLOW", "DENY", "UNREACHABLE"]
    reason: str
    method: str
    host: str
    port: int
    missed_before: int = 0
    seq: int | None = None


@dataclass(frozen=True, kw_only=True)
class EgressStreamEnded:
    """The client saw a followed Sandbox's end (its deletion, or a ``dispose(wait=True)``) and
    delivered its last egress records; this says how the stream of ``EgressObserved`` ended.

    ``reported``: ``EgressObserved`` events this client delivered for the Sandbox object;
    ``missed``: decisions it was told of but never shown (the sum of their ``missed_before``).
    ``complete``: the last state seen was the proxy's ``final`` write, in the one counting window
    the client saw, so ``reported + missed`` is every decision the proxy made for the sandbox.
    False when the last state was not final (the proxy may have decided more after its last
    write, uncounted) or the proxy restarted meanwhile (what the old one decided after its last
    write the client read is unknown). Only Sandboxes the proxy wrote a summary for have a
    stream; ``call`` is always ``None``."""

    key: SandboxKey
    call: None
    sandbox: str
    namespace: str
    reported: int
    missed: int
    complete: bool


@dataclass(frozen=True, kw_only=True)
class HostToolCalled:
    """One host-tool call handled at the registry's door. ``refusal`` is the refusal's class name
    (or the tool body's exception class name), ``None`` when it succeeded. ``executed``: the tool
    body was entered; ``completed``: it returned; ``delivery``: ``pending``, ``delivered`` or
    ``delivery_uncertain``; ``response_bytes``: bytes confirmed delivered (0 is never "no
    effect": read ``completed``). The arguments are never recorded."""

    key: SandboxKey | None
    call: str | None
    tool: str
    source: str | None
    sink: str | None
    identity: str | None
    sequence: int
    refusal: str | None
    executed: bool
    completed: bool
    delivery: str
    response_bytes: int


@dataclass(frozen=True, kw_only=True)
class StoreFileRead:
    """A file was read out of the sandbox (``Sandbox.read_file``). ``path`` is the path the caller
    asked for, which is usually chosen by the model or the program in the sandbox: treat it as
    guest-chosen text. ``bytes`` is what was read (0 on failure)."""

    key: SandboxKey | None
    call: str | None
    sandbox: str
    path: str
    bytes: int
    failure: str | None


@dataclass(frozen=True, kw_only=True)
class OutputsCollected:
    """A collection of declared outputs finished. Counts and bytes of what was landed at the sink
    and consumed by the caller, how many optional outputs were absent, and ``failure`` (class
    name) when it was refused part-way; artifact names come from the spec, not the guest, but
    are not carried here."""

    key: SandboxKey | None
    call: str | None
    sandbox: str
    landed: int
    consumed: int
    absent: int
    bytes: int
    failure: str | None


@dataclass(frozen=True, kw_only=True)
class ToolCallEnded:
    """A tool call ended. ``keys``: every sandbox key the call touched (acquired, refused, or only
    read under), in first-touched order; ``failure``: the class name of what ended it (including
    ``CancelledError``), ``None`` when it returned."""

    call: str
    keys: tuple[SandboxKey, ...]
    failure: str | None
    seconds: float


Event: TypeAlias = (
    SandboxAcquired
    | SandboxDisposed
    | ScopeDisposed
    | EgressObserved
    | EgressStreamEnded
    | HostToolCalled
    | StoreFileRead
    | OutputsCollected
    | ToolCallEnded
)


class SandboxObserver:
    """Receives the events. Every method does nothing: override the ones you want.

    Methods are called inline, from whichever thread and event loop serve the call, and possibly
    from several at once: hand the event to a thread-safe queue or exporter and return; do no I/O
    here. An exception raised here is logged and otherwise ignored; a return value is never read.
    """

    def sandbox_acquired(self, event: SandboxAcquired) -> None:
        """An acquire finished (served or refused)."""

    def sandbox_disposed(self, event: SandboxDisposed) -> None:
        """A Sandbox was deleted."""

    def scope_disposed(self, event: ScopeDisposed) -> None:
        """Every Sandbox of a SandboxScope was deleted."""

    def egress_observed(self, event: EgressObserved) -> None:
        """The egress proxy decided on one outbound connection."""

    def egress_stream_ended(self, event: EgressStreamEnded) -> None:
        """A followed Sandbox ended: its egress records are all delivered (or counted)."""

    def host_tool_called(self, event: HostToolCalled) -> None:
        """A host-tool call was handled (answered, refused or failed)."""

    def store_file_read(self, event: StoreFileRead) -> None:
        """A file was read out of the sandbox."""

    def outputs_collected(self, event: OutputsCollected) -> None:
        """Declared outputs were collected (or the collection was refused)."""

    def tool_call_ended(self, event: ToolCallEnded) -> None:
        """A tool call ended."""


ObserverMethod: TypeAlias = Literal[
    "sandbox_acquired",
    "sandbox_disposed",
    "scope_disposed",
    "egress_observed",
    "egress_stream_ended",
    "host_tool_called",
    "store_file_read",
    "outputs_collected",
    "tool_call_ended",
]


def notify(
    observer: SandboxObserver | None,
    method: ObserverMethod,
    build: Callable[[], Event],
) -> None:
    """Deliver one event. With no observer, ``build`` is never called (nothing is built). An
    exception from ``build`` or from the observer is logged with its class name only and never
    propagates; the observer's return value is ignored."""
    if observer is None:
        return
    try:
        event = build()
    except Exception as exc:  # a bug building the record must not fail the call
        log.warning("sandbox observer: building a %s event failed (%s)", method, type(exc).__name__)
        return
    try:
        getattr(observer, method)(event)
    except Exception as exc:
        log.warning("sandbox observer: %s raised %s (ignored)", method, type(exc).__name__)


# ---- the call context -------------------------------------------------------------------------


class ToolCallContext:
    """One tool call in progress: its id, the keys it touched, and where its end is reported.

    Use it as ``with`` or ``async with`` (both mean the same; nothing is awaited). Inside, every
    client event carries ``call``; on exit one :class:`ToolCallEnded` is delivered, whatever
    ended the block. A task the body started and left running keeps the context object but
    reads no call once the call has ended, so its later events carry ``call=None``.
    """

    def __init__(self, call_id: str, observer: SandboxObserver | None) -> None:
        if not call_id:
            raise ValueError("a tool call needs a non-empty id")
        self.call_id = call_id
        self.observer = observer
        self.ended = False
        self._keys: dict[SandboxKey, None] = {}
        self._token: contextvars.Token[ToolCallContext | None] | None = None
        self._started = 0.0

    @property
    def keys(self) -> tuple[SandboxKey, ...]:
        return tuple(self._keys)

    def record_key(self, key: SandboxKey) -> None:
        if not self.ended:
            self._keys.setdefault(key, None)

    def __enter__(self) -> ToolCallContext:
        if self._token is not None or self.ended:
            raise RuntimeError("a ToolCallContext is entered once")
        self._started = time.monotonic()
        self._token = _CALL.set(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.ended = True
        if self._token is not None:
            try:
                _CALL.reset(self._token)
            except ValueError:  # exited in another context than it was entered in
                _CALL.set(None)
        elapsed = time.monotonic() - self._started
        notify(
            self.observer,
            "tool_call_ended",
            lambda: ToolCallEnded(
                call=self.call_id, keys=self.keys, failure=failure_name(exc), seconds=elapsed
            ),
        )

    async def __aenter__(self) -> ToolCallContext:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)


_CALL: contextvars.ContextVar[ToolCallContext | None] = contextvars.ContextVar(
    "sandbox_operator_tool_call", default=None
)


def tool_call(call_id: str, observer: SandboxObserver | None = None) -> ToolCallContext:
    """The context of one tool call (``async with tool_call(id, observer): ...``). ``observer``
    receives its :class:`ToolCallEnded`; ``SandboxClient.tool_call`` passes the client's own."""
    return ToolCallContext(call_id, observer)


def _current() -> ToolCallContext | None:
    ctx = _CALL.get()
    if ctx is None or ctx.ended:
        return None
    return ctx


def current_call() -> str | None:
    """The id of the tool call this code runs in, or ``None`` outside one (or after it ended)."""
    ctx = _current()
    return None if ctx is None else ctx.call_id


def record_key(key: SandboxKey | None) -> str | None:
    """Note that the current call touched ``key``; returns the current call id (or ``None``)."""
    ctx = _current()
    if ctx is None:
        return None
    if key is not None:
        ctx.record_key(key)
    return ctx.call_id


class NumberedRecord(Protocol):
    """A status egress record as the watermark reads it: ``seq`` is its number in the proxy's
    counting window (``None`` from a proxy older than the field)."""

    @property
    def seq(self) -> int | None: ...


R = TypeVar("R", bound=NumberedRecord)


@dataclass
class EgressWatermark:
    """How far one sandbox's egress decisions have been reported: the proxy's counting window
    (``status.egress.since``; a new one restarts the numbers) and the number of the last decision
    reported or counted as missed in it. ``delivered`` and ``missed`` add up over the windows:
    events handed to the observer, and decisions it was told (``missed_before``) it will never
    see. ``windows`` counts the counting windows seen (more than one: a proxy restarted, and
    what the old one decided after its last write that was read is unknown); ``final``: the
    current window's proxy wrote its last state (the Sandbox is being deleted)."""

    since: datetime | None = None
    reported: int = 0
    delivered: int = 0
    missed: int = 0
    windows: int = 0
    final: bool = False

    @property
    def complete(self) -> bool:
        """Every decision of the sandbox was delivered or counted as missed: one window, closed
        by the proxy's final write."""
        return self.final and self.windows == 1

    def advance(
        self, since: datetime, total: int, recent: Sequence[R], *, final: bool = False
    ) -> list[tuple[int, R]]:
        """``(missed_before, record)`` for the decisions not yet reported, oldest first, and
        move the mark past them; a state of an older window than the mark's (a stale read) is
        ignored, a newer one restarts the numbers.

        Numbered records (every one has ``seq``) are exact: those above the mark, in ``seq``
        order, each with ``missed_before = seq - previous - 1``. Without numbers (an older
        proxy) the totals say it: the newest ``total - reported`` of ``recent``, the first
        carrying how many were made before it but never shown."""
        if self.since is not None and since < self.since:
            return []
        if self.since != since:
            self.since, self.reported, self.final = since, 0, False
            self.windows += 1
        self.final = self.final or final
        numbered = [r for r in recent if r.seq is not None]
        if recent and len(numbered) == len(recent):
            out: list[tuple[int, R]] = []
            for record in sorted(numbered, key=lambda r: r.seq or 0):
                seq = record.seq or 0
                if seq <= self.reported:
                    continue
                out.append((seq - self.reported - 1, record))
                self.reported = seq
            if total > self.reported:  # counted beyond the newest record: never shown
                self.missed += total - self.reported
                self.reported = total
        else:
            new = max(total - self.reported, 0)
            shown = min(new, len(recent))
            tail = list(recent[len(recent) - shown :]) if shown else []
            out = [((new - shown if i == 0 else 0), record) for i, record in enumerate(tail)]
            if new and not shown:
                self.missed += new  # counted, but no record left to carry the count
            self.reported = max(total, self.reported)
        self.delivered += len(out)
        self.missed += sum(m for m, _ in out)
        return out
