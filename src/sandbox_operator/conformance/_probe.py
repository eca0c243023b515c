"""Probe machinery: named probes, failures collected and reported together, and the few
sandbox chores (a scratch area, ``cat``, ``test -e``, "is it still running") every suite needs."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, ParamSpec, TypeVar

from sandbox_operator.client.dataplane import ExecResult
from sandbox_operator.client.errors import CapabilityNotRequired
from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.contract import Capability

E = TypeVar("E", bound=BaseException)
P = ParamSpec("P")

#: The ``Sandbox`` method each capability gates, and the arguments a suite tries it with on a
#: spec that did not require the capability (the call must be refused before it does anything).
GATED: Final[Mapping[Capability, tuple[str, tuple[object, ...]]]] = {
    Capability.EXEC: ("exec", (["true"],)),
    Capability.FILES_IN: ("write_file", ("x", b"")),
    Capability.FILES_OUT: ("read_file", ("x",)),
    Capability.FILES_LIST: ("list_dir", ()),
    Capability.FILES_DELETE: ("remove", ("x",)),
}


class ProbeFailed(AssertionError):
    """One probe's expectation did not hold."""


@dataclass(frozen=True)
class ProbeFailure:
    probe: str
    detail: str


class ConformanceError(AssertionError):
    """Every failed probe of a suite, reported together."""

    def __init__(self, suite: str, failures: list[ProbeFailure]) -> None:
        self.suite = suite
        self.failures = list(failures)
        lines = [f"{suite}: {len(failures)} probe(s) failed"]
        lines += [f"  - {f.probe}: {f.detail}" for f in failures]
        super().__init__("\n".join(lines))

    @property
    def probes(self) -> list[str]:
        return [f.probe for f in self.failures]


@dataclass
class ConformanceReport:
    """The outcome of one suite: which probes passed, which failed and why, which were skipped
    (a capability the spec did not require)."""

    suite: str
    passed: list[str] = field(default_factory=list)
    failures: list[ProbeFailure] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failed(self) -> list[str]:
        return [f.probe for f in self.failures]

    def raise_for_failures(self) -> None:
        if self.failures:
            raise ConformanceError(self.suite, self.failures)


class Probes:
    """Runs named probes against one suite; never stops at the first failure."""

    def __init__(self, suite: str) -> None:
        self.report = ConformanceReport(suite)
        self._start = time.monotonic()

    async def run(self, name: str, fn: Callable[[], Awaitable[None]]) -> None:
        try:
            await fn()
        except ProbeFailed as exc:
            self.report.failures.append(ProbeFailure(name, str(exc)))
        except Exception as exc:
            self.report.failures.append(
                ProbeFailure(name, f"unexpected {type(exc).__name__}: {exc}")
            )
        else:
            self.report.passed.append(name)

    async def run_all(self, *probes: Callable[[], Awaitable[None]]) -> None:
        """Run each probe, in order, under its function's name."""
        for probe in probes:
            await self.run(probe.__name__, probe)

    async def gate(self, sandbox: Sandbox, capability: Capability) -> bool:
        """Whether the suite for ``capability`` can run: the spec requires it and ``exec`` (which
        sets up the fixtures). When it cannot, the rest is skipped; and when ``capability``
        itself was not required, the method it gates must refuse (:meth:`refuses`)."""
        needed = dict.fromkeys((Capability.EXEC, capability))
        missing = [c.value for c in needed if c not in sandbox.required]
        if not missing:
            return True
        if capability not in sandbox.required:
            await self.refuses(sandbox, capability)
        self.skip(f"all (spec does not require {', '.join(missing)})")
        return False

    async def refuses(self, sandbox: Sandbox, capability: Capability) -> None:
        """Probe that the method ``capability`` gates (:data:`GATED`), on a spec that did not
        require it, is refused with :class:`CapabilityNotRequired` naming it."""
        method, args = GATED[capability]

        async def refused() -> None:
            call = getattr(sandbox, method)(*args)
            await expect_raises(CapabilityNotRequired, call, method, capability=capability.value)

        await self.run(f"{method}_refused_without_capability", refused)

    @contextlib.asynccontextmanager
    async def guard(self) -> AsyncIterator[None]:
        """Record a failure of the suite's own setup as a probe named ``setup``."""
        try:
            yield
        except Exception as exc:
            self.report.failures.append(ProbeFailure("setup", f"{type(exc).__name__}: {exc}"))

    def skip(self, name: str) -> None:
        self.report.skipped.append(name)

    def done(self) -> ConformanceReport:
        self.report.seconds = time.monotonic() - self._start
        return self.report


