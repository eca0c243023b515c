"""The closed vocabularies of the contract: isolation rungs, capabilities, egress modes and friends.

Every enum here is a ``StrEnum`` so its values travel unchanged through YAML, JSON and
Kubernetes objects. Parsing is strict: an unknown value is refused with an error that names the
allowed ones; nothing is guessed, and no retired spelling is accepted as an alias.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class UnknownIsolation(ValueError):
    """A value that is not a rung on the isolation ladder.

    ``value`` is what was given; ``allowed`` lists the rungs, weakest first.
    """

    def __init__(self, value: object) -> None:
        self.value = value
        self.allowed: tuple[str, ...] = tuple(rung.value for rung in ISOLATION_LADDER)
        hint = ""
        if value == "process":
            hint = (
                " ('process' is a retired spelling and is refused on purpose: write 'none' for"
                " no boundary or 'os_process' for a separate OS process)"
            )
        super().__init__(
            f"unknown isolation {value!r}; allowed values, weakest to strongest: "
            f"{', '.join(self.allowed)}{hint}"
        )


class Isolation(StrEnum):
    """How strong a boundary a backend draws around a workload.

    Ordering operators compare by position on :data:`ISOLATION_LADDER`, never by string order,
    and refuse to compare with anything that is not an ``Isolation``.
    """

    NONE = "none"
    RUNTIME = "runtime"
    OS_PROCESS = "os_process"
    CONTAINER = "container"
    HARDENED_CONTAINER = "hardened_container"
    MICROVM = "microvm"
    VM = "vm"

    def _rank_of(self, other: str, op: str) -> int:
        if not isinstance(other, Isolation):
            raise TypeError(
                f"'{op}' compares two Isolation rungs; got {type(other).__name__}: "
                "parse it with parse_isolation() first"
            )
        return isolation_rank(other)

    def __lt__(self, other: str) -> bool:
        return isolation_rank(self) < self._rank_of(other, "<")

    def __le__(self, other: str) -> bool:
        return isolation_rank(self) <= self._rank_of(other, "<=")

    def __gt__(self, other: str) -> bool:
        return isolation_rank(self) > self._rank_of(other, ">")

    def __ge__(self, other: str) -> bool:
        return isolation_rank(self) >= self._rank_of(other, ">=")

    @classmethod
    def _missing_(cls, value: object) -> Isolation:
        raise UnknownIsolation(value)


#: The ladder as data, weakest first. The position of a rung is its rank; nothing else orders
#: isolation.
ISOLATION_LADDER: Final[tuple[Isolation, ...]] = (
    Isolation.NONE,
    Isolation.RUNTIME,
    Isolation.OS_PROCESS,
    Isolation.CONTAINER,
    Isolation.HARDENED_CONTAINER,
    Isolation.MICROVM,
    Isolation.VM,
)

_RANK: Final[dict[Isolation, int]] = {rung: index for index, rung in enumerate(ISOLATION_LADDER)}


def isolation_rank(isolation: Isolation) -> int:
    """Position of ``isolation`` on the ladder (0 = ``none``)."""
    return _RANK[isolation]


def parse_isolation(value: str | Isolation) -> Isolation:
    """Turn a raw value into a rung, or raise :class:`UnknownIsolation` naming the allowed ones."""
    if isinstance(value, Isolation):
        return value
    if not isinstance(value, str):
        raise UnknownIsolation(value)
    for rung in ISOLATION_LADDER:
        if rung.value == value:
            return rung
    raise UnknownIsolation(value)


def stricter_isolation(a: Isolation, b: Isolation) -> Isolation:
    """The stronger of two rungs."""
    return a if isolation_rank(a) >= isolation_rank(b) else b


def meets_floor(isolation: Isolation, floor: Isolation) -> bool:
    """True when ``isolation`` is at or above ``floor``."""
    return isolation_rank(isolation) >= isolation_rank(floor)


class Capability(StrEnum):
    """Something a backend can do and a workload may require."""

    EXEC = "exec"
    RUN_CODE = "run_code"
    HOST_TOOLS = "host_tools"
    FILES_IN = "files_in"
    FILES_OUT = "files_out"
    FILES_LIST = "files_list"
    FILES_DELETE = "files_delete"
    SNAPSHOT = "snapshot"
    ATTACHED_IDENTITY = "attached_identity"


#: What a backend that states nothing is read as declaring, and what a spec requires by default.
DEFAULT_CAPABILITIES: Final[frozenset[Capability]] = frozenset(
    {Capability.EXEC, Capability.FILES_IN}
)


class Egress(StrEnum):
    """Network reach of a sandbox: ``closed`` (none), ``allowlist`` (named hosts only) or
    ``unrestricted`` (no confinement at all)."""

    CLOSED = "closed"
    ALLOWLIST = "allowlist"
    UNRESTRICTED = "unrestricted"


class OsFamily(StrEnum):
    """Guest shape: path grammar and argv quoting (not what is installed in the image)."""

    POSIX = "posix"
    WINDOWS = "windows"


class IsolationScope(StrEnum):
    """How much of a conversation one sandbox serves: all of it, or one call."""

    CONVERSATION = "conversation"
    CALL = "call"


#: The scope ladder, least separated first.
ISOLATION_SCOPE_LADDER: Final[tuple[IsolationScope, ...]] = (
    IsolationScope.CONVERSATION,
    IsolationScope.CALL,
)


def isolation_scope_rank(scope: IsolationScope) -> int:
    """Position of ``scope`` on the scope ladder (0 = ``conversation``)."""
    return ISOLATION_SCOPE_LADDER.index(scope)


def stricter_isolation_scope(a: IsolationScope, b: IsolationScope) -> IsolationScope:
    """The more separating of two isolation scopes."""
    return a if isolation_scope_rank(a) >= isolation_scope_rank(b) else b


class Disposition(StrEnum):
    """What happens to a collected output: ``land`` at the host's sink, or ``consume`` (parsed
    by the kind that declared it)."""

    LAND = "land"
    CONSUME = "consume"


class IdleAction(StrEnum):
    """What reaching the idle timeout does: ``dispose`` the sandbox (the default), or
    ``suspend`` it (stop its compute, keep its storage: needs ``storage``)."""

    DISPOSE = "dispose"
    SUSPEND = "suspend"


class AccessMode(StrEnum):
    """How the work volume may be mounted: by one node, or by one pod."""

    READ_WRITE_ONCE = "ReadWriteOnce"
    READ_WRITE_ONCE_POD = "ReadWriteOncePod"


class Selection(StrEnum):
    """How the host picks a backend: one ``fixed`` backend, or routing ``perSpec``."""

    FIXED = "fixed"
    PER_SPEC = "perSpec"


class DisposalCode(StrEnum):
    """Why a sandbox could not be disposed; callers branch on this, never on the detail text."""

    UNREACHABLE = "unreachable"
    TIMEOUT = "timeout"
    REFUSED = "refused"
    UNLISTED = "unlisted"
    UNKNOWN = "unknown"
