"""The host-tool contract: what model-written code inside a sandbox may call on the host.

A host tool is the one capability where trust crosses *outward*: the function body runs in the
agent's process, with its authority, driven by code a model wrote. So this module is all gates and
no I/O (the channel that carries requests lives in :mod:`.channel`):

- **Nothing is callable by default.** A :class:`HostToolRegistry` starts empty.
- **Every information-flow leg is answered.** :func:`host_tool` takes ``source``, ``sink`` and
  ``identity`` with no defaults; ``None`` is an answer ("not that role"), omission is refused.
  Registration is the only place the declaration is read: the registry keeps its own copy, so a
  decorator swapped or removed afterwards changes nothing.
- **User authority is opt-in.** ``allowed_identities`` defaults to the application's own; a tool
  acting as the user is refused at registration unless the host allows it, and its calls are
  served only through the host's ``mint_user_identity`` callback.
- **The registry seals** the moment a policy is derived from it (:meth:`HostToolRegistry.aggregate`
  or :meth:`HostToolRegistry.start_run`): what a run was admitted with is what it carries.
- **Each run is bounded**: a host-tool-call cap that refusals count toward, and request/response
  caps reused from the spec's transfer limits (a request leaves the sandbox like ``filesOut``; a
  response enters it like ``filesIn``).
- **One door.** Arguments are validated here, host side, against the tool's signature; a check in
  the guest shim would be decoration, since model-written code can edit or bypass the shim.

Every call leaves a :class:`HostToolCallRecord` that never overstates: whether the body ran,
whether it returned, and whether the answer is *known* to have reached the guest. An answer whose
write-back failed after the body returned is ``delivery_uncertain``, and nothing here re-runs a
call it has already handled: a request seen again is answered from the record.

``Identity.APP`` is not the safe choice, only the declared one: it is the application's whole
authority. Least privilege comes from what a host registers, never from what it declares.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
import typing
import warnings
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeVar

import pydantic
import pydantic_core

from sandbox_operator.client.hosttools.errors import (
    HostToolArgumentsInvalid,
    HostToolCallCapExceeded,
    HostToolCallRefused,
    HostToolFailed,
    HostToolIdentityNotAllowed,
    HostToolNameInvalid,
    HostToolNotRegistered,
    HostToolRegistrySealed,
    HostToolRequestInvalid,
    HostToolRequestTooLarge,
    HostToolResponseTooLarge,
    HostToolResultInvalid,
    HostToolSignatureInvalid,
    HostToolsWarning,
    HostToolUndeclared,
    UserIdentityUnavailable,
)
from sandbox_operator.client.hosttools.records import Delivery as Delivery
from sandbox_operator.client.hosttools.records import HostToolCallRecord as HostToolCallRecord
from sandbox_operator.client.observer import HostToolCalled, SandboxObserver, current_call, notify
from sandbox_operator.contract import SandboxKey, TransferLimits
from sandbox_operator.views import HostToolRequestView

log = logging.getLogger(__name__)

#: Calls one run may make, refusals included, unless the registry says otherwise.
DEFAULT_MAX_HOST_TOOL_CALLS_PER_RUN = 32
#: The largest request the door parses, unless the registry says otherwise; a run's cap is the
#: smaller of this and the spec's ``filesOut.maxBytesPerFile``. JSON costs the host many times
#: its size in objects (an 8 MiB request took ~200 MB), so the door bounds what it parses
#: rather than what the sandbox may export.
DEFAULT_MAX_HOST_TOOL_REQUEST_BYTES = 1024 * 1024
#: The deepest nesting of arrays and objects a request may have; checked on the bytes before
#: parsing, because the parser recurses once per level and a deep enough request raises
#: ``RecursionError`` in the host instead of a refusal.
MAX_HOST_TOOL_REQUEST_DEPTH = 32

#: The parameter a user-identity tool receives the minted authority in; never guest-supplied.
USER_IDENTITY_PARAMETER = "user_identity"

_DECLARATION_ATTR = "__sandbox_host_tool__"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")

F = TypeVar("F", bound=Callable[..., Any])


class Identity(StrEnum):
    """Whose authority a tool's body exercises."""

    APP = "app"
    """The application's own credentials: its full authority, bounded only by what is registered."""
    USER = "user"
    """The end user's authority, minted per run by the host (``mint_user_identity``)."""


