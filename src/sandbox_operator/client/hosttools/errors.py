"""Typed refusals and failures of host tools: one class per thing a host branches on.

Two moments refuse. **Registration** (the host's own code, before any model runs) refuses a tool
whose information-flow legs were never declared, whose identity the registry does not allow, whose
signature the one door could not validate, or that arrives after the registry was sealed.
**A call** (model-written code asking, through the guest shim) is refused for an unknown tool,
invalid arguments, a request or response above the transfer caps, an exhausted per-run cap, or a
user-identity tool with no minting callback. A call's refusal is also answered to the guest by its
class name, so the program sees the same type the host records.

Messages name tools and fields, never argument values, responses or endpoints: the guest chose
the values, and a host log is the wrong place to replay them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from sandbox_operator.client.errors import SandboxClientError

if TYPE_CHECKING:
    from sandbox_operator.client.hosttools.records import HostToolCallRecord


class HostToolError(SandboxClientError):
    """Base of every host-tool error."""


class HostToolsWarning(UserWarning):
    """Registering a host tool lets model-written code run host code; said once per registry.

    Silence it with ``warnings.filterwarnings("ignore", category=HostToolsWarning)`` once the
    surface has been reviewed."""


# --------------------------------------------------------------------------------------------
# Registration


@dataclass(eq=False, repr=False)
class _NamesTool(HostToolError):
    """A refusal about one tool: ``tool`` names it, ``detail`` says what is wrong (no values)."""

    tool: str
    detail: str

    def _message(self) -> str:
        return f"host tool {self.tool!r}: {self.detail}"


class HostToolRegistrationError(_NamesTool):
    """A tool the registry would not take. ``tool`` names it."""


class HostToolUndeclared(HostToolRegistrationError):
    """The function carries no ``@host_tool(source=..., sink=..., identity=...)`` declaration."""

    def __init__(self, tool: str) -> None:
        super().__init__(
            tool,
            "no information-flow declaration; decorate it with "
            "@host_tool(source=..., sink=..., identity=...) (None is an answer, omission is not)",
        )


class HostToolIdentityNotAllowed(HostToolRegistrationError):
    """The tool exercises an identity the registry's ``allowed_identities`` does not include."""

    def __init__(self, tool: str, identity: str, allowed: tuple[str, ...]) -> None:
        self.identity = identity
        self.allowed = allowed
        super().__init__(
            tool,
            f"declares identity {identity!r}; this registry allows {', '.join(allowed) or 'none'} "
            "(user authority is opt-in: allowed_identities={Identity.APP, Identity.USER})",
        )


class HostToolRegistrySealed(HostToolRegistrationError):
    """The registry already derived a policy or started a run; what it carries is fixed."""

    def __init__(self, tool: str) -> None:
        super().__init__(tool, "the registry is sealed (a policy was derived from it)")


class HostToolNameInvalid(HostToolRegistrationError):
    """The tool's name is not a valid identifier, or is taken."""


class HostToolSignatureInvalid(HostToolRegistrationError):
    """The tool's parameters cannot be validated at the door (``*args``/``**kwargs``, positional
    only, or a user-identity tool without a ``user_identity`` parameter)."""


# --------------------------------------------------------------------------------------------
# Calls


class HostToolCallRefused(_NamesTool):
    """A call the door refused; the tool body did not run unless the subclass says otherwise.

    ``tool`` is the name the guest asked for (guest-chosen text, quoted for logs only)."""


class HostToolNotRegistered(HostToolCallRefused):
    """No tool of that name is registered."""

    def __init__(self, tool: str) -> None:
        super().__init__(tool, "not registered")


class HostToolArgumentsInvalid(HostToolCallRefused):
    """The arguments did not validate; ``fields`` names each bad field (never its value)."""

    def __init__(self, tool: str, fields: tuple[str, ...]) -> None:
        self.fields = fields
        super().__init__(tool, f"invalid arguments: {', '.join(fields) or 'the request'}")


class HostToolRequestInvalid(HostToolCallRefused):
    """The request was not a JSON object with a ``tool`` name and an ``arguments`` object."""


class HostToolRequestTooLarge(HostToolCallRefused):
    """The request is above the outbound transfer cap (``limit`` and ``actual`` in bytes)."""

    def __init__(self, tool: str, limit: int, actual: int) -> None:
        self.limit = limit
        self.actual = actual
        super().__init__(tool, f"request of {actual} bytes is above the cap of {limit}")


class HostToolResponseTooLarge(HostToolCallRefused):
    """The tool ran and completed, but its response is above the inbound transfer cap: the effect
    happened and the answer was not sent (the record says executed and completed)."""

    def __init__(self, tool: str, limit: int, actual: int) -> None:
        self.limit = limit
        self.actual = actual
        super().__init__(
            tool, f"ran, but its response of {actual} bytes is above the cap of {limit}"
        )


class HostToolCallCapExceeded(HostToolCallRefused):
    """The run used its host-tool-call cap (refused calls count toward it)."""

    def __init__(self, tool: str, cap: int) -> None:
        self.cap = cap
        super().__init__(tool, f"this run's cap of {cap} host-tool calls is used up")


class UserIdentityUnavailable(HostToolCallRefused):
    """A user-identity tool was called and the registry has no ``mint_user_identity`` callback
    (or the callback failed): user authority is served only where the host mints it."""


class HostToolFailed(HostToolCallRefused):
    """The tool body raised. ``cause`` is the exception's class name; it ran, and did not
    complete, so what it changed before raising is unknown."""

    def __init__(self, tool: str, cause: str) -> None:
        self.cause = cause
        super().__init__(tool, f"raised {cause}")


