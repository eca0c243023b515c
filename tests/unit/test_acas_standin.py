"""The stand-in as its own process (`python -m tests.acas_standin`), steered over /_standin/,
as out-of-process operator tests use it; and the threaded variant for synchronous callers."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandbox_operator.acas.api import AcasClient
from sandbox_operator.acas.auth import StaticTokenProvider
from sandbox_operator.acas.errors import AcasServerError
from tests.acas_standin import DEFAULT_TOKEN, ThreadedStandin
from tests.fixtures.acas import make_config

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def standin_process() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.acas_standin", "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on" in line, line
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_module_process_with_control_routes(standin_process: str) -> None:
    async with (
        httpx.AsyncClient(base_url=standin_process) as control,
        AcasClient(make_config(standin_process), StaticTokenProvider(DEFAULT_TOKEN)) as client,
    ):
        created = await client.create_sandbox({"labels": {"k": "v"}})
        await control.post(
            "/_standin/faults",
            json={"operation": "AzureSandboxes_Get", "status": 500, "code": "Boom"},
        )
        with pytest.raises(AcasServerError) as info:
            await client.get_sandbox(created.id)
        assert info.value.code == "Boom"
        await control.post("/_standin/config", json={"deleteLeavesListed": True})
        await client.delete_sandbox(created.id)
        state = (await control.get("/_standin/state")).json()
        assert [s["id"] for s in state["sandboxes"]] == [created.id]
        assert state["calls"]["AzureSandboxes_Delete"] == 1
        await control.post("/_standin/reset")
        await control.post("/_standin/config", json={"expiredTokens": [DEFAULT_TOKEN]})
        response = await control.get(
            "/subscriptions/s/resourceGroups/r/sandboxGroups/g/sandboxes",
            params={"api-version": "2026-09-01-preview"},
            headers={"Authorization": f"Bearer {DEFAULT_TOKEN}"},
        )
        assert response.status_code == 401


def test_threaded_standin_serves_sync_callers() -> None:
    with ThreadedStandin() as standin:
        started = time.monotonic()
        response = httpx.get(
            f"{standin.base_url}/subscriptions/s/resourceGroups/r/sandboxGroups/g/sandboxes",
            params={"api-version": "2026-09-01-preview"},
            headers={"Authorization": f"Bearer {DEFAULT_TOKEN}"},
        )
        assert response.status_code == 200 and response.json() == []
        assert time.monotonic() - started < 5
        assert standin.state.calls["AzureSandboxes_List"] == 1


async def test_slow_fault_does_not_block_other_requests() -> None:
    with ThreadedStandin() as standin:
        standin.state.add_fault(operation="AzureSandboxes_Get", delay=1.0)
        async with AcasClient(
            make_config(standin.base_url), StaticTokenProvider(DEFAULT_TOKEN)
        ) as client:
            created = await client.create_sandbox({})
            slow = asyncio.create_task(client.get_sandbox(created.id))
            started = time.monotonic()
            assert await client.list_sandboxes() != []
            assert time.monotonic() - started < 0.9
            await slow


@pytest.mark.skipif(os.geteuid() != 0, reason="the rooted stand-in needs root")
async def test_rooted_sandboxes_have_their_own_root_for_files_and_executions() -> None:
    """`rooted`: an absolute path means one thing to the file API and to an execution (the
    sandbox's directory is their `/`), a link's absolute target resolves inside the sandbox, the
    host's system directories are read-only to an execution, and two sandboxes share nothing."""
    from tests.acas_standin import StandinServer

    async with StandinServer() as standin:
        standin.state.rooted = True
        for name in ("one", "two"):
            standin.state.seed_sandbox(name)
        async with AcasClient(
            make_config(standin.base_url, timeouts={"execute": 30}),
            StaticTokenProvider(DEFAULT_TOKEN),
        ) as client:
            await client.write_file("one", "/work/a.txt", b"from the file api", create_dirs=True)
            seen = await client.execute_command("one", ["cat", "/work/a.txt"])
            assert (seen.exit_code, seen.stdout) == (0, "from the file api")
            made = await client.execute_command(
                "one", ["sh", "-c", "echo x > /work/b.txt; ln -s /work/b.txt /work/link"]
            )
            assert made.exit_code == 0, made
            assert await client.read_file("one", "/work/b.txt") == b"x\n"
            assert await client.read_file("one", "/work/link") == b"x\n"  # followed, inside
            assert (await client.stat_file("one", "/work/link")).is_symlink
            other = await client.execute_command("two", ["test", "-e", "/work/a.txt"])
            assert other.exit_code == 1  # the other sandbox's root holds nothing of this one
            host = await client.execute_command("one", ["sh", "-c", "echo x > /usr/x"])
            assert host.exit_code != 0 and not Path("/usr/x").exists()  # noqa: ASYNC240
