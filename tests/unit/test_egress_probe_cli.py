"""``check-egress`` (``sandbox_operator.egress.probe.main``) end to end on this machine: a
stand-in API server answers the Sandbox read and serves ``pods/exec`` as the API server does (a
v4 channel websocket), running the command it is given here, so the real probe script reaches a
real local server. The command reads and execs through the operator's async client; the sync
``kubernetes`` client is imported nowhere in src/."""

from __future__ import annotations

import ast
import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from sandbox_operator.egress import probe
from sandbox_operator.testing.egress import LocalServer, start_http_server

NS, NAME, POD = "ns", "sbx", "sbx-pod"
SRC = Path(__file__).resolve().parents[2] / "src" / "sandbox_operator"


class StandinApi:
    """The two calls check-egress makes: read the Sandbox, exec in its pod."""

    def __init__(self, sandbox: dict[str, Any]) -> None:
        self.sandbox = sandbox
        self.execs: list[list[str]] = []

    async def read_sandbox(self, request: web.Request) -> web.Response:
        return web.json_response(self.sandbox)

    async def exec(self, request: web.Request) -> web.WebSocketResponse:
        argv = request.query.getall("command")
        self.execs.append(argv)
        ws = web.WebSocketResponse(protocols=("v4.channel.k8s.io",))
        await ws.prepare(request)
        # The sandbox's python3 is this interpreter; no proxy variables, as in a closed pod.
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *argv[1:], stdout=asyncio.subprocess.PIPE, env={}
        )
        out, _ = await proc.communicate()
        # Split across frames as the API server may, the stdout channel first byte of each.
        for i in range(0, len(out), 50):
            await ws.send_bytes(b"\x01" + out[i : i + 50])
        await ws.send_bytes(b"\x03" + json.dumps({"status": "Success"}).encode())
        await ws.close()
        return ws


@pytest.fixture
async def upstream() -> AsyncIterator[LocalServer]:
    server = await start_http_server(body=lambda head: b"upstream-ok\n")
    yield server
    await server.close()


async def _serve(api: StandinApi, tmp_path: Path) -> tuple[web.AppRunner, Path]:
    app = web.Application()
    base = f"/apis/sandbox-operator.dev/v1alpha1/namespaces/{NS}/sandboxes/{NAME}"
    app.router.add_get(base, api.read_sandbox)
    app.router.add_get(f"/api/v1/namespaces/{NS}/pods/{POD}/exec", api.exec)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    return runner, path


def _sandbox(egress: str, served_kind: str = "Pod") -> dict[str, Any]:
    return {
        "apiVersion": "sandbox-operator.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"egress": egress},
        "status": {"servedBy": {"kind": served_kind, "name": POD, "namespace": NS}},
    }


async def _check(
    api: StandinApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str
) -> int:
    runner, kubeconfig = await _serve(api, tmp_path)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    try:
        argv = ["--namespace", NS, "--sandbox", NAME, *args]
        # main runs its own event loop (it is a command), so off this test's loop.
        return await asyncio.to_thread(probe.main, argv)
    finally:
        await runner.cleanup()


async def test_check_egress_probes_in_the_pod_and_judges_one_target(
    upstream: LocalServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # One target: the probe's whole report is one JSON document, read back as text.
    api = StandinApi(_sandbox("unrestricted"))
    code = await _check(
        api, tmp_path, monkeypatch,
        "--reachable", f"127.0.0.1:{upstream.port}", "--body-contains", "upstream-ok",
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"sandbox {NS}/{NAME}: egress unrestricted" in out and "[ok]" in out, out
    assert len(api.execs) == 1 and api.execs[0][:3] == ["python3", "-I", "-c"]


async def test_a_failed_expectation_exits_1(
    upstream: LocalServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Closed, yet the local server answers: the expectation "blocked" fails.
    api = StandinApi(_sandbox("closed"))
    code = await _check(api, tmp_path, monkeypatch, "--reachable", f"127.0.0.1:{upstream.port}")
    out = capsys.readouterr().out
    assert code == 1 and "FAILED" in out, out


async def test_a_sandbox_not_served_by_a_pod_is_not_probed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = StandinApi(_sandbox("closed", served_kind="AcasSandbox"))
    code = await _check(api, tmp_path, monkeypatch, "--reachable", "127.0.0.1:9")
    assert code == 2 and "is not served by a pod" in capsys.readouterr().out
    assert api.execs == []


def test_src_never_imports_the_sync_kubernetes_client() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            found += [
                f"{path.relative_to(SRC)}:{node.lineno} {n}"
                for n in names
                if n == "kubernetes" or n.startswith("kubernetes.")
            ]
    assert not found, f"use kubernetes_asyncio (sandbox_operator.kubeapi): {found}"
