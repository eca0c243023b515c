"""Typed errors of the client: one type per thing a caller branches on.

Acquire failures mirror the reasons the operator writes into a Sandbox's conditions. The classes
for refusals are *generated* from the contract's :class:`RefusalReason` (and the other terminal
condition reasons from :class:`ConditionReason`-style names below), so a reason added to the
contract gets its exception without anyone remembering to add it here, and a reason removed makes
its exception disappear. Look one up with :func:`acquire_error_for` or :func:`refusal_error_for`.

Messages carry the reason and the operator's condition message with anything that looks like an
endpoint or a credential scrubbed; fields, never messages, are what callers branch on.
"""

from __future__ import annotations

import re
from typing import ClassVar

from sandbox_operator.contract.conditions import ConditionReason
from sandbox_operator.contract.errors import RefusalReason

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
    """Base of every error the client raises."""


class SandboxAcquireError(SandboxClientError):
    """An acquire (or a wait for readiness) that did not produce a Ready sandbox.

    ``reason`` is the machine-readable condition reason (or ``NotReadyInTime`` for the client's own
    deadline); ``message`` is the operator's condition message, scrubbed; ``sandbox`` and
    ``namespace`` name the Sandbox resource.
    """

    reason_value: ClassVar[str] = ""

    def __init__(
        self, *, sandbox: str, namespace: str, reason: str = "", message: str = ""
    ) -> None:
        self.reason = reason or self.reason_value
        self.message = scrub(message)
        self.sandbox = sandbox
        self.namespace = namespace
        text = f"sandbox {namespace}/{sandbox}: {self.reason}"
        if self.message:
            text += f": {self.message}"
        super().__init__(text)


class SandboxRefused(SandboxAcquireError):
    """The operator refused to admit the spec; ``refusal_reason`` is the contract's enum value."""

    refusal_reason: ClassVar[RefusalReason]


class SandboxNotReadyInTime(SandboxAcquireError):
    """The client's own deadline passed before the Sandbox reported Ready or a terminal reason.

    ``last_reason`` is the last non-terminal reason seen (e.g. ``Creating``)."""

    reason_value = "NotReadyInTime"

    def __init__(
        self, *, sandbox: str, namespace: str, timeout: float, last_reason: str = ""
    ) -> None:
        self.timeout = timeout
        self.last_reason = last_reason
        super().__init__(
            sandbox=sandbox,
            namespace=namespace,
            message=f"not Ready within {timeout:g}s (last reason: {last_reason or 'none'})",
        )


class SandboxStartupFailed(SandboxAcquireError):
    """The backend could not start the sandbox (e.g. the image cannot be pulled)."""

    reason_value = "StartupFailed"


class SandboxStartupTimeout(SandboxAcquireError):
    """The operator gave up waiting for the sandbox to start
    (``lifetime.startupTimeoutSeconds``)."""

    reason_value = "StartupTimeout"


class SandboxFailed(SandboxAcquireError):
    """The sandbox was running and failed."""

    reason_value = "Failed"


class SandboxKeyUnclean(SandboxAcquireError):
    """The key is refused until a previous sandbox under it is disposed."""

    reason_value = "KeyUnclean"


class SandboxScopeNotFound(SandboxAcquireError):
    """The ``scopeRef`` names no SandboxScope in the namespace."""

    reason_value = "ScopeNotFound"


class SandboxScopeConflict(SandboxAcquireError):
    """The ``scopeRef`` names a SandboxScope whose scope and threadId an older SandboxScope in
    the namespace already holds (one conversation, one SandboxScope); the message names it."""

    reason_value = "ScopeConflict"


class SandboxGone(SandboxAcquireError):
    """The Sandbox (or its SandboxScope) was deleted, expired or is being disposed while waited on.

    ``reason`` says which: ``Deleted``, ``ScopeDeleted``, ``Expired``, ``Disposing``,
    ``Disposed``, ``Purged`` ..."""

    reason_value = "Deleted"


class SandboxSpecConflict(SandboxAcquireError):
    """A Sandbox with this key exists with a different spec (server-side apply conflict)."""

    reason_value = "SpecConflict"


