"""The pod data plane (pods/exec through the API server) on plain pods, no operator: every
conformance suite on runc and gVisor, with the busybox and the python images, and the
host_tools suite (the client's channel over exec + files) on both with the python image; the
same suites through an exec session (docs/exec-session.md) with the python image, a launcher its
guest kills mid-command, and the busybox image falling back to plain pods/exec."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from sandbox_operator.client import (
    ExecCancelled,
    ExecStreamLost,
    Sandbox,
    SandboxClient,
    SessionExecTransport,
    pod_dataplane,
)
from sandbox_operator.conformance import check_call_scope, check_host_tools, check_sandbox
from sandbox_operator.contract import Capability, SandboxSpec
from tests.fixtures.pods import plain_pod

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BUSYBOX = "sandbox-operator.dev/busybox:1"
PYTHON = "sandbox-operator.dev/python:1"


def pod_manifest(name: str, runtime_class: str, image: str) -> dict[str, Any]:
    return plain_pod(name, runtime_class, image)


@pytest.fixture
def make_pod(core_v1: k8s.CoreV1Api, namespace: str) -> Iterator[Callable[[str, str, str], str]]:
    def make(name: str, runtime_class: str, image: str) -> str:
        core_v1.create_namespaced_pod(namespace, pod_manifest(name, runtime_class, image))
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            pod = core_v1.read_namespaced_pod(name, namespace)
            if pod.status.phase == "Running" and all(
                cs.ready for cs in pod.status.container_statuses or []
            ):
                return name
            if pod.status.phase in ("Failed", "Succeeded"):
                raise AssertionError(f"pod {name} ended: {pod.status}")
            time.sleep(0.5)
        raise AssertionError(f"pod {name} not running in time")

    yield make


def spec(image: str) -> SandboxSpec:
    return SandboxSpec(
        kind="conformance",
        image=image,
        work_dir="/workspace",
        requires=frozenset(
            {
                Capability.EXEC,
                Capability.RUN_CODE,
                Capability.FILES_IN,
                Capability.FILES_OUT,
                Capability.FILES_LIST,
                Capability.FILES_DELETE,
            }
        ),
    )


@pytest.fixture
async def aclient(kubeconfig: str, namespace: str) -> AsyncIterator[SandboxClient]:
    c = await SandboxClient.from_kubeconfig(namespace, kubeconfig=kubeconfig)
    yield c
    await c.close()


def handle(c: SandboxClient, pod: str, image: str) -> Sandbox:
    return Sandbox(spec(image), pod_dataplane(c.ws_api, c.namespace, pod), name=pod)


@pytest.mark.parametrize("runtime_class", ["runc", "gvisor"])
@pytest.mark.parametrize("image", [BUSYBOX, PYTHON], ids=["busybox", "python"])
async def test_conformance_on_plain_pods(
    aclient: SandboxClient,
    make_pod: Callable[[str, str, str], str],
    runtime_class: str,
    image: str,
) -> None:
    tag = "bb" if image == BUSYBOX else "py"
    pod = make_pod(f"conf-{runtime_class}-{tag}", runtime_class, image)
    sb = handle(aclient, pod, image)
    reports = await check_sandbox(sb)
    failures = {r.suite: r.failures for r in reports if r.failures}
    assert not failures, failures
    assert all(not r.skipped for r in reports)
    if image == PYTHON:
        res = await sb.run_code("import sys; print(sys.version_info.major)")
        assert res.stdout == b"3\n"


@pytest.mark.parametrize("runtime_class", ["runc", "gvisor"])
async def test_conformance_through_an_exec_session(
    aclient: SandboxClient, make_pod: Callable[[str, str, str], str], runtime_class: str
) -> None:
    """#39 item 2: every suite through one exec session (8 MiB each way too); then the guest
    kills its own launcher mid-command: that command's stream is lost, its group (a background
    child too) killed over a fresh pods/exec, the sandbox clean, and the next command reopens
    the session."""
    pod = make_pod(f"session-{runtime_class}", runtime_class, PYTHON)
    plane = pod_dataplane(aclient.ws_api, aclient.namespace, pod, session=True)
    transport = plane.transport
    assert isinstance(transport, SessionExecTransport)
    sb = Sandbox(spec(PYTHON), plane, name=pod)
    reports = await check_sandbox(sb)
    failures = {r.suite: r.failures for r in reports if r.failures}
    assert not failures, failures
    data = os.urandom(8 * 1024 * 1024)
    await sb.write_file("big.bin", data)
    assert await sb.read_file("big.bin") == data
    assert transport.opened >= 1 and not transport.unavailable
    opened = transport.opened
    # The launcher starts the wrapper's inner script itself: $PPID is the launcher. It is killed
    # once the pid line is out (a command that kills it sooner leaves no pid to kill it by: the
    # sandbox is judged unclean instead; docs/exec-session.md).
    script = "(sleep 3; touch child) & sleep 1; kill -9 $PPID; sleep 2; touch late"
    with pytest.raises(ExecStreamLost) as lost:
        await sb.exec(script, timeout=60)
    assert lost.value.kill_delivered and lost.value.kill_reach == "group"
    assert sb.unclean is None
    assert (await sb.exec(["echo", "again"])).stdout == b"again\n"
    assert transport.opened == opened + 1
    await asyncio.sleep(3)  # past both writes' time
    assert not await sb.exists("late") and not await sb.exists("child")
    await plane.close()


@pytest.mark.parametrize("runtime_class", ["runc", "gvisor"])
async def test_host_tools_conformance_on_plain_pods(
    aclient: SandboxClient, make_pod: Callable[[str, str, str], str], runtime_class: str
) -> None:
    pod = make_pod(f"hosttools-{runtime_class}", runtime_class, PYTHON)
    host_tools_spec = SandboxSpec(
        kind="conformance",
        image=PYTHON,
        work_dir="/workspace",
        requires=frozenset(
            {Capability.EXEC, Capability.FILES_IN, Capability.FILES_OUT, Capability.HOST_TOOLS}
        ),
    )
    sb = Sandbox(host_tools_spec, pod_dataplane(aclient.ws_api, aclient.namespace, pod), name=pod)
    report = await check_host_tools(sb)
    assert report.ok, report.failures
    assert report.passed and not report.skipped


@pytest.mark.parametrize("runtime_class", ["runc", "gvisor"])
async def test_call_scope_between_two_pods(
    aclient: SandboxClient, make_pod: Callable[[str, str, str], str], runtime_class: str
) -> None:
    a = handle(aclient, make_pod(f"call-a-{runtime_class}", runtime_class, BUSYBOX), BUSYBOX)
    b = handle(aclient, make_pod(f"call-b-{runtime_class}", runtime_class, BUSYBOX), BUSYBOX)
    report = await check_call_scope(a, b)
    assert report.ok, report.failures


@pytest.mark.parametrize("runtime_class", ["runc", "gvisor"])
async def test_large_binary_round_trip(
    aclient: SandboxClient, make_pod: Callable[[str, str, str], str], runtime_class: str
) -> None:
    pod = make_pod(f"big-{runtime_class}", runtime_class, BUSYBOX)
    sb = handle(aclient, pod, BUSYBOX)
    data = os.urandom(8 * 1024 * 1024)
    await sb.write_file("big.bin", data)
    assert (await sb.stat("big.bin")).size == len(data)
    assert await sb.read_file("big.bin") == data
    # No python3 in busybox: an exec session falls back to plain pods/exec (#39 item 2).
    fallback = pod_dataplane(aclient.ws_api, aclient.namespace, pod, session=True)
    assert (await fallback.exec(["true"], cwd="/", timeout=60)).exit_code == 0
    assert isinstance(fallback.transport, SessionExecTransport)
    assert fallback.transport.unavailable and fallback.transport.opened == 0
    await fallback.close()


@pytest.mark.parametrize("runtime_class", ["runc", "gvisor"])
async def test_a_cancelled_exec_is_killed_with_its_group_in_the_pod(
    aclient: SandboxClient, make_pod: Callable[[str, str, str], str], runtime_class: str
) -> None:
    """#25 item 1, as reported: an exec the caller cancels ran on in the pod (closing the exec
    stream stops nothing) and a file it wrote after the cancel appeared. Now its process group
    is sent SIGKILL before the cancellation goes on: neither the command's late write nor a
    background child's appears, and the handle says what the kill reached."""
    sb = handle(aclient, make_pod(f"cancel-{runtime_class}", runtime_class, BUSYBOX), BUSYBOX)
    script = "touch began; (sleep 2; touch child) & sleep 2; touch late"
    call = asyncio.ensure_future(sb.exec(script, timeout=60))
    deadline = time.monotonic() + 30
    while not await sb.exists("began"):
        assert time.monotonic() < deadline, "the command never started"
        await asyncio.sleep(0.1)
    call.cancel()
    with pytest.raises(ExecCancelled) as raised:
        await call
    assert raised.value.kill_delivered and raised.value.kill_reach == "group"
    await asyncio.sleep(3.5)  # past both writes' time
    assert not await sb.exists("late") and not await sb.exists("child")
    assert sb.unclean is None  # the kill reached the group: the sandbox is clean
