"""Request builders for the Azure Container Apps sandboxes data-plane API.

Pure functions of their arguments: no I/O, no credentials. Each builder returns an `ApiRequest`
naming the service's operationId, the method, the path (after the endpoint), the query (always
with `api-version`), the body, whether a retry may re-send it, and which statuses mean success.

The operations, paths and statuses follow `aca-sandboxes-api.md` (Swagger `01868f55`), with the
revision choices recorded there in section 9: create defaults to PUT on the collection (the live
service and SDK) and accepts 200 or 201; file writes default to POST (Swagger) and accept 200/201.
`tests/unit/test_acas_examples.py` replays every published example against these builders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

API_VERSION = "2026-09-01-preview"
"""The api-version this client is written against (the only value in the spec's enum)."""

TOKEN_SCOPE = "https://management.azuredevcompute.io/.default"
"""Entra scope named by the spec's OAuth2 security definition."""

LEGACY_TOKEN_SCOPE = "https://dynamicsessions.io/.default"
"""Scope used by SDK 0.1.0b4 (api 2026-02-01-preview); configurable fallback, not the default."""

CreateMethod = Literal["PUT", "POST"]
FileWriteMethod = Literal["PUT", "POST"]

_JSON = "application/json"
_OCTET = "application/octet-stream"


class LabelSelectorError(ValueError):
    """A label key or value cannot be expressed in the service's `k=v,k=v` filter syntax."""

    def __init__(self, key: str) -> None:
        super().__init__(
            "label key/value may not be empty or contain ',' or '=' (key length "
            f"{len(key)}); the service's filter syntax has no escaping"
        )
        self.key = key


def label_selector(labels: Mapping[str, str]) -> str:
    """The service's `labels` filter: comma-separated exact `key=value` pairs (logical AND).

    The syntax has no escaping, so keys and values containing ',' or '=' are refused rather than
    sent ambiguously. Pairs are sorted for a stable query string.
    """
    parts: list[str] = []
    for key in sorted(labels):
        value = labels[key]
        if not key or any(c in key for c in ",=") or any(c in value for c in ",="):
            raise LabelSelectorError(key)
        parts.append(f"{key}={value}")
    return ",".join(parts)


def parse_label_selector(selector: str) -> dict[str, str]:
    """Inverse of `label_selector` (used by the stand-in). Raises ValueError when malformed."""
    out: dict[str, str] = {}
    if not selector:
        return out
    for pair in selector.split(","):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError("malformed label selector pair")
        out[key] = value
    return out


def _q(segment: str) -> str:
    return quote(segment, safe="")


def _bool(value: bool) -> str:
    return "true" if value else "false"


@dataclass(frozen=True)
class ApiRequest:
    """One HTTP request to the service, fully described, without credentials or host."""

    operation: str
    method: str
    path: str
    params: tuple[tuple[str, str], ...]
    success: frozenset[int]
    idempotent: bool
    json: Any = None
    content: bytes | None = None
    content_type: str | None = None
    accept: str = _JSON
    long_running: bool = False
    """True for calls whose response may take as long as the work (execute command)."""

    def query(self) -> dict[str, str]:
        return dict(self.params)

    def headers(self) -> dict[str, str]:
        out = {"Accept": self.accept}
        if self.content_type is not None:
            out["Content-Type"] = self.content_type
        return out


@dataclass(frozen=True)
class AcasOperations:
    """Builders bound to one sandbox group. `prefix` is the `{P}` of the reference."""

    subscription: str
    resource_group: str
    sandbox_group: str
    api_version: str = API_VERSION
    create_method: CreateMethod = "PUT"
    file_write_method: FileWriteMethod = "POST"
    prefix: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "prefix",
            f"/subscriptions/{_q(self.subscription)}/resourceGroups/{_q(self.resource_group)}"
            f"/sandboxGroups/{_q(self.sandbox_group)}",
        )

    # -- helpers ---------------------------------------------------------------------------

    def _params(self, *pairs: tuple[str, str | None]) -> tuple[tuple[str, str], ...]:
        out = [("api-version", self.api_version)]
        out.extend((k, v) for k, v in pairs if v is not None)
        return tuple(out)

    def _sandbox(self, sandbox_id: str, suffix: str = "") -> str:
        return f"{self.prefix}/sandboxes/{_q(sandbox_id)}{suffix}"

    # -- sandboxes ---------------------------------------------------------------------------

    def create_sandbox(self, content: Mapping[str, Any]) -> ApiRequest:
        """`AzureSandboxes_Create`: never idempotent (each call makes a new sandbox)."""
        return ApiRequest(
            operation="AzureSandboxes_Create",
            method=self.create_method,
            path=f"{self.prefix}/sandboxes",
            params=self._params(),
            success=frozenset({200, 201}),
            idempotent=False,
            json=dict(content),
            content_type=_JSON,
        )

    def get_sandbox(self, sandbox_id: str) -> ApiRequest:
        return ApiRequest(
            operation="AzureSandboxes_Get",
            method="GET",
            path=self._sandbox(sandbox_id),
            params=self._params(),
            success=frozenset({200}),
            idempotent=True,
        )

    def list_sandboxes(
        self,
        labels: Mapping[str, str] | str | None = None,
        *,
        page: int | None = None,
        page_size: int | None = None,
    ) -> ApiRequest:
        selector = labels if isinstance(labels, str) or labels is None else label_selector(labels)
        return ApiRequest(
            operation="AzureSandboxes_List",
            method="GET",
            path=f"{self.prefix}/sandboxes",
            params=self._params(
                ("page", None if page is None else str(page)),
                ("pageSize", None if page_size is None else str(page_size)),
                ("labels", selector or None),
            ),
            success=frozenset({200}),
            idempotent=True,
        )

    def delete_sandbox(self, sandbox_id: str) -> ApiRequest:
        return ApiRequest(
            operation="AzureSandboxes_Delete",
            method="DELETE",
            path=self._sandbox(sandbox_id),
            params=self._params(),
            success=frozenset({200, 204}),
            idempotent=True,
        )

    def count_sandboxes(self) -> ApiRequest:
        return ApiRequest(
            operation="SandboxLifecycleOperations_GetSandboxesCount",
            method="GET",
            path=f"{self.prefix}/sandboxes/count",
            params=self._params(),
            success=frozenset({200}),
            idempotent=True,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def stop_sandbox(self, sandbox_id: str) -> ApiRequest:
        return ApiRequest(
            operation="SandboxLifecycleOperations_PostSandboxStop",
            method="POST",
            path=self._sandbox(sandbox_id, "/stop"),
            params=self._params(),
            success=frozenset({200}),
            idempotent=False,
        )

    def stop_sandbox_async(self, sandbox_id: str) -> ApiRequest:
        return ApiRequest(
            operation="SandboxLifecycleOperations_PostSandboxStopAsync",
            method="POST",
            path=self._sandbox(sandbox_id, "/stop/async"),
            params=self._params(),
            success=frozenset({202}),
            idempotent=False,
        )

    def resume_sandbox(self, sandbox_id: str) -> ApiRequest:
        return ApiRequest(
            operation="SandboxLifecycleOperations_PostSandboxResume",
            method="POST",
            path=self._sandbox(sandbox_id, "/resume"),
            params=self._params(),
            success=frozenset({200}),
            idempotent=False,
        )

    def set_lifecycle(self, sandbox_id: str, policy: Mapping[str, Any]) -> ApiRequest:
        """`PostSandboxLifecycle`: replaces the whole policy, so re-sending is harmless."""
        return ApiRequest(
            operation="SandboxLifecycleOperations_PostSandboxLifecycle",
            method="POST",
            path=self._sandbox(sandbox_id, "/lifecycle"),
            params=self._params(),
            success=frozenset({200}),
            idempotent=True,
            json=dict(policy),
            content_type=_JSON,
        )

    # -- execution ---------------------------------------------------------------------------

    def execute_command(
        self,
        sandbox_id: str,
        command: str,
        args: Sequence[str] = (),
        *,
        environment: Mapping[str, str] | None = None,
        working_directory: str | None = None,
        user: str | None = None,
        activation_mode: str | None = None,
        container_name: str | None = None,
    ) -> ApiRequest:
        """`PostSandboxExecuteCommand`: argv[0] in `command`, the rest in `args`. Never retried."""
        body: dict[str, Any] = {"command": command}
        if args:
            body["args"] = list(args)
        if environment:
            body["environment"] = dict(environment)
        if working_directory is not None:
            body["workingDirectory"] = working_directory
        if user is not None:
            body["user"] = user
        if activation_mode is not None:
            body["activationMode"] = activation_mode
        return ApiRequest(
            operation="SandboxLifecycleOperations_PostSandboxExecuteCommand",
            method="POST",
            path=self._sandbox(sandbox_id, "/executeCommand"),
            params=self._params(("containerName", container_name)),
            success=frozenset({200}),
            idempotent=False,
            json=body,
            content_type=_JSON,
            long_running=True,
        )

    def execute_shell_command(
        self,
        sandbox_id: str,
        command: str,
        *,
        shell: str | None = None,
        environment: Mapping[str, str] | None = None,
        working_directory: str | None = None,
        user: str | None = None,
        activation_mode: str | None = None,
        container_name: str | None = None,
    ) -> ApiRequest:
        body: dict[str, Any] = {"command": command}
        if shell is not None:
            body["shell"] = shell
        if environment:
            body["environment"] = dict(environment)
        if working_directory is not None:
            body["workingDirectory"] = working_directory
        if user is not None:
            body["user"] = user
        if activation_mode is not None:
            body["activationMode"] = activation_mode
        return ApiRequest(
            operation="SandboxLifecycleOperations_PostSandboxExecuteShellCommand",
            method="POST",
            path=self._sandbox(sandbox_id, "/executeShellCommand"),
            params=self._params(("containerName", container_name)),
            success=frozenset({200}),
            idempotent=False,
            json=body,
            content_type=_JSON,
            long_running=True,
        )

    # -- files -------------------------------------------------------------------------------

    def write_file(
        self,
        sandbox_id: str,
        path: str,
        data: bytes,
        *,
        create_dirs: bool | None = None,
        mode: int | None = None,
        container_name: str | None = None,
    ) -> ApiRequest:
        """`PostSandboxFile`. Not retried: a lost response gives no proof of what was written."""
        return ApiRequest(
            operation="SandboxFilesOperations_PostSandboxFile",
            method=self.file_write_method,
            path=self._sandbox(sandbox_id, "/files"),
            params=self._params(
                ("path", path),
                ("createDirs", None if create_dirs is None else _bool(create_dirs)),
                ("mode", None if mode is None else str(mode)),
                ("containerName", container_name),
            ),
            success=frozenset({200, 201}),
            idempotent=False,
            content=bytes(data),
            content_type=_OCTET,
        )

    def read_file(
        self, sandbox_id: str, path: str, *, container_name: str | None = None
    ) -> ApiRequest:
        """`GetSandboxFile`: the 200 body is the raw file bytes (reference section 5.2)."""
        return ApiRequest(
            operation="SandboxFilesOperations_GetSandboxFile",
            method="GET",
            path=self._sandbox(sandbox_id, "/files"),
            params=self._params(("path", path), ("containerName", container_name)),
            success=frozenset({200}),
            idempotent=True,
            accept="*/*",
        )

    def delete_file(
        self,
        sandbox_id: str,
        path: str,
        *,
        recursive: bool | None = None,
        container_name: str | None = None,
    ) -> ApiRequest:
        return ApiRequest(
            operation="SandboxFilesOperations_DeleteSandboxFile",
            method="DELETE",
            path=self._sandbox(sandbox_id, "/files"),
            params=self._params(
                ("path", path),
                ("recursive", None if recursive is None else _bool(recursive)),
                ("containerName", container_name),
            ),
            success=frozenset({200, 204}),
            idempotent=True,
        )

    def list_files(
        self, sandbox_id: str, path: str, *, container_name: str | None = None
    ) -> ApiRequest:
        return ApiRequest(
            operation="SandboxFilesOperations_GetSandboxFilesList",
            method="GET",
            path=self._sandbox(sandbox_id, "/files/list"),
            params=self._params(("path", path), ("containerName", container_name)),
            success=frozenset({200}),
            idempotent=True,
        )

    def stat_file(
        self, sandbox_id: str, path: str, *, container_name: str | None = None
    ) -> ApiRequest:
        return ApiRequest(
            operation="SandboxFilesOperations_GetSandboxFileStat",
            method="GET",
            path=self._sandbox(sandbox_id, "/files/stat"),
            params=self._params(("path", path), ("containerName", container_name)),
            success=frozenset({200}),
            idempotent=True,
        )

    def mkdir(
        self,
        sandbox_id: str,
        path: str,
        *,
        create_parents: bool | None = None,
        mode: int | None = None,
        container_name: str | None = None,
    ) -> ApiRequest:
        body: dict[str, Any] = {"path": path}
        if create_parents is not None:
            body["createParents"] = create_parents
        if mode is not None:
            body["mode"] = mode
        return ApiRequest(
            operation="SandboxFilesOperations_PostSandboxFileMkdir",
            method="POST",
            path=self._sandbox(sandbox_id, "/files/mkdir"),
            params=self._params(("containerName", container_name)),
            success=frozenset({200}),
            idempotent=False,
            json=body,
            content_type=_JSON,
        )

    # -- egress ------------------------------------------------------------------------------

    def set_egress_policy(self, sandbox_id: str, policy: Mapping[str, Any]) -> ApiRequest:
        """`PostSandboxEgressPolicy`: replaces the whole inline policy, so it is idempotent."""
        return ApiRequest(
            operation="SandboxNetworkingOperations_PostSandboxEgressPolicy",
            method="POST",
            path=self._sandbox(sandbox_id, "/egresspolicy"),
            params=self._params(),
            success=frozenset({200}),
            idempotent=True,
            json=dict(policy),
            content_type=_JSON,
        )

    def get_egress_decisions(self, sandbox_id: str) -> ApiRequest:
        return ApiRequest(
            operation="SandboxNetworkingOperations_GetSandboxEgressDecisions2",
            method="GET",
            path=self._sandbox(sandbox_id, "/egressDecisions"),
            params=self._params(),
            success=frozenset({200}),
            idempotent=True,
        )

    def list_egress_policies(self, *, skip_token: str | None = None) -> ApiRequest:
        return ApiRequest(
            operation="EgressPoliciesOperations_ListEgressPolicies",
            method="GET",
            path=f"{self.prefix}/egressPolicies",
            params=self._params(("skipToken", skip_token)),
            success=frozenset({200}),
            idempotent=True,
        )

    def get_egress_policy(self, policy_id: str) -> ApiRequest:
        return ApiRequest(
            operation="EgressPoliciesOperations_GetEgressPolicy",
            method="GET",
            path=f"{self.prefix}/egressPolicies/{_q(policy_id)}",
            params=self._params(),
            success=frozenset({200}),
            idempotent=True,
        )

    def put_egress_policy(self, policy_id: str, policy: Mapping[str, Any]) -> ApiRequest:
        return ApiRequest(
            operation="EgressPoliciesOperations_PutEgressPolicy",
            method="PUT",
            path=f"{self.prefix}/egressPolicies/{_q(policy_id)}",
            params=self._params(),
            success=frozenset({200, 201}),
            idempotent=True,
            json=dict(policy),
            content_type=_JSON,
        )

    def delete_egress_policy(self, policy_id: str) -> ApiRequest:
        return ApiRequest(
            operation="EgressPoliciesOperations_DeleteEgressPolicy",
            method="DELETE",
            path=f"{self.prefix}/egressPolicies/{_q(policy_id)}",
            params=self._params(),
            success=frozenset({200, 204}),
            idempotent=True,
        )