class SandboxSuspended(SandboxAcquireError):
    """The Sandbox is suspended (its compute stopped, its work volume kept) and was not resumed:
    ``resume()`` it, or ``acquire`` it (which resumes)."""

    reason_value = "Suspended"


class SandboxNotSuspendable(SandboxClientError, ValueError):
    """The Sandbox cannot be suspended: it declares no ``spec.storage``, so suspending would lose
    its work directory (dispose it instead). ``sandbox`` and ``namespace`` name it."""

    def __init__(self, *, sandbox: str, namespace: str, message: str = "") -> None:
        self.sandbox = sandbox
        self.namespace = namespace
        self.message = scrub(message) or "it declares no spec.storage (nothing would be kept)"
        super().__init__(f"sandbox {namespace}/{sandbox} cannot be suspended: {self.message}")


class SandboxNotSuspendedInTime(SandboxClientError, TimeoutError):
    """A ``suspend(wait=True)`` whose deadline passed before the operator reported the Sandbox
    ``Suspended``; ``last_reason`` is the last Ready reason seen. The spec still says suspended:
    the operator suspends it when it gets there."""

    def __init__(
        self, *, sandbox: str, namespace: str, timeout: float, last_reason: str = ""
    ) -> None:
        self.sandbox = sandbox
        self.namespace = namespace
        self.timeout = timeout
        self.last_reason = last_reason
        super().__init__(
            f"sandbox {namespace}/{sandbox}: not Suspended within {timeout:g}s "
            f"(last reason: {last_reason or 'none'})"
        )


class SandboxForbidden(SandboxClientError, PermissionError):
    """The client's identity may not do this in the namespace (RBAC said 403). ``action`` names
    what was attempted, e.g. ``get sandboxscopes``."""

    def __init__(self, *, namespace: str, action: str) -> None:
        self.namespace = namespace
        self.action = action
        super().__init__(f"not allowed to {action} in namespace {namespace!r}")


class SandboxSpecRejected(SandboxAcquireError):
    """The API server rejected the Sandbox (schema validation, an immutable field changed)."""

    reason_value = "SpecRejected"


# --------------------------------------------------------------------------------------------
# Refusals generated from the contract's enum


def _class_name(reason: str) -> str:
    return reason if reason.startswith("Sandbox") else f"Sandbox{reason}"


def _make_refusal(reason: RefusalReason) -> type[SandboxRefused]:
    name = _class_name(reason.value)
    doc = f"The operator refused the spec with reason ``{reason.value}``."
    return type(
        name,
        (SandboxRefused,),
        {
            "__doc__": doc,
            "__module__": __name__,
            "reason_value": reason.value,
            "refusal_reason": reason,
        },
    )


#: One exception class per refusal reason, keyed by the reason.
REFUSAL_ERRORS: dict[RefusalReason, type[SandboxRefused]] = {
    reason: _make_refusal(reason) for reason in RefusalReason
}
for _cls in REFUSAL_ERRORS.values():
    globals()[_cls.__name__] = _cls

_OTHER_TERMINAL: dict[str, type[SandboxAcquireError]] = {
    "StartupFailed": SandboxStartupFailed,
    "StartupTimeout": SandboxStartupTimeout,
    "Failed": SandboxFailed,
    "KeyUnclean": SandboxKeyUnclean,
    "ScopeNotFound": SandboxScopeNotFound,
    "ScopeConflict": SandboxScopeConflict,
    "Expired": SandboxGone,
    "Disposing": SandboxGone,
    "Disposed": SandboxGone,
    "DisposalFailed": SandboxGone,
    "Purged": SandboxGone,
    "PurgeIncomplete": SandboxGone,
    "Suspended": SandboxSuspended,
}

#: Condition reasons that mean "still on its way"; anything else that is not Ready is terminal.
PENDING_REASONS: frozenset[str] = frozenset(
    {
        "",
        ConditionReason.PENDING.value,
        ConditionReason.CREATING.value,
        ConditionReason.ADMITTED.value,
        ConditionReason.READY.value,
    }
)

#: Reasons a Sandbox's conditions never carry: a SandboxWarmPool's, and an Event's.
NOT_SANDBOX_REASONS: frozenset[str] = frozenset(
    {
        ConditionReason.FILLING.value,
        ConditionReason.TEMPLATE_INVALID.value,
        ConditionReason.POOL_UNSUPPORTED.value,
        ConditionReason.POOL_EXHAUSTED.value,
    }
)

