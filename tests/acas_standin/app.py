"""aiohttp application of the ACA sandboxes stand-in (reference sections 2-7 and 10).

Every route is registered under the `{P}` prefix with its operationId as the route name; one
middleware checks `api-version` and the bearer token, counts calls, applies armed faults and
sweeps sandboxes whose auto-delete lifecycle expired. Test-only control routes live under
`/_standin/` (no token; the server only listens on loopback).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat as statmod
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from .state import API_VERSION, Fault, Sandbox, StandinState, now_iso, rooted_argv

P = "/subscriptions/{sub}/resourceGroups/{rg}/sandboxGroups/{group}"
STATE_KEY = web.AppKey("standin_state", StandinState)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Route names that are a second spelling of one operationId (section 9 of the reference).
ALIASES = {
    "AzureSandboxes_Create_POST": "AzureSandboxes_Create",
    "SandboxFilesOperations_PutSandboxFile": "SandboxFilesOperations_PostSandboxFile",
    "SandboxNetworkingOperations_GetSandboxEgressDecisions_SDK": (
        "SandboxNetworkingOperations_GetSandboxEgressDecisions2"
    ),
}


def _problem_body(status: int, title: str, detail: str) -> dict[str, Any]:
    return {
        "type": f"https://standin.invalid/errors/{title}",
        "title": title,
        "status": status,
        "detail": detail,
    }


def problem(status: int, title: str, detail: str = "", **headers: str) -> web.Response:
    """A ProblemDetails error body (reference section 7)."""
    body = _problem_body(status, title, detail)
    return web.json_response(body, status=status, headers=headers or None)


def problem_error(error: type[web.HTTPError], title: str, detail: str) -> web.HTTPError:
    """`problem` as an exception, for helpers that must raise rather than return."""
    body = _problem_body(error.status_code, title, detail)
    return error(text=json.dumps(body), content_type="application/json")


def _state(request: web.Request) -> StandinState:
    return request.app[STATE_KEY]


def _bool_q(request: web.Request, name: str) -> bool | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    return raw.lower() == "true"


# -- middleware ---------------------------------------------------------------------------------


@web.middleware
async def api_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path.startswith("/_standin/"):
        return await handler(request)
    route = request.match_info.route
    operation = ALIASES.get(route.name or "", route.name or "")
    state = _state(request)
    state.requests.append(
        {
            "operation": operation,
            "method": request.method,
            "path": request.path,
            "query": dict(request.query),
            "hasBody": request.body_exists,
            "contentType": request.headers.get("Content-Type"),
        }
    )
    if not operation:
        return problem(404, "NotFound", "no such route")
    state.calls[operation] += 1
    version = request.query.get("api-version")
    if version != API_VERSION:
        return problem(400, "InvalidApiVersion", "api-version missing or unsupported")
    auth = request.headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return problem(401, "AuthenticationFailed", "missing bearer token")
    if token in state.expired_tokens:
        return problem(401, "ExpiredAuthenticationToken", "the access token has expired")
    if state.tokens is not None and token not in state.tokens:
        return problem(401, "InvalidAuthenticationToken", "the access token is invalid")
    state.sweep_expired()
    state.sweep_idle()
    fault = state.take_fault(operation, request.match_info.get("id"))
    if fault is not None:
        if fault.delay:
            await asyncio.sleep(fault.delay)
        if fault.status is not None:
            headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
            if fault.body is not None:
                return web.json_response(fault.body, status=fault.status, headers=headers)
            if fault.status == 503 and fault.body is None and operation.endswith("Resume"):
                return web.Response(status=503, headers=headers)
            return problem(fault.status, fault.code, "injected by the test", **headers)
    return await handler(request)


# -- sandboxes ----------------------------------------------------------------------------------


def _get_sandbox(request: web.Request) -> Sandbox:
    state = _state(request)
    sid = request.match_info["id"]
    sandbox = state.sandboxes.get(sid)
    if sandbox is None:
        raise problem_error(web.HTTPNotFound, "NotFound", f"Sandbox {sid} not found")
    return sandbox


def _require_running(sandbox: Sandbox) -> None:
    """Data-plane operations need a running sandbox (409 otherwise); each is a use."""
    if sandbox.state != "Running":
        raise problem_error(web.HTTPConflict, "SandboxNotRunning", f"sandbox is {sandbox.state}")
    sandbox.last_active = time.monotonic()


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        data = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise problem_error(web.HTTPBadRequest, "InvalidBody", "not JSON") from None
    if not isinstance(data, dict):
        raise problem_error(web.HTTPBadRequest, "InvalidBody", "not an object")
    return data


async def create_sandbox(request: web.Request) -> web.Response:
    state = _state(request)
    body = await _json_body(request)
    if state.max_sandboxes is not None and len(state.sandboxes) >= state.max_sandboxes:
        return problem(429, "QuotaExceeded", "sandbox quota reached", **{"Retry-After": "1"})
    labels = body.get("labels") or {}
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        return problem(400, "InvalidLabels", "labels must map strings to strings")
    policy_id = body.get("egressPolicyId")
    if policy_id is not None and policy_id not in state.policies:
        return problem(400, "EgressPolicyNotFound", "unknown egressPolicyId")
    lifecycle = body.get("lifecycle")
    if lifecycle is not None and (
        "autoSuspendPolicy" not in lifecycle or "autoDeletePolicy" not in lifecycle
    ):
        return problem(400, "InvalidLifecycle", "both lifecycle sub-policies are required")
    sandbox = state.new_sandbox(body)
    status = 200 if request.method == "PUT" else 201
    return web.json_response(sandbox.to_wire(), status=status)


async def get_sandbox(request: web.Request) -> web.Response:
    sandbox = _get_sandbox(request)
    _state(request).advance(sandbox)
    return web.json_response(sandbox.to_wire())


def _parse_selector(raw: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in raw.split(","):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(pair)
        out[key] = value
    return out


async def list_sandboxes(request: web.Request) -> web.Response:
    state = _state(request)
    raw = request.query.get("labels", "")
    try:
        wanted = _parse_selector(raw) if raw else {}
    except ValueError:
        return problem(400, "InvalidLabelSelector", "labels must be key=value pairs")
    found = [s for s in state.ordered() if all(s.labels.get(k) == v for k, v in wanted.items())]
    for sandbox in found:
        state.advance(sandbox)
    page = request.query.get("page") or request.query.get("Page")
    size = request.query.get("pageSize") or request.query.get("PageSize")
    if size is not None:
        try:
            n, p = int(size), int(page or 1)
        except ValueError:
            return problem(400, "InvalidPaging", "page and pageSize are integers")
        if n < 1 or p < 1:
            return problem(400, "InvalidPaging", "page and pageSize start at 1")
        found = found[(p - 1) * n : p * n]
    return web.json_response([s.to_wire() for s in found])


async def delete_sandbox(request: web.Request) -> web.Response:
    state = _state(request)
    sid = request.match_info["id"]
    sandbox = state.sandboxes.get(sid)
    if sandbox is None:
        return web.Response(status=204)
    if state.delete_leaves_listed:
        sandbox.delete_requested = True
        return web.Response(status=204)
    state.remove(sid)
    return web.Response(status=204)


async def count_sandboxes(request: web.Request) -> web.Response:
    return web.json_response(len(_state(request).sandboxes))


def _no_body(request: web.Request) -> None:
    """Stop, stop/async and resume take no request body (reference section 3.8)."""
    if request.body_exists:
        raise problem_error(web.HTTPBadRequest, "UnexpectedBody", "this operation takes no body")


async def stop_sandbox(request: web.Request) -> web.Response:
    """Blocking stop: Running -> Stopped (`UserStopped`), the state saved as a snapshot, which
    the 200 answer is (section 3.8). Not running (already stopped, stopping, creating): 409.
    With `stop_outcome` StopFailed the stop fails: 500 and the sandbox `StopFailed`."""
    state = _state(request)
    sandbox = _get_sandbox(request)
    _no_body(request)
    _require_running(sandbox)
    if state.stop_outcome != "Stopped":
        sandbox.state = state.stop_outcome
        sandbox.state_details = None
        return problem(500, "StopFailed", "the sandbox's state could not be saved")
    sandbox.stop("UserStopped")
    snapshot = {
        "id": sandbox.snapshot_id,
        "labels": dict(sandbox.labels),
        "sandboxId": sandbox.id,
        "createdAtUtc": now_iso(),
        "resources": sandbox.to_wire()["resources"],
        "sizeInMB": str(_size_mb(sandbox)),
    }
    return web.json_response(snapshot)


def _size_mb(sandbox: Sandbox) -> int:
    total = sum(p.stat().st_size for p in sandbox.root.rglob("*") if p.is_file())
    return max(1, -(-total // (1024 * 1024)))


async def stop_sandbox_async(request: web.Request) -> web.Response:
    """Non-blocking stop: 202 with the sandbox `Stopping`; `Stopped` after `stopping_gets`
    reads (or `stop_outcome`). Not running: 409."""
    sandbox = _get_sandbox(request)
    _no_body(request)
    _require_running(sandbox)
    sandbox.stop("UserStopped", state="Stopping")
    sandbox.stopping_gets = 0
    return web.json_response(sandbox.to_wire(), status=202)


async def resume_sandbox(request: web.Request) -> web.Response:
    """Stopped (any reason but Disabled) or Idle -> Running, from its snapshot: the files and
    policies are the ones it had (section 3.8). Anything else (running, stopping, creating,
    StopFailed): 409. Disabled (the stand-in's reading of "blocks on-demand auto-resume"): 409
    until enabled."""
    sandbox = _get_sandbox(request)
    _no_body(request)
    if sandbox.state not in ("Stopped", "Idle"):
        return problem(409, "SandboxNotStopped", f"sandbox is {sandbox.state}")
    if (sandbox.state_details or {}).get("stoppedReason") == "Disabled":
        return problem(409, "SandboxDisabled", "the sandbox is disabled")
    sandbox.state = "Running"
    sandbox.state_details = None
    sandbox.last_active = time.monotonic()
    return web.json_response(sandbox.to_wire())


async def set_lifecycle(request: web.Request) -> web.Response:
    sandbox = _get_sandbox(request)
    body = await _json_body(request)
    if "autoSuspendPolicy" not in body or "autoDeletePolicy" not in body:
        return problem(400, "InvalidLifecycle", "both lifecycle sub-policies are required")
    sandbox.lifecycle = body
    return web.json_response(sandbox.to_wire())


# -- execution ----------------------------------------------------------------------------------


async def _run(
    request: web.Request, sandbox: Sandbox, argv: list[str], body: dict[str, Any]
) -> web.Response:
    state = _state(request)
    workdir = body.get("workingDirectory")
    try:
        cwd = state.host_path(sandbox, workdir, follow=True) if workdir else sandbox.root
    except PermissionError:
        return problem(400, "InvalidWorkingDirectory", "working directory escapes the sandbox")
    if not cwd.is_dir():
        return problem(400, "WorkingDirectoryNotFound", "working directory does not exist")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(sandbox.root),
        "SANDBOX_ROOT": str(sandbox.root),
        "TMPDIR": str(_tmpdir(sandbox)),
        "LANG": "C.UTF-8",
    }
    env.update({str(k): str(v) for k, v in (body.get("environment") or {}).items()})
    if state.rooted:
        env.update(HOME="/", SANDBOX_ROOT="/", TMPDIR="/tmp")
        env.update({str(k): str(v) for k, v in (body.get("environment") or {}).items()})
    record = {"sandbox": sandbox.id, "argv": argv, "cwd": str(cwd)}
    if state.rooted:
        argv = rooted_argv(sandbox.root, workdir or "/", argv)
    state.executions.append(record)
    started = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except FileNotFoundError:
        return _exec_result(127, "", f"{argv[0]}: command not found\n", started)
    except PermissionError:
        return _exec_result(126, "", f"{argv[0]}: permission denied\n", started)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=state.exec_timeout)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        return _exec_result(
            137, out.decode(errors="replace"), err.decode(errors="replace"), started
        )
    code = proc.returncode if proc.returncode is not None else -1
    if code < 0:
        code = 128 - code
    return _exec_result(code, out.decode(errors="replace"), err.decode(errors="replace"), started)


def _tmpdir(sandbox: Sandbox) -> Any:
    """Each sandbox's own temporary directory (a real sandbox has its own /tmp)."""
    tmp = sandbox.root.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    return tmp


def _exec_result(code: int, out: str, err: str, started: float) -> web.Response:
    return web.json_response(
        {
            "exitCode": code,
            "stdout": out,
            "stderr": err,
            "executionTimeMs": int((time.monotonic() - started) * 1000),
        }
    )


async def _command(request: web.Request) -> tuple[Sandbox, dict[str, Any], str]:
    """An execute request's running sandbox, JSON body and (required) `command`."""
    sandbox = _get_sandbox(request)
    _require_running(sandbox)
    body = await _json_body(request)
    command = body.get("command")
    if not isinstance(command, str) or not command:
        raise problem_error(web.HTTPBadRequest, "InvalidCommand", "command is required")
    return sandbox, body, command


async def execute_command(request: web.Request) -> web.Response:
    sandbox, body, command = await _command(request)
    args = body.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        return problem(400, "InvalidCommand", "args must be strings")
    return await _run(request, sandbox, [command, *args], body)


async def execute_shell_command(request: web.Request) -> web.Response:
    sandbox, body, command = await _command(request)
    shell = body.get("shell") or "/bin/sh"
    return await _run(request, sandbox, [shell, "-c", command], body)


# -- files ----------------------------------------------------------------------------------------


def _file_info(
    state: StandinState, sandbox: Sandbox, host: os.PathLike[str] | str
) -> dict[str, Any]:
    from pathlib import Path

    p = Path(host)
    st = p.lstat()
    is_link = statmod.S_ISLNK(st.st_mode)
    return {
        "name": p.name or "/",
        "path": state.sandbox_path(sandbox, p),
        "size": st.st_size,
        "mode": statmod.S_IMODE(st.st_mode),
        "isDir": statmod.S_ISDIR(st.st_mode),
        "isSymlink": is_link,
        "symlinkTarget": os.readlink(p) if is_link else "",
        "modifiedTime": int(st.st_mtime),
    }


def _path_arg(
    request: web.Request, sandbox: Sandbox, required: bool = True, *, follow: bool = False
) -> Any:
    raw = request.query.get("path")
    if raw is None or raw == "":
        if required:
            raise problem_error(web.HTTPBadRequest, "PathRequired", "path")
        raw = "/"
    try:
        return _state(request).host_path(sandbox, raw, follow=follow)
    except PermissionError:
        raise problem_error(web.HTTPBadRequest, "InvalidPath", "escapes") from None


async def write_file(request: web.Request) -> web.Response:
    state = _state(request)
    sandbox = _get_sandbox(request)
    _require_running(sandbox)
    target = _path_arg(request, sandbox, follow=True)
    data = await request.read()
    if len(data) > state.max_file_bytes:
        return problem(413, "PayloadTooLarge", "file exceeds the stand-in's limit")
    if target.is_dir():
        return problem(409, "IsADirectory", "path is a directory")
    if not target.parent.is_dir():
        if _bool_q(request, "createDirs"):
            target.parent.mkdir(parents=True, exist_ok=True)
        else:
            return problem(404, "ParentNotFound", "parent directory does not exist")
    target.write_bytes(data)
    mode = request.query.get("mode")
    if mode is not None:
        os.chmod(target, int(mode) & 0o7777)
    status = 200 if request.method == "PUT" else 201
    return web.json_response({"success": True, "bytesWritten": len(data)}, status=status)


async def read_file(request: web.Request) -> web.Response:
    sandbox = _get_sandbox(request)
    _require_running(sandbox)
    target = _path_arg(request, sandbox, follow=True)
    if not target.exists():
        return problem(404, "FileNotFound", "no such file")
    if target.is_dir():
        return problem(409, "IsADirectory", "path is a directory")
    return web.Response(body=target.read_bytes(), content_type="application/octet-stream")


async def delete_file(request: web.Request) -> web.Response:
    sandbox = _get_sandbox(request)
    _require_running(sandbox)
    target = _path_arg(request, sandbox, required=False)
    if not target.exists() and not target.is_symlink():
        return problem(404, "FileNotFound", "no such file or directory")
    if target.is_dir() and not target.is_symlink():
        if not _bool_q(request, "recursive"):
            return problem(409, "IsADirectory", "directory needs recursive=true")
        if target == sandbox.root:
            return problem(409, "RootDirectory", "refusing to delete /")
        shutil.rmtree(target)
    else:
        target.unlink()
    return web.json_response({"success": True})


async def list_files(request: web.Request) -> web.Response:
    sandbox = _get_sandbox(request)
    _require_running(sandbox)
    target = _path_arg(request, sandbox, follow=True)
    if not target.exists():
        return problem(404, "DirectoryNotFound", "no such directory")
    if not target.is_dir():
        return problem(409, "NotADirectory", "path is not a directory")
    entries = [_file_info(_state(request), sandbox, p) for p in sorted(target.iterdir())]
    return web.json_response(
        {"path": _state(request).sandbox_path(sandbox, target), "entries": entries}
    )


async def stat_file(request: web.Request) -> web.Response:
    sandbox = _get_sandbox(request)
    _require_running(sandbox)
    target = _path_arg(request, sandbox)
    if not target.exists() and not target.is_symlink():
        return problem(404, "FileNotFound", "no such file or directory")
    return web.json_response(_file_info(_state(request), sandbox, target))


async def mkdir(request: web.Request) -> web.Response:
    state = _state(request)
    sandbox = _get_sandbox(request)
    _require_running(sandbox)
    body = await _json_body(request)
    path = body.get("path")
    if not isinstance(path, str) or not path:
        return problem(400, "PathRequired", "path is required")
    try:
        target = state.host_path(sandbox, path, follow=True)
    except PermissionError:
        return problem(400, "InvalidPath", "path escapes the sandbox")
    if target.exists() and not target.is_dir():
        return problem(409, "NotADirectory", "a file exists at path")
    if body.get("createParents"):
        target.mkdir(parents=True, exist_ok=True)
    elif not target.parent.is_dir():
        return problem(404, "ParentNotFound", "parent directory does not exist")
    else:
        target.mkdir(exist_ok=True)
    if body.get("mode") is not None:
        os.chmod(target, int(body["mode"]) & 0o7777)
    return web.json_response({"success": True})


# -- egress ---------------------------------------------------------------------------------


async def set_egress_policy(request: web.Request) -> web.Response:
    sandbox = _get_sandbox(request)
    _require_running(sandbox)
    sandbox.egress_policy = await _json_body(request)
    return web.json_response(sandbox.egress_policy)


async def egress_decisions(request: web.Request) -> web.Response:
    sandbox = _get_sandbox(request)
    return web.json_response(
        {
            "http": {
                "allowed": sandbox.decisions_allowed[:50],
                "denied": sandbox.decisions_denied[:50],
            },
            "lastUpdated": now_iso(),
        }
    )


async def list_policies(request: web.Request) -> web.Response:
    return web.json_response({"egressPolicies": list(_state(request).policies.values())})


async def get_policy(request: web.Request) -> web.Response:
    policy = _state(request).policies.get(request.match_info["policyId"])
    if policy is None:
        return problem(404, "EgressPolicyNotFound", "no such policy")
    return web.json_response(policy)


async def put_policy(request: web.Request) -> web.Response:
    state = _state(request)
    policy_id = request.match_info["policyId"]
    body = await _json_body(request)
    if "name" not in body or body.get("defaultAction") not in ("Allow", "Deny"):
        return problem(400, "InvalidPolicy", "name and defaultAction are required")
    existing = state.policies.get(policy_id)
    stamp = now_iso()
    stored = {
        **body,
        "id": policy_id,
        "updatedAt": stamp,
        "createdAt": existing["createdAt"] if existing else stamp,
    }
    state.policies[policy_id] = stored
    return web.json_response(stored, status=200 if existing else 201)


async def delete_policy(request: web.Request) -> web.Response:
    if _state(request).policies.pop(request.match_info["policyId"], None) is None:
        return problem(404, "EgressPolicyNotFound", "no such policy")
    return web.Response(status=204)


# -- control (tests only) -----------------------------------------------------------------------


async def control_state(request: web.Request) -> web.Response:
    return web.json_response(_state(request).dump())


async def control_fault(request: web.Request) -> web.Response:
    data = await request.json()
    _state(request).add_fault(Fault.from_wire(data))
    return web.json_response({"ok": True})


async def control_sandbox_state(request: web.Request) -> web.Response:
    """Set a sandbox's state as the service itself would: `{"state": "Stopped",
    "stoppedReason": "Idle"}` (its idle auto-suspend), `Disabled`, `StopFailed`, `Stopping`..."""
    state = _state(request)
    sandbox = state.sandboxes.get(request.match_info["id"])
    if sandbox is None:
        return problem(404, "NotFound", "no such sandbox")
    data = await request.json()
    reason = data.get("stoppedReason")
    if reason is not None:
        sandbox.stop(str(reason), state=str(data.get("state", "Stopped")))
    else:
        sandbox.state = str(data["state"])
        sandbox.state_details = None
    sandbox.stopping_gets = 0
    return web.json_response(sandbox.to_wire())


async def control_reset(request: web.Request) -> web.Response:
    state = _state(request)
    state.clear_faults()
    state.calls.clear()
    state.delete_leaves_listed = False
    state.expired_tokens.clear()
    state.stop_outcome = "Stopped"
    state.auto_suspend = False
    return web.json_response({"ok": True})


async def control_config(request: web.Request) -> web.Response:
    state = _state(request)
    data = await request.json()
    knobs = {
        "readyAfterGets": "ready_after_gets",
        "readyAfterSeconds": "ready_after_seconds",
        "startupState": "startup_state",
        "deleteLeavesListed": "delete_leaves_listed",
        "maxFileBytes": "max_file_bytes",
        "maxSandboxes": "max_sandboxes",
        "hostPaths": "host_paths",
        "rooted": "rooted",
        "stoppingGets": "stopping_gets",
        "stopOutcome": "stop_outcome",
        "autoSuspend": "auto_suspend",
    }
    for wire, attr in knobs.items():
        if wire in data:
            setattr(state, attr, data[wire])
    if "expiredTokens" in data:
        state.expired_tokens = set(data["expiredTokens"])
    if "tokens" in data:
        state.tokens = None if data["tokens"] is None else set(data["tokens"])
    return web.json_response({"ok": True})


def make_app(state: StandinState) -> web.Application:
    app = web.Application(middlewares=[api_middleware], client_max_size=256 * 1024 * 1024)
    app[STATE_KEY] = state
    r = app.router
    s = f"{P}/sandboxes"
    one = f"{s}/{{id}}"
    r.add_route(
        "GET", f"{s}/count", count_sandboxes, name="SandboxLifecycleOperations_GetSandboxesCount"
    )
    r.add_route("GET", s, list_sandboxes, name="AzureSandboxes_List")
    r.add_route("PUT", s, create_sandbox, name="AzureSandboxes_Create")
    r.add_route("POST", s, create_sandbox, name="AzureSandboxes_Create_POST")
    r.add_route("GET", one, get_sandbox, name="AzureSandboxes_Get")
    r.add_route("DELETE", one, delete_sandbox, name="AzureSandboxes_Delete")
    r.add_route(
        "POST", f"{one}/stop", stop_sandbox, name="SandboxLifecycleOperations_PostSandboxStop"
    )
    r.add_route(
        "POST",
        f"{one}/stop/async",
        stop_sandbox_async,
        name="SandboxLifecycleOperations_PostSandboxStopAsync",
    )
    r.add_route(
        "POST", f"{one}/resume", resume_sandbox, name="SandboxLifecycleOperations_PostSandboxResume"
    )
    r.add_route(
        "POST",
        f"{one}/lifecycle",
        set_lifecycle,
        name="SandboxLifecycleOperations_PostSandboxLifecycle",
    )
    r.add_route(
        "POST",
        f"{one}/executeCommand",
        execute_command,
        name="SandboxLifecycleOperations_PostSandboxExecuteCommand",
    )
    r.add_route(
        "POST",
        f"{one}/executeShellCommand",
        execute_shell_command,
        name="SandboxLifecycleOperations_PostSandboxExecuteShellCommand",
    )
    r.add_route("POST", f"{one}/files", write_file, name="SandboxFilesOperations_PostSandboxFile")
    r.add_route("PUT", f"{one}/files", write_file, name="SandboxFilesOperations_PutSandboxFile")
    r.add_route("GET", f"{one}/files", read_file, name="SandboxFilesOperations_GetSandboxFile")
    r.add_route(
        "DELETE", f"{one}/files", delete_file, name="SandboxFilesOperations_DeleteSandboxFile"
    )
    r.add_route(
        "GET", f"{one}/files/list", list_files, name="SandboxFilesOperations_GetSandboxFilesList"
    )
    r.add_route(
        "GET", f"{one}/files/stat", stat_file, name="SandboxFilesOperations_GetSandboxFileStat"
    )
    r.add_route(
        "POST", f"{one}/files/mkdir", mkdir, name="SandboxFilesOperations_PostSandboxFileMkdir"
    )
    r.add_route(
        "POST",
        f"{one}/egresspolicy",
        set_egress_policy,
        name="SandboxNetworkingOperations_PostSandboxEgressPolicy",
    )
    r.add_route(
        "GET",
        f"{one}/egressDecisions",
        egress_decisions,
        name="SandboxNetworkingOperations_GetSandboxEgressDecisions2",
    )
    r.add_route(
        "GET",
        f"{one}/egress-decisions",
        egress_decisions,
        name="SandboxNetworkingOperations_GetSandboxEgressDecisions_SDK",
    )
    r.add_route(
        "GET",
        f"{P}/egressPolicies",
        list_policies,
        name="EgressPoliciesOperations_ListEgressPolicies",
    )
    r.add_route(
        "GET",
        f"{P}/egressPolicies/{{policyId}}",
        get_policy,
        name="EgressPoliciesOperations_GetEgressPolicy",
    )
    r.add_route(
        "PUT",
        f"{P}/egressPolicies/{{policyId}}",
        put_policy,
        name="EgressPoliciesOperations_PutEgressPolicy",
    )
    r.add_route(
        "DELETE",
        f"{P}/egressPolicies/{{policyId}}",
        delete_policy,
        name="EgressPoliciesOperations_DeleteEgressPolicy",
    )
    r.add_get("/_standin/state", control_state)
    r.add_post("/_standin/faults", control_fault)
    r.add_post("/_standin/reset", control_reset)
    r.add_post("/_standin/sandboxes/{id}/state", control_sandbox_state)
    r.add_post("/_standin/config", control_config)
    return app
