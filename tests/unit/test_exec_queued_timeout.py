"""An exec's timeout counts from the call: a wait for the sandbox (a resume) is spent from it, and
a wait that spends it all is ExecQueuedTimeout (nothing ran), never ExecTimeout (something
overran) nor an exec that starts late with its whole bound (#25 item 9)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sandbox_operator.client.dataplane import ExecResult
from sandbox_operator.client.errors import ExecQueuedTimeout, ExecTimeout, SandboxClientError
from sandbox_operator.client.served import ServedPlane


class RecordingPlane:
    """A data plane that records each exec's argv and timeout and answers at once."""

    def __init__(self) -> None:
        self.execs: list[tuple[tuple[str, ...], float]] = []

    async def exec(self, argv: Any, **options: Any) -> ExecResult:
        self.execs.append((tuple(argv), options["timeout"]))
        return ExecResult(exit_code=0, stdout=b"", stderr=b"")

    async def close(self) -> None:
        return None


class SlowResumes:
    """A client whose resume takes ``delay`` seconds and then serves ``plane``."""

    def __init__(self, plane: RecordingPlane, delay: float) -> None:
        self.served: ServedPlane | None = None
        self.plane = plane
        self.delay = delay
        self.resumes = 0

    async def resume(self) -> None:
        self.resumes += 1
        await asyncio.sleep(self.delay)
        assert self.served is not None
        await self.served.serve(self.plane, None)  # type: ignore[arg-type]

    async def is_suspended(self, name: str) -> bool:
        return False


def served_plane(inner: RecordingPlane, client: SlowResumes) -> ServedPlane:
    """The served plane of the Sandbox ``sbx``, resumed through ``client`` (looked up at each
    use, so a test may replace its methods)."""

    def connect(obj: Any) -> Any:
        return inner

    async def resume() -> None:
        await client.resume()

    async def is_suspended(name: str) -> bool:
        return await client.is_suspended(name)

    served = ServedPlane(
        inner,  # type: ignore[arg-type]
        None,
        sandbox="sbx",
        namespace="",
        connect=connect,
        resume=resume,
        is_suspended=is_suspended,
    )
    client.served = served
    return served


def suspended_plane(delay: float) -> tuple[ServedPlane, SlowResumes, RecordingPlane]:
    inner = RecordingPlane()
    client = SlowResumes(inner, delay)
    served = served_plane(inner, client)
    served.inner = None  # suspended: the next use resumes
    return served, client, inner


async def test_a_resume_longer_than_the_timeout_is_a_queued_timeout() -> None:
    served, client, inner = suspended_plane(delay=5.0)
    with pytest.raises(ExecQueuedTimeout) as caught:
        await served.exec(["true"], cwd="/workspace", timeout=0.2)
    err = caught.value
    assert isinstance(err, TimeoutError) and isinstance(err, SandboxClientError)
    assert not isinstance(err, ExecTimeout)
    assert err.argv == ("true",) and err.timeout == 0.2 and err.waited_for == "resume"
    assert 0.2 <= err.waited < 5.0
    assert client.resumes == 1 and inner.execs == []  # nothing ran


async def test_the_command_gets_what_the_wait_left() -> None:
    served, _, inner = suspended_plane(delay=0.3)
    await served.exec(["true"], cwd="/workspace", timeout=2.0)
    [(argv, bound)] = inner.execs
    assert argv == ("true",)
    assert bound <= 2.0 - 0.3  # wall-clock from the call, not from the start of the command


async def test_a_live_plane_gets_nearly_the_whole_bound() -> None:
    inner = RecordingPlane()
    served = served_plane(inner, SlowResumes(inner, 0.0))
    await served.exec(["true"], cwd="/workspace", timeout=2.0)
    [(_, bound)] = inner.execs
    assert 1.9 < bound <= 2.0


async def test_a_resume_failure_is_its_own_error_not_a_queued_timeout() -> None:
    served, client, _ = suspended_plane(delay=0.0)

    async def refuse() -> None:
        raise TimeoutError("a transport's own timeout")

    client.resume = refuse  # type: ignore[method-assign]
    with pytest.raises(TimeoutError) as caught:
        await served.exec(["true"], cwd="/workspace", timeout=5.0)
    assert not isinstance(caught.value, ExecQueuedTimeout)


def test_the_message_names_no_command() -> None:
    err = ExecQueuedTimeout(
        argv=("curl", "http://10.0.0.1/?token=abc"), timeout=1.0, waited=1.0, waited_for="resume"
    )
    assert "10.0.0.1" not in str(err) and "abc" not in str(err)
