"""#37 item 4 on the real node, through the client, on runc and gVisor: an exec the caller stops
owning whose kill does not reach its process group leaves its sandbox unclean, whichever way it
ended (cancelled, timed out, over its output budget, its stream dropped), and the
conversation's next acquire never gets that pod. A dropped stream whose kill does reach the
group is killed and leaves the sandbox in use.

The failures are the network's (tests/fixtures/exec_link.py): the data plane reaches the API
server through a TCP link the test cuts (a dropped exec stream) or closes to new connections (the
kill's second exec cannot reach the sandbox). The cluster, the kubelet, the runtime and the
command are real. The maf backend's twin: tests/maf/test_unclean_cluster.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from sandbox_operator.client import (
    ExecCancelled,
    ExecStreamLost,
    ExecTimeout,
    OutputBudgetExceeded,
    Sandbox,
    SandboxClient,
    SandboxUnclean,
    pod_dataplane,
)
from sandbox_operator.client.dataplane import DataPlane
from sandbox_operator.contract import SandboxSpec
from tests.fixtures.client_specs import WORK, runc_first_config, shell_spec
from tests.fixtures.exec_link import ExecLink, linked_client
from tests.fixtures.operator import Kit

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: Started, then waits for ``go`` (so the test chooses when it overruns), then runs on.
COMMAND = "touch began; while [ ! -e go ]; do sleep 0.1; done; head -c 1000000 /dev/zero; sleep 600"


@pytest.fixture(scope="module")
def module_operator_config() -> dict[str, Any]:
    """One operator for the module: runc first, so a spec whose floor is ``container`` runs on
    runc and one whose floor is ``hardened_container`` on gVisor (perSpec: the first backend
    that passes)."""
    return runc_first_config()


def spec(runtime: str) -> SandboxSpec:
    return shell_spec(runtime)


def served(kit: Kit, sb: Sandbox) -> tuple[str, str, str]:
    """The Sandbox's uid, its pod's name (named after the Sandbox: a replacement has the same)
    and that pod's uid (a replacement's differs)."""
    obj = sb.resource or {}
    uid = str((obj.get("metadata") or {}).get("uid") or "")
    pod = str(((obj.get("status") or {}).get("servedBy") or {}).get("name") or "")
    return uid, pod, str(kit.core.read_namespaced_pod(pod, kit.ns).metadata.uid)


async def exists(plane: DataPlane, name: str) -> bool:
    done = await plane.exec(["test", "-e", name], cwd=WORK, timeout=30)
    return done.exit_code == 0


async def until(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.2)


async def stop_owning(case: str, sb: Sandbox, eyes: DataPlane, link: ExecLink) -> BaseException:
    """Run :data:`COMMAND` and stop owning it as ``case`` says, with the kill after it refused
    by the link; returns what the exec raised."""
    timeout = 20.0 if case == "timeout" else 600.0
    call = asyncio.ensure_future(sb.exec(COMMAND, timeout=timeout, max_output_bytes=10_000))
    await until(lambda: exists(eyes, "began"), "the command never started")
    link.refuse()  # from here on, no new exec reaches the sandbox: the kill cannot
    if case == "cancel":
        call.cancel()
    elif case == "budget":
        await eyes.exec(["touch", "go"], cwd=WORK, timeout=30)  # over the budget now
    elif case == "stream":
        assert link.cut() >= 1  # the exec stream drops; the command runs on
    try:
        await call
    except BaseException as exc:  # ExecCancelled is a CancelledError
        return exc
    raise AssertionError("the exec returned")


EXPECTED: dict[str, type[BaseException]] = {
    "cancel": ExecCancelled,
    "timeout": ExecTimeout,
    "budget": OutputBudgetExceeded,
    "stream": ExecStreamLost,
}


async def acquire(c: SandboxClient, scope: str, runtime: str) -> Sandbox:
    return await c.acquire(scope, "agents/unclean", spec(runtime), timeout=240)


@pytest.mark.parametrize("case", sorted(EXPECTED))
@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
async def test_an_exec_whose_kill_cannot_reach_its_group_retires_the_pod(
    module_kit: Kit, kubeconfig: str, runtime: str, case: str
) -> None:
    ns = module_kit.ns
    async with linked_client(ns, kubeconfig, default_timeout=240) as (c, link):
        scope = await c.create_scope(scope="unclean", thread_id=uuid.uuid4().hex[:8])
        sb = await acquire(c, scope, runtime)
        uid, pod, pod_uid = served(module_kit, sb)
        assert (sb.resource or {})["status"]["backend"] == runtime
        eyes = pod_dataplane(c.ws_api, ns, pod)  # the test's own view, not through the link

        raised = await stop_owning(case, sb, eyes, link)
        assert isinstance(raised, EXPECTED[case]), repr(raised)
        assert getattr(raised, "kill_reach", None) == "nothing", repr(raised)
        assert sb.unclean is not None, "the handle still counts the sandbox clean"
        link.refuse(False)  # the refusal below is the handle's, not the network's
        with pytest.raises(SandboxUnclean):
            await sb.exec(["true"], timeout=30)

        again = await acquire(c, scope, runtime)
        new_uid, _, new_pod_uid = served(module_kit, again)
        assert new_uid != uid and new_pod_uid != pod_uid, "the next acquire got the unclean pod"
        assert (await again.exec(["echo", "ok"], timeout=60)).stdout == b"ok\n"
        # What the old pod was running went with it: the new pod never saw the old command.
        assert not await exists(eyes, "began")


@pytest.mark.parametrize("runtime", ["runc", "gvisor"])
async def test_a_dropped_stream_is_killed_with_its_group_and_the_pod_stays_in_use(
    module_kit: Kit, kubeconfig: str, runtime: str
) -> None:
    """The kill after a dropped stream reaches the group: the command's late write never
    appears, and the sandbox (the same pod) serves the next acquire."""
    ns = module_kit.ns
    async with linked_client(ns, kubeconfig, default_timeout=240) as (c, link):
        scope = await c.create_scope(scope="unclean", thread_id=uuid.uuid4().hex[:8])
        sb = await acquire(c, scope, runtime)
        before = served(module_kit, sb)
        eyes = pod_dataplane(c.ws_api, ns, before[1])
        call = asyncio.ensure_future(sb.exec("touch began; sleep 4; touch late", timeout=600))
        await until(lambda: exists(eyes, "began"), "the command never started")
        assert link.cut() >= 1
        with pytest.raises(ExecStreamLost) as raised:
            await call
        assert raised.value.kill_delivered and raised.value.kill_reach == "group"
        await asyncio.sleep(5)  # past the late write's time
        assert not await exists(eyes, "late"), "the command ran on after its stream dropped"
        assert sb.unclean is None
        assert (await sb.exec(["echo", "ok"], timeout=60)).stdout == b"ok\n"
        assert served(module_kit, await acquire(c, scope, runtime)) == before