# Every condition reason the contract knows is pending, a refusal or mapped above: a reason added
# to the contract without a decision here fails at import, not at a caller's first acquire.
_UNMAPPED = {
    r.value
    for r in ConditionReason
    if r.value not in PENDING_REASONS
    and r.value not in NOT_SANDBOX_REASONS
    and r.value not in _OTHER_TERMINAL
    and r.value not in {x.value for x in RefusalReason}
}
if _UNMAPPED:  # pragma: no cover - a contract change without a client change
    raise ImportError(f"condition reasons without a client exception: {sorted(_UNMAPPED)}")


def refusal_error_for(reason: RefusalReason | str) -> type[SandboxRefused]:
    """The exception class for a refusal reason (``KeyError`` when it is not one)."""
    return REFUSAL_ERRORS[RefusalReason(reason)]


def acquire_error_for(reason: str) -> type[SandboxAcquireError] | None:
    """The exception class for a terminal condition reason, or None when the reason is pending."""
    if reason in PENDING_REASONS:
        return None
    try:
        return REFUSAL_ERRORS[RefusalReason(reason)]
    except ValueError:
        pass
    # An unknown reason is terminal but unexplained: report it as a failure, not a hang.
    return _OTHER_TERMINAL.get(reason, SandboxFailed)


def __getattr__(name: str) -> type[SandboxRefused]:
    # Only reached for names not generated above; present so type checkers accept imports of
    # the generated classes (they resolve to ``type[SandboxRefused]``).
    raise AttributeError(name)


# --------------------------------------------------------------------------------------------
# Handle errors


class CapabilityNotRequired(SandboxClientError, PermissionError):
    """A ``Sandbox`` method was called whose capability the spec did not require."""

    def __init__(self, *, method: str, capability: str) -> None:
        self.method = method
        self.capability = capability
        super().__init__(
            f"Sandbox.{method} needs capability {capability!r}, which this sandbox's spec does "
            f"not require; add it to spec.requires"
        )


class PathRefused(SandboxClientError, ValueError):
    """A path was refused by confinement. ``rule`` is one of :data:`PATH_RULES`."""

    def __init__(self, *, path: str, rule: str, detail: str = "") -> None:
        self.path = path
        self.rule = rule
        msg = f"path {path!r} refused: {rule}"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)


#: Every confinement rule a ``PathRefused`` may name.
PATH_RULES: tuple[str, ...] = (
    "empty",
    "backslash",
    "nul",
    "control_character",
    "parent_traversal",
    "dot_segment",
    "empty_segment",
    "absolute_outside_work_dir",
    "work_dir_itself",
    "symlinked_work_dir",
    "symlinked_parent",
    "parent_not_directory",
    "symlink_destination",
    "destination_is_directory",
    "not_a_directory",
    "not_a_regular_file",
    "exists",
)