@dataclass(frozen=True)
class FlowDeclaration:
    """A tool's answer for each information-flow leg. ``None`` means "not that role"."""

    source: str | None
    """Where the data the tool returns to the guest comes from (a system, a store)."""
    sink: str | None
    """What the tool writes to or changes outside the sandbox."""
    identity: Identity | None
    """Whose authority the body acts with; ``None`` when it acts with none."""


def host_tool(
    *, source: str | None, sink: str | None, identity: Identity | None
) -> Callable[[F], F]:
    """Declare a function's information-flow legs so a :class:`HostToolRegistry` will take it.

    All three are required keywords: the point is that a developer answers each one."""
    if identity is not None:
        identity = Identity(identity)
    declaration = FlowDeclaration(source=source, sink=sink, identity=identity)

    def stamp(fn: F) -> F:
        setattr(fn, _DECLARATION_ATTR, declaration)
        return fn

    return stamp


@dataclass(frozen=True)
class RegisteredTool:
    """A tool as the registry captured it at registration (the declaration is this copy)."""

    name: str
    declaration: FlowDeclaration
    function: Callable[..., Any] = field(repr=False, compare=False)
    arguments: type[pydantic.BaseModel] = field(repr=False, compare=False)
    is_async: bool = field(repr=False, compare=False)


@dataclass(frozen=True)
class HostToolPolicy:
    """What a sealed registry carries, as the host's policy sees it."""

    names: tuple[str, ...]
    sources: frozenset[str]
    sinks: frozenset[str]
    identities: frozenset[Identity]

    @property
    def user_authority(self) -> bool:
        """Whether any tool acts as the user: the surface is then approval-gated."""
        return Identity.USER in self.identities


@dataclass(frozen=True)
class HostToolAnswer:
    """The door's answer to one request: the JSON the channel writes back."""

    sequence: int
    payload: bytes


def _arguments_model(
    name: str, fn: Callable[..., Any], wants_user: bool
) -> type[pydantic.BaseModel]:
    try:
        signature = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
    except (TypeError, ValueError, NameError) as exc:
        raise HostToolSignatureInvalid(
            name, f"its signature cannot be read ({type(exc).__name__})"
        ) from None
    fields: dict[str, Any] = {}
    has_user = False
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise HostToolSignatureInvalid(
                name, f"parameter {param.name!r} cannot be passed by name; name every parameter"
            )
        if param.name == USER_IDENTITY_PARAMETER:
            has_user = True
            continue
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hints.get(param.name, Any), default)
    if wants_user and not has_user:
        raise HostToolSignatureInvalid(
            name, f"a user-identity tool takes the minted authority as {USER_IDENTITY_PARAMETER!r}"
        )
    if has_user and not wants_user:
        raise HostToolSignatureInvalid(
            name, f"only a tool declaring identity=Identity.USER takes {USER_IDENTITY_PARAMETER!r}"
        )
    model: type[pydantic.BaseModel] = pydantic.create_model(
        f"{name}_arguments",
        __config__=pydantic.ConfigDict(extra="forbid"),
        **fields,
    )
    return model