async def expect_raises(
    exc_type: type[E] | tuple[type[BaseException], ...],
    awaitable: Awaitable[Any],
    what: str,
    **fields: Any,
) -> BaseException:
    """The awaitable must raise ``exc_type`` (a wrong type is a failure) with the given fields."""
    try:
        value = await awaitable
    except exc_type as exc:
        for key, want in fields.items():
            got = getattr(exc, key, None)
            if got != want:
                raise ProbeFailed(f"{what}: {key}={got!r}, expected {want!r}") from None
        return exc
    except Exception as exc:
        names = (
            exc_type.__name__
            if isinstance(exc_type, type)
            else " or ".join(t.__name__ for t in exc_type)
        )
        raise ProbeFailed(
            f"{what}: raised {type(exc).__name__} ({exc}), expected {names}"
        ) from None
    raise ProbeFailed(f"{what}: did not raise (returned {value!r:.80})")


def asserting(
    suite: Callable[P, Awaitable[ConformanceReport]],
) -> Callable[P, Awaitable[ConformanceReport]]:
    """The ``assert_*`` form of a ``check_*`` suite: the same run, raising one
    :class:`ConformanceError` that lists every failed probe (the report when all passed)."""

    async def run(*args: P.args, **kwargs: P.kwargs) -> ConformanceReport:
        report = await suite(*args, **kwargs)
        report.raise_for_failures()
        return report

    run.__name__ = run.__qualname__ = (
        f"{suite.__name__.replace('check_', 'assert_', 1)}_conformance"
    )
    run.__doc__ = f"Run :func:`{suite.__name__}`; raise :class:`ConformanceError` on any failure."
    return run


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ProbeFailed(message)


def token() -> str:
    return secrets.token_hex(5)


async def sh(sandbox: Sandbox, script: str, *, timeout: float = 60.0) -> ExecResult:  # noqa: ASYNC109
    """Run a setup/verification script in the sandbox (raises when it fails)."""
    res = await sandbox.exec(["sh", "-c", script], cwd="/", timeout=timeout)
    if res.exit_code != 0:
        raise ProbeFailed(
            f"setup script failed ({res.exit_code}): {script[:120]!r}: {res.stderr_text[:200]}"
        )
    return res


def q(text: str) -> str:
    return shlex.quote(text)


async def cat(sandbox: Sandbox, absolute: str) -> bytes:
    """A file's bytes as ``cat`` in the sandbox sees them (not through the file methods)."""
    res = await sandbox.exec(["cat", absolute], cwd="/")
    if res.exit_code != 0:
        raise AssertionError(f"cat {absolute!r} failed: {res.stderr_text[:200]}")
    return res.stdout


async def exists(sandbox: Sandbox, absolute: str) -> bool:
    """Whether anything (a dangling link too) is at ``absolute``, checked with ``test``."""
    res = await sandbox.exec(["sh", "-c", 'test -e "$1" || test -L "$1"', "sh", absolute], cwd="/")
    return res.exit_code == 0


_RUNNING = (
    'for p in "$@"; do kill -0 "$p" 2>/dev/null && '
    "! grep -q '^State:.*Z' /proc/$p/status 2>/dev/null && echo \"$p\"; done; true"
)


async def still_running(sandbox: Sandbox, pids: Sequence[int], *, tries: int = 20) -> list[int]:
    """Which of ``pids`` are alive (zombies count as gone) after waiting up to ``tries`` half
    seconds for every one of them to go."""
    alive = list(pids)
    for attempt in range(tries):
        res = await sandbox.exec(["sh", "-c", _RUNNING, "sh", *map(str, pids)], cwd="/")
        alive = [int(p) for p in res.stdout_text.split()]
        if not alive or attempt == tries - 1:
            break
        await asyncio.sleep(0.5)
    return alive


class Area:
    """A scratch directory for one suite under the work dir, plus one outside it.

    ``setup``, when given, is a shell script run in the area once both exist, with ``$OUT``
    naming the outside directory: the suite's fixture of files and links."""

    def __init__(self, sandbox: Sandbox, suite: str, *, setup: str = "") -> None:
        self.sandbox = sandbox
        self.rel = f"conformance-{suite}-{token()}"
        self.abs = f"{sandbox.work_dir}/{self.rel}"
        self.outside = ""
        self.setup = setup

    async def __aenter__(self) -> Area:
        res = await sh(
            self.sandbox,
            f'mkdir -p {q(self.abs)} && d=$(mktemp -d) && chmod 755 "$d" && echo "$d"',
        )
        self.outside = res.stdout_text.strip()
        if self.setup:
            try:
                await sh(self.sandbox, f"cd {q(self.abs)} && OUT={q(self.outside)} && {self.setup}")
            except BaseException:
                await self.__aexit__()
                raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            await self.sandbox.exec(
                ["rm", "-rf", self.abs, self.outside or self.abs], cwd="/", timeout=60
            )

    def path(self, name: str) -> str:
        """The path, relative to the work dir, of ``name`` in this area."""
        return f"{self.rel}/{name}"

    def absolute(self, name: str) -> str:
        return f"{self.abs}/{name}"