class HostToolResultInvalid(HostToolCallRefused):
    """The tool completed but its result could not be encoded as JSON: the effect happened and
    no answer was sent."""

    def __init__(self, tool: str, cause: str) -> None:
        self.cause = cause
        super().__init__(tool, f"completed, but its result is not JSON-encodable ({cause})")


# --------------------------------------------------------------------------------------------
# The channel


class HostToolChannelError(HostToolError):
    """The channel over exec could not serve a run. ``records`` holds every call record so far."""

    def __init__(self, message: str, records: tuple[HostToolCallRecord, ...] = ()) -> None:
        self.records = records
        super().__init__(message)


@dataclass(eq=False, repr=False)
class HostToolFileNameReserved(HostToolError, ValueError):
    """A file given to a host-tool run uses a name the channel keeps for itself (the shim module's
    name, or a transport file's): refused before anything is written. ``name`` is the file."""

    name: str

    def _message(self) -> str:
        return f"run file {self.name!r} uses a name reserved by the host-tool channel"


class SignalOutcome(StrEnum):
    """What the signal sent to an overrunning program could reach, as far as the host can say.

    ``kill`` reports success for a signal the kernel accepted, not for a process that is gone, and
    the pid it is sent to comes from a file the program could have rewritten: none of these means
    "it died"."""

    GROUP = "group"
    """SIGKILL was sent to the program's process group (it and whatever stayed in its group)."""
    PROCESS = "process"
    """SIGKILL was sent to the program's pid alone: anything it spawned may still be running."""
    NOT_SENT = "not_sent"
    """No signal could be sent (no pid recorded, or the sandbox did not answer)."""


@dataclass(eq=False, repr=False, kw_only=True)
class HostToolRunTimeout(HostToolChannelError, TimeoutError):
    """A program served host tools past its timeout and was signalled.

    ``stdout``/``stderr`` hold what its output files held when it was signalled (at most
    ``filesOut.maxBytesPerFile`` each; ``truncated`` says whether either was cut there);
    ``signal`` is what the signal could reach; ``records`` every call record of the run;
    ``transport_removed`` whether the run's transport files were removed afterwards."""

    timeout: float
    stdout: bytes
    stderr: bytes
    signal: SignalOutcome
    records: tuple[HostToolCallRecord, ...] = ()
    truncated: bool = False
    #: How many processes the run's launcher ended after the program (its group and every
    #: process left in its tree, wherever they moved); ``None`` when the launcher could not say
    #: so (it was gone, or its marker was not its own): processes of the run may still run.
    leftovers_ended: int | None = None
    transport_removed: bool | None = field(default=None, init=False)

    def _message(self) -> str:
        if self.signal is SignalOutcome.GROUP and self.leftovers_ended is not None:
            tail = (
                "and was ended with every process it started "
                f"({self.leftovers_ended} ended in all; its process group was sent SIGKILL)"
            )
        elif self.signal is SignalOutcome.GROUP:
            tail = (
                "and its process group was sent SIGKILL; processes that left the group may "
                "still be running"
            )
        elif self.signal is SignalOutcome.PROCESS:
            tail = (
                "and was sent SIGKILL, which reaches it alone: anything it spawned may still be "
                "running"
            )
        else:
            tail = "and could not be signalled, so it may still be running"
        return f"host-tool program ran past its timeout of {self.timeout:g}s {tail}"


@dataclass(eq=False, repr=False, kw_only=True)
class HostToolDeliveryUncertain(HostToolChannelError):
    """The host handled a call (for a completed tool: its effect committed) and then could not
    write the answer back: the sandbox died, the write failed or the run was interrupted.

    ``record`` is that call's record (``delivery`` is ``delivery_uncertain``); the guest may or
    may not have the answer, and nothing re-sends the call. ``records`` holds every record of the
    run; ``transport_removed`` whether the transport files were removed afterwards (usually not,
    when the sandbox is gone)."""

    record: HostToolCallRecord
    records: tuple[HostToolCallRecord, ...] = ()
    transport_removed: bool | None = field(default=None, init=False)

    def _message(self) -> str:
        record = self.record
        effect = (
            "its tool completed on the host"
            if record.completed
            else "its tool ran on the host"
            if record.executed
            else "it was answered on the host"
        )
        return (
            f"host-tool call {record.sequence} ({record.tool!r}): {effect}, and the answer could "
            "not be written back to the sandbox (delivery_uncertain; it is not re-sent)"
        )


@dataclass(eq=False, repr=False, kw_only=True)
class HostToolRunUnclean(HostToolChannelError):
    """A run whose end the host cannot vouch for: the launcher that holds every process the
    program starts was gone before it said it had ended them (the program killed it, or wrote
    the exit marker itself), or could not end them (no child subreaper in the guest, or
    processes forking faster than it could kill them).

    Processes of the run may still be running, and a process left in a sandbox can read and
    write every later run's channel there: dispose of the sandbox rather than run again in it.
    ``reason`` says which of the above; ``stdout``/``stderr`` what the output files held;
    ``records`` every call record of the run."""

    reason: str
    stdout: bytes = b""
    stderr: bytes = b""
    records: tuple[HostToolCallRecord, ...] = ()
    transport_removed: bool | None = field(default=None, init=False)

    def _message(self) -> str:
        return (
            f"the host-tool run's end cannot be vouched for ({self.reason}): processes it "
            "started may still run in the sandbox; dispose of it"
        )