class HostToolRegistry:
    """The tools a host lets sandboxed code call, and the policy every run of them keeps."""

    def __init__(
        self,
        *,
        allowed_identities: frozenset[Identity] = frozenset({Identity.APP}),
        mint_user_identity: Callable[[], Awaitable[object]] | None = None,
        max_calls_per_run: int = DEFAULT_MAX_HOST_TOOL_CALLS_PER_RUN,
        max_request_bytes: int = DEFAULT_MAX_HOST_TOOL_REQUEST_BYTES,
        observer: SandboxObserver | None = None,
    ) -> None:
        if max_calls_per_run < 0:
            raise ValueError("max_calls_per_run must be >= 0")
        if max_request_bytes < 1:
            raise ValueError("max_request_bytes must be >= 1")
        self.max_request_bytes = max_request_bytes
        self.allowed_identities = frozenset(Identity(i) for i in allowed_identities)
        self.mint_user_identity = mint_user_identity
        self.max_calls_per_run = max_calls_per_run
        self.observer = observer
        self._tools: dict[str, RegisteredTool] = {}
        self._sealed = False
        self._warned = False

    @property
    def sealed(self) -> bool:
        return self._sealed

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._tools))

    def get(self, name: str) -> RegisteredTool | None:
        return self._tools.get(name)

    def register(self, fn: Callable[..., Any], *, name: str | None = None) -> RegisteredTool:
        """Take a declared tool. Refuses an undeclared function, an identity this registry does
        not allow, a signature the door cannot validate, a bad or taken name, and anything after
        the registry sealed."""
        tool = name if name is not None else getattr(fn, "__name__", "")
        if self._sealed:
            raise HostToolRegistrySealed(tool)
        if not isinstance(tool, str) or not _NAME.fullmatch(tool):
            raise HostToolNameInvalid(str(tool), "a name is a Python identifier of 1-64 characters")
        if tool in self._tools:
            raise HostToolNameInvalid(tool, "a tool of that name is already registered")
        declaration = getattr(fn, _DECLARATION_ATTR, None)
        if not isinstance(declaration, FlowDeclaration):
            raise HostToolUndeclared(tool)
        if declaration.identity is not None and declaration.identity not in self.allowed_identities:
            raise HostToolIdentityNotAllowed(
                tool,
                declaration.identity.value,
                tuple(sorted(i.value for i in self.allowed_identities)),
            )
        wants_user = declaration.identity is Identity.USER
        arguments = _arguments_model(tool, fn, wants_user)
        registered = RegisteredTool(
            name=tool,
            declaration=declaration,
            function=fn,
            arguments=arguments,
            is_async=inspect.iscoroutinefunction(fn),
        )
        self._tools[tool] = registered
        if not self._warned:
            self._warned = True
            warnings.warn(
                "host tools registered: model-written code in a sandbox can now run host code "
                "with the application's authority (see docs/host-tools.md)",
                HostToolsWarning,
                stacklevel=2,
            )
        return registered

    def aggregate(self) -> HostToolPolicy:
        """Seal the registry and describe what it carries."""
        self._sealed = True
        tools = self._tools.values()
        return HostToolPolicy(
            names=self.names,
            sources=frozenset(t.declaration.source for t in tools if t.declaration.source),
            sinks=frozenset(t.declaration.sink for t in tools if t.declaration.sink),
            identities=frozenset(t.declaration.identity for t in tools if t.declaration.identity),
        )

    def start_run(
        self,
        *,
        limits_in: TransferLimits,
        limits_out: TransferLimits,
        key: SandboxKey | None = None,
        call: str | None = None,
    ) -> HostToolRun:
        """Seal the registry and open one run's door. ``limits_in`` caps a response (it enters the
        sandbox), ``limits_out`` a request (it leaves it): pass the spec's ``files_in`` and
        ``files_out``. ``call`` defaults to the current tool call (see the observer)."""
        self.aggregate()
        return HostToolRun(
            self,
            limits_in=limits_in,
            limits_out=limits_out,
            key=key,
            call_id=call if call is not None else current_call(),
        )


