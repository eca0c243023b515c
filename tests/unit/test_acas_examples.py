"""Replay every published example in aca-examples/ against the request builders AND the stand-in.

Both sides are checked against the same anchor, independently of each other: the operation table
of the reference document (method and path per operationId, transcribed from section 2 in
tests/fixtures/acas.py) plus the example file (parameters, body, statuses, response shapes). So
neither the client's builders nor the stand-in can drift from the published API without a failure
here.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox_operator.acas.errors import AcasError, error_for_status
from sandbox_operator.acas.models import (
    DirListing,
    ExecResult,
    FileInfo,
    FileOpStatus,
    RemoteSandbox,
    WriteFileResult,
)
from sandbox_operator.acas.operations import API_VERSION, AcasOperations, ApiRequest
from tests.acas_standin import DEFAULT_TOKEN, StandinServer, StandinState
from tests.fixtures.acas import DOCUMENTED, P

#: Vendored verbatim copies (so a clean clone runs this test); the shared reference they come
#: from sits next to the repository (../shared/reference, as issue 7 names it).
EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "acas_standin" / "examples"
SHARED_EXAMPLES_DIR = Path(
    os.environ.get(
        "ACAS_EXAMPLES_DIR",
        Path(__file__).resolve().parents[3] / "shared" / "reference" / "aca-examples",
    )
)
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.json"))


def test_examples_are_the_published_ones() -> None:
    assert len(EXAMPLES) == 22
    if not SHARED_EXAMPLES_DIR.is_dir():
        pytest.skip("shared reference not present; the vendored copies are used as they are")
    shared = sorted(p.name for p in SHARED_EXAMPLES_DIR.glob("*.json"))
    assert shared == [p.name for p in EXAMPLES]
    for path in EXAMPLES:
        assert path.read_bytes() == (SHARED_EXAMPLES_DIR / path.name).read_bytes(), path.name


PATH_PARAMS = {"subscriptionId", "resourceGroupName", "sandboxGroupName", "id", "policyId"}
BODY_PARAMS = {"content", "body"}
#: Maps whose keys are data, not schema (any key may appear).
FREE_MAPS = {"labels", "environment", "env"}

#: Where the stand-in follows the Swagger and the example shows another revision (reference §9).
SHAPE_DIVERGENCES = {
    "SandboxFilesOperations_GetSandboxFile": "raw bytes vs FileStreamResult (§5.2, §9.4)",
    "SandboxLifecycleOperations_GetSandboxesCount": "bare int vs {count} (§3.9, §9.5)",
    "EgressPoliciesOperations_ListEgressPolicies": "{egressPolicies} vs {value,nextLink} (§9.6)",
}


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def example_ids() -> list[str]:
    return [p.stem for p in EXAMPLES]


def _str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def documented_request(example: dict[str, Any]) -> tuple[str, str, dict[str, str], Any]:
    """(method, path, query, body) as the document and example describe the request."""
    op = example["operationId"]
    method, template = DOCUMENTED[op]
    params = example["parameters"]
    path = (P + template).format(**{k: params[k] for k in PATH_PARAMS if k in params})
    query = {k: _str(v) for k, v in params.items() if k not in PATH_PARAMS and k not in BODY_PARAMS}
    body = next((params[k] for k in BODY_PARAMS if k in params), None)
    return method, path, query, body


def success_statuses(example: dict[str, Any]) -> set[int]:
    return {int(s) for s in example["responses"] if 200 <= int(s) < 300}


# -- builders ---------------------------------------------------------------------------------


def _ops(params: dict[str, Any], **kw: Any) -> AcasOperations:
    return AcasOperations(
        subscription=params["subscriptionId"],
        resource_group=params["resourceGroupName"],
        sandbox_group=params["sandboxGroupName"],
        api_version=params["api-version"],
        **kw,
    )


Builder = Callable[[dict[str, Any]], ApiRequest]

BUILDERS: dict[str, Builder] = {
    "AzureSandboxes_Create": lambda p: _ops(p, create_method="POST").create_sandbox(p["content"]),
    "AzureSandboxes_Get": lambda p: _ops(p).get_sandbox(p["id"]),
    "AzureSandboxes_List": lambda p: _ops(p).list_sandboxes(
        p["labels"], page=p["page"], page_size=p["pageSize"]
    ),
    "AzureSandboxes_Delete": lambda p: _ops(p).delete_sandbox(p["id"]),
    "SandboxLifecycleOperations_GetSandboxesCount": lambda p: _ops(p).count_sandboxes(),
    "SandboxLifecycleOperations_PostSandboxStop": lambda p: _ops(p).stop_sandbox(p["id"]),
    "SandboxLifecycleOperations_PostSandboxStopAsync": lambda p: _ops(p).stop_sandbox_async(
        p["id"]
    ),
    "SandboxLifecycleOperations_PostSandboxResume": lambda p: _ops(p).resume_sandbox(p["id"]),
    "SandboxLifecycleOperations_PostSandboxExecuteCommand": lambda p: _ops(p).execute_command(
        p["id"],
        p["body"]["command"],
        p["body"]["args"],
        environment=p["body"]["environment"],
        working_directory=p["body"]["workingDirectory"],
        user=p["body"]["user"],
        activation_mode=p["body"]["activationMode"],
        container_name=p["containerName"],
    ),
    "SandboxLifecycleOperations_PostSandboxExecuteShellCommand": lambda p: _ops(
        p
    ).execute_shell_command(
        p["id"],
        p["body"]["command"],
        shell=p["body"]["shell"],
        environment=p["body"]["environment"],
        working_directory=p["body"]["workingDirectory"],
        user=p["body"]["user"],
        activation_mode=p["body"]["activationMode"],
        container_name=p["containerName"],
    ),
    "SandboxFilesOperations_PostSandboxFile": lambda p: _ops(p).write_file(
        p["id"],
        p["path"],
        base64.b64decode(p["content"]),
        create_dirs=p["createDirs"],
        mode=p["mode"],
        container_name=p["containerName"],
    ),
    "SandboxFilesOperations_GetSandboxFile": lambda p: _ops(p).read_file(
        p["id"], p["path"], container_name=p["containerName"]
    ),
    "SandboxFilesOperations_DeleteSandboxFile": lambda p: _ops(p).delete_file(
        p["id"], p["path"], recursive=p["recursive"], container_name=p["containerName"]
    ),
    "SandboxFilesOperations_GetSandboxFilesList": lambda p: _ops(p).list_files(
        p["id"], p["path"], container_name=p["containerName"]
    ),
    "SandboxFilesOperations_GetSandboxFileStat": lambda p: _ops(p).stat_file(
        p["id"], p["path"], container_name=p["containerName"]
    ),
    "SandboxFilesOperations_PostSandboxFileMkdir": lambda p: _ops(p).mkdir(
        p["id"],
        p["body"]["path"],
        create_parents=p["body"]["createParents"],
        mode=p["body"]["mode"],
        container_name=p["containerName"],
    ),
    "SandboxNetworkingOperations_PostSandboxEgressPolicy": lambda p: _ops(p).set_egress_policy(
        p["id"], p["body"]
    ),
    "SandboxNetworkingOperations_GetSandboxEgressDecisions2": lambda p: _ops(
        p
    ).get_egress_decisions(p["id"]),
    "EgressPoliciesOperations_ListEgressPolicies": lambda p: _ops(p).list_egress_policies(
        skip_token=p["skipToken"]
    ),
    "EgressPoliciesOperations_GetEgressPolicy": lambda p: _ops(p).get_egress_policy(p["policyId"]),
    "EgressPoliciesOperations_PutEgressPolicy": lambda p: _ops(p).put_egress_policy(
        p["policyId"], p["body"]
    ),
    "EgressPoliciesOperations_DeleteEgressPolicy": lambda p: _ops(p).delete_egress_policy(
        p["policyId"]
    ),
}


def test_every_example_is_known() -> None:
    ops = {load(p)["operationId"] for p in EXAMPLES}
    assert ops == set(DOCUMENTED), "an example without a documented operation (or vice versa)"
    assert set(BUILDERS) == set(DOCUMENTED)


@pytest.mark.parametrize("path", EXAMPLES, ids=example_ids())
def test_builder_matches_example(path: Path) -> None:
    example = load(path)
    op = example["operationId"]
    method, url_path, query, body = documented_request(example)
    req = BUILDERS[op](example["parameters"])
    assert req.operation == op
    assert req.method == method
    assert req.path == url_path
    assert req.query() == query
    assert req.query()["api-version"] == API_VERSION
    if op == "SandboxFilesOperations_PostSandboxFile":
        assert req.content == base64.b64decode(body)
        assert req.content_type == "application/octet-stream"
    elif body is not None:
        assert req.json == body
        assert req.content_type == "application/json"
    else:
        assert req.json is None and req.content is None
    assert success_statuses(example) <= req.success


def test_create_put_variant_is_the_default() -> None:
    """§9.1: the live service and SDK PUT on the collection; same path, 200 or 201 accepted."""
    params = load(EXAMPLES_DIR / "AzureSandboxes_Create.json")["parameters"]
    req = _ops(params).create_sandbox(params["content"])
    assert req.method == "PUT"
    assert req.success == {200, 201}
    assert not req.idempotent


def test_only_safe_requests_are_retryable() -> None:
    retryable = set()
    for path in EXAMPLES:
        example = load(path)
        if BUILDERS[example["operationId"]](example["parameters"]).idempotent:
            retryable.add(example["operationId"])
    never = {
        "AzureSandboxes_Create",
        "SandboxLifecycleOperations_PostSandboxExecuteCommand",
        "SandboxLifecycleOperations_PostSandboxExecuteShellCommand",
        "SandboxLifecycleOperations_PostSandboxStop",
        "SandboxLifecycleOperations_PostSandboxStopAsync",
        "SandboxLifecycleOperations_PostSandboxResume",
        "SandboxFilesOperations_PostSandboxFile",
        "SandboxFilesOperations_PostSandboxFileMkdir",
    }
    assert not (retryable & never)
    for op in retryable:
        assert DOCUMENTED[op][0] in ("GET", "DELETE", "PUT") or op.endswith("EgressPolicy")


# -- error and success bodies through the client's parsers -------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=example_ids())
def test_example_error_bodies_become_typed_errors(path: Path) -> None:
    example = load(path)
    for status, response in example["responses"].items():
        code = int(status)
        if code < 400:
            continue
        raw = json.dumps(response["body"]).encode() if response.get("body") else b""
        error = error_for_status(example["operationId"], code, raw)
        assert isinstance(error, AcasError)
        assert error.status == code
        body = response.get("body") or {}
        expected = (body.get("error") or {}).get("code") or body.get("title")
        assert error.code == expected
        assert (expected or "") in error.detail


MODEL_OF: dict[str, Any] = {
    "AzureSandboxes_Create": RemoteSandbox,
    "AzureSandboxes_Get": RemoteSandbox,
    "SandboxLifecycleOperations_PostSandboxResume": RemoteSandbox,
    "SandboxLifecycleOperations_PostSandboxStopAsync": RemoteSandbox,
    "SandboxLifecycleOperations_PostSandboxExecuteCommand": ExecResult,
    "SandboxLifecycleOperations_PostSandboxExecuteShellCommand": ExecResult,
    "SandboxFilesOperations_GetSandboxFileStat": FileInfo,
    "SandboxFilesOperations_GetSandboxFilesList": DirListing,
    "SandboxFilesOperations_PostSandboxFileMkdir": FileOpStatus,
    "SandboxFilesOperations_DeleteSandboxFile": FileOpStatus,
    "SandboxFilesOperations_PostSandboxFile": WriteFileResult,
}


@pytest.mark.parametrize("path", EXAMPLES, ids=example_ids())
def test_example_success_bodies_parse(path: Path) -> None:
    example = load(path)
    op = example["operationId"]
    for status in success_statuses(example):
        body = example["responses"][str(status)].get("body")
        if op == "AzureSandboxes_List":
            assert [RemoteSandbox.model_validate(item).id for item in body]
        elif op in MODEL_OF:
            MODEL_OF[op].model_validate(body)


# -- the stand-in ---------------------------------------------------------------------------------


def assert_shape(actual: Any, example: Any, where: str = "$") -> None:
    """`actual` only uses fields the example shows, with compatible JSON types."""
    if example is None or actual is None:
        return
    if isinstance(example, dict):
        assert isinstance(actual, dict), f"{where}: expected an object"
        if where.rsplit(".", 1)[-1] in FREE_MAPS:
            assert all(isinstance(v, str) for v in actual.values()), where
            return
        extra = set(actual) - set(example)
        assert not extra, f"{where}: fields the published example does not have: {extra}"
        for key, value in actual.items():
            assert_shape(value, example[key], f"{where}.{key}")
    elif isinstance(example, list):
        assert isinstance(actual, list), f"{where}: expected an array"
        if example:
            for i, item in enumerate(actual):
                assert_shape(item, example[0], f"{where}[{i}]")
    elif isinstance(example, bool):
        assert isinstance(actual, bool), where
    elif isinstance(example, int | float):
        assert isinstance(actual, int | float | str) and not isinstance(actual, bool), where
    elif isinstance(example, str):
        assert isinstance(actual, str), where


def prepare(state: StandinState, example: dict[str, Any]) -> None:
    """Put in place what the example's request presupposes (ids are the service's to choose,
    so a replay seeds them)."""
    op = example["operationId"]
    p = example["parameters"]
    sid = p.get("id")
    if op == "AzureSandboxes_Create":
        policy_id = p["content"].get("egressPolicyId")
        if policy_id:
            state.policies[policy_id] = {"id": policy_id, "name": "seed", "defaultAction": "Deny"}
        return
    if op == "AzureSandboxes_List":
        labels = example["responses"]["200"]["body"][0]["labels"]
        state.seed_sandbox("listed-01", labels=labels)
        return
    if op.startswith("EgressPoliciesOperations_") and op not in (
        "EgressPoliciesOperations_PutEgressPolicy",
        "EgressPoliciesOperations_ListEgressPolicies",
    ):
        state.policies[p["policyId"]] = {
            "id": p["policyId"],
            "name": "seed",
            "defaultAction": "Deny",
        }
        return
    if sid is None:
        return
    initial = "Stopped" if op.endswith("PostSandboxResume") else "Running"
    sandbox = state.seed_sandbox(sid, state=initial)
    if op in (
        "SandboxFilesOperations_GetSandboxFile",
        "SandboxFilesOperations_GetSandboxFileStat",
    ):
        target = state.host_path(sandbox, p["path"])
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"Hello")
    elif op in (
        "SandboxFilesOperations_GetSandboxFilesList",
        "SandboxFilesOperations_DeleteSandboxFile",
    ):
        target = state.host_path(sandbox, p["path"])
        target.mkdir(parents=True, exist_ok=True)
        (target / "entry.txt").write_bytes(b"x")
    elif "ExecuteCommand" in op or "ExecuteShellCommand" in op:
        state.host_path(sandbox, p["body"]["workingDirectory"]).mkdir(parents=True)
    elif op == "SandboxNetworkingOperations_GetSandboxEgressDecisions2":
        entry = example["responses"]["200"]["body"]["http"]["allowed"][0]
        sandbox.decisions_allowed.append(dict(entry))
        sandbox.decisions_denied.append(dict(entry))


@pytest.fixture
async def standin() -> AsyncIterator[StandinServer]:
    async with StandinServer() as server:
        yield server


async def replay(
    http: httpx.AsyncClient,
    example: dict[str, Any],
    *,
    method: str | None = None,
    token: bool = True,
    api_version: str | None = None,
) -> httpx.Response:
    doc_method, path, query, body = documented_request(example)
    if api_version is not None:
        query["api-version"] = api_version
    if example["operationId"] == "AzureSandboxes_List":
        # The example's `labels` is a bare placeholder; the document's syntax is k=v pairs.
        labels = example["responses"]["200"]["body"][0]["labels"]
        query["labels"] = ",".join(f"{k}={v}" for k, v in labels.items())
    headers = {"Authorization": f"Bearer {DEFAULT_TOKEN}"} if token else {}
    kwargs: dict[str, Any] = {}
    if example["operationId"] == "SandboxFilesOperations_PostSandboxFile":
        kwargs["content"] = base64.b64decode(body)
        headers["Content-Type"] = "application/octet-stream"
    elif body is not None:
        kwargs["json"] = body
    return await http.request(method or doc_method, path, params=query, headers=headers, **kwargs)


@pytest.mark.parametrize("path", EXAMPLES, ids=example_ids())
async def test_standin_answers_example(standin: StandinServer, path: Path) -> None:
    example = load(path)
    op = example["operationId"]
    prepare(standin.state, example)
    async with httpx.AsyncClient(base_url=standin.base_url) as http:
        response = await replay(http, example)
        expected = success_statuses(example)
        assert response.status_code in expected, response.text
        documented = example["responses"][str(response.status_code)].get("body")
        if op == "SandboxFilesOperations_GetSandboxFile":
            assert response.content == base64.b64decode(documented["fileStream"])
        elif op == "SandboxLifecycleOperations_GetSandboxesCount":
            assert response.json() == documented["count"] == 1 or isinstance(response.json(), int)
        elif op == "EgressPoliciesOperations_ListEgressPolicies":
            assert isinstance(response.json()["egressPolicies"], list)
        elif documented is None:
            assert response.content == b""
        else:
            assert_shape(response.json(), documented)
        if op == "AzureSandboxes_List":
            assert len(response.json()) == 1
        if op == "SandboxNetworkingOperations_PostSandboxEgressPolicy":
            assert response.json() == example["parameters"]["body"]
        if op == "SandboxLifecycleOperations_PostSandboxExecuteCommand":
            # "echo ready" is argv[0] (no shell), so the program does not exist: exit 127.
            assert response.json()["exitCode"] == 127
        assert standin.state.calls[op] == 1


async def test_standin_create_put_variant(standin: StandinServer) -> None:
    example = load(EXAMPLES_DIR / "AzureSandboxes_Create.json")
    prepare(standin.state, example)
    async with httpx.AsyncClient(base_url=standin.base_url) as http:
        response = await replay(http, example, method="PUT")
    assert response.status_code == 200
    assert_shape(response.json(), example["responses"]["201"]["body"])


async def test_standin_put_policy_twice_is_201_then_200(standin: StandinServer) -> None:
    example = load(EXAMPLES_DIR / "EgressPoliciesOperations_PutEgressPolicy.json")
    async with httpx.AsyncClient(base_url=standin.base_url) as http:
        first = await replay(http, example)
        second = await replay(http, example)
    assert (first.status_code, second.status_code) == (201, 200)


@pytest.mark.parametrize("path", EXAMPLES, ids=example_ids())
async def test_standin_documented_errors(standin: StandinServer, path: Path) -> None:
    """401 without a token, 404 for an unknown sandbox/policy: where the example lists them."""
    example = load(path)
    op = example["operationId"]
    statuses = {int(s) for s in example["responses"]}
    async with httpx.AsyncClient(base_url=standin.base_url) as http:
        if 401 in statuses:
            response = await replay(http, example, token=False)
            assert response.status_code == 401
            assert error_for_status(op, 401, response.content).code
        if 404 in statuses and op != "AzureSandboxes_Create":
            response = await replay(http, example)
            assert response.status_code == 404, response.text
            assert error_for_status(op, 404, response.content).status == 404
        if 400 in statuses:
            response = await replay(http, example, api_version="1999-01-01")
            assert response.status_code == 400
            assert error_for_status(op, 400, response.content).code == "InvalidApiVersion"
