"""Probe machinery: named probes, failures collected and reported together."""

from __future__ import annotations

import contextlib
import secrets
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sandbox_operator.client.dataplane import ExecResult
from sandbox_operator.client.sandbox import Sandbox

E = TypeVar("E", bound=BaseException)


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


class Area:
    """A scratch directory for one suite under the work dir, plus one outside it."""

    def __init__(self, sandbox: Sandbox, suite: str) -> None:
        self.sandbox = sandbox
        self.rel = f"conformance-{suite}-{token()}"
        self.abs = f"{sandbox.work_dir}/{self.rel}"
        self.outside = ""

    async def __aenter__(self) -> Area:
        res = await sh(
            self.sandbox,
            f'mkdir -p {q(self.abs)} && d=$(mktemp -d) && chmod 755 "$d" && echo "$d"',
        )
        self.outside = res.stdout_text.strip()
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