@dataclass(eq=False)
class HostToolRun:
    """One program run's door to the registry: its cap, its caps on bytes, its records.

    Opened by :meth:`HostToolRegistry.start_run`; ``call_id`` is the tool call it serves."""

    registry: HostToolRegistry
    _: KW_ONLY
    limits_in: TransferLimits
    limits_out: TransferLimits
    key: SandboxKey | None
    call_id: str | None
    calls_made: int = field(default=0, init=False)
    _records: dict[int, HostToolCallRecord] = field(default_factory=dict, init=False, repr=False)
    _answers: dict[int, bytes] = field(default_factory=dict, init=False, repr=False)
    _next_direct: int = field(default=0, init=False, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)
    #: The cap on one request (it leaves the sandbox: ``limits_out``; never above the registry's
    #: ``max_request_bytes``), in bytes.
    max_request_bytes: int = field(init=False)
    #: The cap on one answer (it enters the sandbox: ``limits_in``), in bytes.
    max_response_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.max_request_bytes = min(
            self.limits_out.max_bytes_per_file, self.registry.max_request_bytes
        )
        self.max_response_bytes = self.limits_in.max_bytes_per_file

    @property
    def records(self) -> tuple[HostToolCallRecord, ...]:
        return tuple(self._records.values())  # in the order the calls arrived

    def answered(self, sequence: int) -> bool:
        """Whether this sequence was handled already (it is never executed again)."""
        return sequence in self._records

    # -- the one door -----------------------------------------------------------------------

    async def handle_request(self, sequence: int, raw: bytes) -> HostToolAnswer:
        """Answer one guest request (JSON ``{"tool": ..., "arguments": {...}}``). A refusal is an
        answer too; a sequence seen before is answered from its first handling, never re-run."""
        async with self._lock:
            if sequence in self._answers:
                return HostToolAnswer(sequence, self._answers[sequence])
            tool = "?"
            try:
                # Every request counts, the malformed and the oversized included: a program
                # that cannot form a call still spends the run's budget by trying.
                if len(raw) > self.max_request_bytes:
                    self._count(tool)
                    raise HostToolRequestTooLarge(tool, self.max_request_bytes, len(raw))
                try:
                    tool, arguments = _parse_request(raw)
                finally:
                    self._count(tool)  # by its name once it has one
                payload = await self._serve(sequence, tool, arguments)
            except HostToolCallRefused as refusal:
                payload = _refusal_payload(refusal)
                if sequence not in self._records:
                    self._record(sequence, tool, refusal, executed=False, completed=False)
            self._answers[sequence] = payload
            return HostToolAnswer(sequence, payload)

    async def call(self, tool: str, arguments: Mapping[str, Any]) -> Any:
        """Call a tool directly through the same door (same gates, cap and caps); returns its
        result as JSON-decoded data or raises the typed refusal. Recorded as delivered."""
        async with self._lock:
            self._next_direct -= 1
            sequence = self._next_direct
            try:
                self._count(tool)
                payload = await self._serve(sequence, tool, dict(arguments))
            except HostToolCallRefused as refusal:
                if sequence not in self._records:
                    self._record(sequence, tool, refusal, executed=False, completed=False)
                self.delivered(sequence, 0)  # raised to the caller: it has the refusal
                raise
        self.delivered(sequence, len(payload))
        return json.loads(payload)["result"]

    async def _serve(self, sequence: int, tool: str, arguments: dict[str, Any]) -> bytes:
        """Validate and run one counted call (the caller counted it)."""
        registered = self.registry.get(tool)
        if registered is None:
            raise HostToolNotRegistered(tool)
        try:
            validated = registered.arguments.model_validate(arguments)
        except pydantic.ValidationError as exc:
            fields = tuple(
                sorted(
                    {".".join(str(p) for p in err["loc"]) or "arguments" for err in exc.errors()}
                )
            )
            raise HostToolArgumentsInvalid(tool, fields) from None
        kwargs = {name: getattr(validated, name) for name in type(validated).model_fields}
        if registered.declaration.identity is Identity.USER:
            mint = self.registry.mint_user_identity
            if mint is None:
                raise UserIdentityUnavailable(
                    tool, "no mint_user_identity callback: user authority is not served"
                )
            try:
                kwargs[USER_IDENTITY_PARAMETER] = await mint()
            except Exception as exc:  # the host's callback; its failure refuses, never leaks
                raise UserIdentityUnavailable(
                    tool, f"mint_user_identity raised {type(exc).__name__}"
                ) from None
        try:
            if registered.is_async:
                result = await registered.function(**kwargs)
            else:
                result = await asyncio.to_thread(registered.function, **kwargs)
        except asyncio.CancelledError:
            self._record(
                sequence, tool, None, executed=True, completed=False, delivery=Delivery.UNCERTAIN
            )
            raise
        except Exception as exc:  # the body's failure is the guest's answer, not the host's crash
            failure = HostToolFailed(tool, type(exc).__name__)
            self._record(sequence, tool, failure, executed=True, completed=False)
            raise failure from None
        try:
            payload = pydantic_core.to_json({"ok": True, "result": result})
        except (pydantic_core.PydanticSerializationError, TypeError, ValueError) as exc:
            invalid = HostToolResultInvalid(tool, type(exc).__name__)
            self._record(sequence, tool, invalid, executed=True, completed=True)
            raise invalid from None
        if len(payload) > self.max_response_bytes:
            too_large = HostToolResponseTooLarge(tool, self.max_response_bytes, len(payload))
            self._record(sequence, tool, too_large, executed=True, completed=True)
            raise too_large
        self._record(sequence, tool, None, executed=True, completed=True)
        return payload

    def _count(self, tool: str) -> None:
        if self.calls_made >= self.registry.max_calls_per_run:
            raise HostToolCallCapExceeded(tool, self.registry.max_calls_per_run)
        self.calls_made += 1

    # -- delivery ---------------------------------------------------------------------------

    def delivered(self, sequence: int, nbytes: int) -> None:
        """The channel wrote the answer where the guest reads it."""
        self._settle(sequence, Delivery.DELIVERED, nbytes)

    def delivery_failed(self, sequence: int) -> None:
        """The write-back failed or was interrupted: the guest may or may not have the answer."""
        self._settle(sequence, Delivery.UNCERTAIN, 0)

    def _settle(self, sequence: int, delivery: Delivery, nbytes: int) -> None:
        record = self._records.get(sequence)
        if record is None or record.delivery is not Delivery.PENDING:
            return
        settled = replace(
            record,
            delivery=delivery,
            response_bytes=nbytes if delivery is Delivery.DELIVERED else 0,
        )
        self._records[sequence] = settled
        self._notify(settled)

    def _record(
        self,
        sequence: int,
        tool: str,
        refusal: HostToolCallRefused | None,
        *,
        executed: bool,
        completed: bool,
        delivery: Delivery = Delivery.PENDING,
    ) -> None:
        record = HostToolCallRecord(
            sequence=sequence,
            tool=tool,
            refusal=type(refusal).__name__ if refusal is not None else None,
            executed=executed,
            completed=completed,
            delivery=delivery,
            response_bytes=0,
        )
        self._records[sequence] = record
        if delivery is not Delivery.PENDING:
            self._notify(record)

    def _notify(self, record: HostToolCallRecord) -> None:
        """One observer event per call, once its delivery is settled."""
        registered = self.registry.get(record.tool)
        declaration = registered.declaration if registered is not None else None

        def build() -> HostToolCalled:
            return HostToolCalled(
                key=self.key,
                call=self.call_id,
                tool=record.tool,
                source=declaration.source if declaration else None,
                sink=declaration.sink if declaration else None,
                identity=declaration.identity.value
                if declaration and declaration.identity
                else None,
                sequence=record.sequence,
                refusal=record.refusal,
                executed=record.executed,
                completed=record.completed,
                delivery=record.delivery.value,
                response_bytes=record.response_bytes,
            )

        notify(self.registry.observer, "host_tool_called", build)