class SandboxFileNotFound(SandboxClientError, FileNotFoundError):
    """The path (or one of its parents) does not exist in the sandbox."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"no such file in the sandbox: {path!r}")


class TransferCapExceeded(SandboxClientError):
    """A transfer would exceed a cap; nothing was transferred.

    ``direction`` is ``filesIn`` or ``filesOut`` (or ``read`` for a caller's ``max_bytes``);
    ``cap`` is ``max_bytes_per_file``, ``max_total_bytes`` or ``max_files``; ``limit`` the cap's
    value; ``actual`` what was asked; ``path`` the file that breached it (may be empty for count).
    """

    def __init__(
        self, *, direction: str, cap: str, limit: int, actual: int, path: str = ""
    ) -> None:
        self.direction = direction
        self.cap = cap
        self.limit = limit
        self.actual = actual
        self.path = path
        where = f" at {path!r}" if path else ""
        super().__init__(f"{direction}.{cap} is {limit}; {actual} refused{where}")


class TransferIntegrityError(SandboxClientError):
    """The bytes that arrived do not match what the sandbox said it would send."""

    def __init__(self, *, path: str, expected: int, received: int) -> None:
        self.path = path
        self.expected = expected
        self.received = received
        super().__init__(f"{path!r}: expected {expected} bytes, received {received}")


class ExecSetupError(SandboxClientError):
    """The command could not be started as asked (``what``: ``cwd`` missing, bad ``env`` ...)."""

    def __init__(self, *, what: str, detail: str = "") -> None:
        self.what = what
        self.detail = scrub(detail)
        super().__init__(f"exec could not start: {what}" + (f" ({self.detail})" if detail else ""))


class ExecTimeout(SandboxClientError, TimeoutError):
    """The command ran past its timeout; its process group was signalled.

    ``stdout``/``stderr`` hold the output received before the deadline; ``kill_delivered`` says
    whether the kill signal was accepted by the sandbox (not that everything died);
    ``kill_reach`` is ``group`` (the whole process group) or ``process`` or ``nothing``."""

    def __init__(
        self,
        *,
        argv: tuple[str, ...],
        timeout: float,
        stdout: bytes,
        stderr: bytes,
        kill_delivered: bool,
        kill_reach: str,
    ) -> None:
        self.argv = argv
        self.timeout = timeout
        self.stdout = stdout
        self.stderr = stderr
        self.kill_delivered = kill_delivered
        self.kill_reach = kill_reach
        if kill_delivered:
            tail = f"and its {kill_reach} was sent SIGKILL"
        else:
            tail = "and could not be signalled, so it may still be running"
        super().__init__(f"command timed out after {timeout:g}s {tail}")


class OutputBudgetExceeded(SandboxClientError):
    """The command produced more output than the budget allows; it was killed and nothing is
    returned (output is never truncated)."""

    def __init__(self, *, budget: int, received: int, kill_delivered: bool) -> None:
        self.budget = budget
        self.received = received
        self.kill_delivered = kill_delivered
        super().__init__(
            f"command output exceeded the budget of {budget} bytes (received {received}); "
            "the command was killed and its output discarded"
        )


class DataPlaneError(SandboxClientError):
    """The data plane failed (transport error, unexpected answer). ``detail`` is scrubbed."""

    def __init__(self, detail: str) -> None:
        self.detail = scrub(detail)
        super().__init__(self.detail)


# --------------------------------------------------------------------------------------------
# Collecting outputs


class OutputMissing(SandboxClientError):
    """A required declared output is not there."""

    def __init__(self, *, path: str, name: str) -> None:
        self.path = path
        self.name = name
        super().__init__(f"required output {name!r} ({path!r}) is missing")


class OutputNotRegular(SandboxClientError):
    """A declared output is a symlink, directory or something else than a regular file."""

    def __init__(self, *, path: str, kind: str) -> None:
        self.path = path
        self.kind = kind
        super().__init__(f"declared output {path!r} is a {kind}, not a regular file")


class OutputSizeUnknown(SandboxClientError):
    """The data plane could not say how large an output is."""

    def __init__(self, *, path: str) -> None:
        self.path = path
        super().__init__(f"size of declared output {path!r} is unknown")


class ArtifactNameInvalid(SandboxClientError, ValueError):
    """A landing name is not a safe relative name (``rule`` as for :class:`PathRefused`)."""

    def __init__(self, *, name: str, rule: str) -> None:
        self.name = name
        self.rule = rule
        super().__init__(f"artifact name {name!r} refused: {rule}")


class ArtifactNameCollision(SandboxClientError):
    """Two landing names are one file at the destination (identical, or differing by case or
    Unicode normalization form)."""

    def __init__(self, *, first: str, second: str) -> None:
        self.first = first
        self.second = second
        super().__init__(f"artifact names {first!r} and {second!r} collide")


class SinkRequired(SandboxClientError, ValueError):
    """Outputs with ``disposition: land`` were declared but no sink was given."""

    def __init__(self) -> None:
        super().__init__("declared outputs land at a sink, and no sink was given")


class LandingNotConfined(SandboxClientError):
    """A sink destination resolves outside the sink's root (or through a symlink)."""

    def __init__(self, *, name: str) -> None:
        self.name = name
        super().__init__(f"landing {name!r} would leave the sink's root")


class LandingExists(SandboxClientError, FileExistsError):
    """A sink destination already exists and the sink does not replace."""

    def __init__(self, *, name: str) -> None:
        self.name = name
        super().__init__(f"landing {name!r} already exists")