#: A JSON string (its escapes included): what the depth check skips, since brackets inside
#: strings are data. Linear: no nested quantifier can backtrack.
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPENERS = {ord("["), ord("{")}
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def request_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in ``raw``, read without parsing it.

    Brackets inside strings are skipped; for text that is not JSON the figure only bounds what a
    parser would recurse into, which is what it is for. Past :data:`MAX_HOST_TOOL_REQUEST_DEPTH`
    it stops counting and returns the first depth above it."""
    brackets = _JSON_STRING.sub(b"", raw).translate(None, delete=_NOT_BRACKETS)
    depth = deepest = 0
    for byte in brackets:
        depth = depth + 1 if byte in _OPENERS else max(depth - 1, 0)
        if depth > MAX_HOST_TOOL_REQUEST_DEPTH:
            return depth  # past the bound: how far past does not matter, and stops the scan
        deepest = max(deepest, depth)
    return deepest


def _parse_request(raw: bytes) -> tuple[str, dict[str, Any]]:
    """The request's tool and arguments; every malformed request is a typed refusal (the depth
    is bounded before parsing, and a parser failure of any kind is still a refusal)."""
    if request_depth(raw) > MAX_HOST_TOOL_REQUEST_DEPTH:
        raise HostToolRequestInvalid(
            "?", f"the request nests deeper than {MAX_HOST_TOOL_REQUEST_DEPTH} levels"
        )
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise HostToolRequestInvalid("?", "the request is not JSON") from None
    if not isinstance(body, dict):
        raise HostToolRequestInvalid("?", "the request is not a JSON object")
    request = HostToolRequestView(body)
    tool = request.tool
    if not isinstance(tool, str) or not tool:
        raise HostToolRequestInvalid("?", "the request names no tool")
    arguments = request.arguments
    if not isinstance(arguments, dict):
        raise HostToolArgumentsInvalid(tool[:64], ("arguments",))
    return tool[:64], arguments


def _refusal_payload(refusal: HostToolCallRefused) -> bytes:
    return json.dumps(
        {"ok": False, "error": {"type": type(refusal).__name__, "message": str(refusal)}},
        ensure_ascii=False,
    ).encode("utf-8")
