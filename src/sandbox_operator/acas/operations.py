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

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict, Unpack
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


def _bool(value: bool | None) -> str | None:
    """A boolean query value; None (not sent) stays None."""
    return None if value is None else "true" if value else "false"


def _str(value: int | None) -> str | None:
    """An integer query value; None (not sent) stays None."""
    return None if value is None else str(value)


def _body(**fields: object) -> dict[str, object]:
    """A JSON body of the fields given, in order, leaving out those that are None."""
    return {k: v for k, v in fields.items() if v is not None}


class ExecOptions(TypedDict, total=False):
    """What both execute operations take besides the command (None: not sent)."""

    environment: Mapping[str, str] | None
    working_directory: str | None
    user: str | None
    activation_mode: str | None
    container_name: str | None


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

    def _policy(self, policy_id: str) -> str:
        return f"{self.prefix}/egressPolicies/{_q(policy_id)}"

    def _request(
        self,
        operation: str,
        method: str,
        path: str,
        *query: tuple[str, str | None],
        idempotent: bool,
        success: Collection[int] = (200,),
        json: Any = None,
        content: bytes | None = None,
        accept: str = _JSON,
        long_running: bool = False,
    ) -> ApiRequest:
        """One request: `query` pairs whose value is None are left out (after `api-version`); a
        `json` body is sent as JSON and `content` as raw bytes."""
        return ApiRequest(
            operation=operation,
            method=method,
            path=path,
            params=self._params(*query),
            success=frozenset(success),
            idempotent=idempotent,
            json=json,
            content=content,
            content_type=_JSON if json is not None else _OCTET if content is not None else None,
            accept=accept,
            long_running=long_running,
        )

    def _get_request(
        self, operation: str, path: str, *query: tuple[str, str | None], accept: str = _JSON
    ) -> ApiRequest:
        """A read: GET, 200, safe to re-send."""
        return self._request(operation, "GET", path, *query, idempotent=True, accept=accept)

    def _delete_request(
        self, operation: str, path: str, *query: tuple[str, str | None]
    ) -> ApiRequest:
        """A delete: 200 or 204, safe to re-send (a repeat finds it gone)."""
        return self._request(operation, "DELETE", path, *query, idempotent=True, success=(200, 204))

    def _file_get(
        self,
        operation: str,
        sandbox_id: str,
        suffix: str,
        path: str,
        container_name: str | None,
        accept: str = _JSON,
    ) -> ApiRequest:
        """A read of one path inside a sandbox (`?path=...&containerName=...`)."""
        return self._get_request(
            operation,
            self._sandbox(sandbox_id, suffix),
            ("path", path),
            ("containerName", container_name),
            accept=accept,
        )

    def _execute(
        self, operation: str, sandbox_id: str, suffix: str, options: ExecOptions, **body: Any
    ) -> ApiRequest:
        """The execute operations: sent once, answered when the command ends. `body` holds
        what differs per operation; `options` what both take."""
        environment = options.get("environment")
        return self._request(
            operation,
            "POST",
            self._sandbox(sandbox_id, suffix),
            ("containerName", options.get("container_name")),
            idempotent=False,
            json=_body(
                **body,
                environment=dict(environment) if environment else None,
                workingDirectory=options.get("working_directory"),
                user=options.get("user"),
                activationMode=options.get("activation_mode"),
            ),
            long_running=True,
        )

    # -- sandboxes ---------------------------------------------------------------------------

    def create_sandbox(self, content: Mapping[str, object]) -> ApiRequest:
        """`AzureSandboxes_Create`: never idempotent (each call makes a new sandbox)."""
        return self._request(
            "AzureSandboxes_Create",
            self.create_method,
            f"{self.prefix}/sandboxes",
            idempotent=False,
            success=(200, 201),
            json=dict(content),
        )

    def get_sandbox(self, sandbox_id: str) -> ApiRequest:
        return self._get_request("AzureSandboxes_Get", self._sandbox(sandbox_id))

    def list_sandboxes(
        self,
        labels: Mapping[str, str] | str | None = None,
        *,
        page: int | None = None,
        page_size: int | None = None,
    ) -> ApiRequest:
        selector = labels if isinstance(labels, str) or labels is None else label_selector(labels)
        return self._get_request(
            "AzureSandboxes_List",
            f"{self.prefix}/sandboxes",
            ("page", _str(page)),
            ("pageSize", _str(page_size)),
            ("labels", selector or None),
        )

    def delete_sandbox(self, sandbox_id: str) -> ApiRequest:
        return self._delete_request("AzureSandboxes_Delete", self._sandbox(sandbox_id))

    def count_sandboxes(self) -> ApiRequest:
        return self._get_request(
            "SandboxLifecycleOperations_GetSandboxesCount", f"{self.prefix}/sandboxes/count"
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def stop_sandbox(self, sandbox_id: str) -> ApiRequest:
        return self._request(
            "SandboxLifecycleOperations_PostSandboxStop",
            "POST",
            self._sandbox(sandbox_id, "/stop"),
            idempotent=False,
        )

    def stop_sandbox_async(self, sandbox_id: str) -> ApiRequest:
        return self._request(
            "SandboxLifecycleOperations_PostSandboxStopAsync",
            "POST",
            self._sandbox(sandbox_id, "/stop/async"),
            idempotent=False,
            success=(202,),
        )

    def resume_sandbox(self, sandbox_id: str) -> ApiRequest:
        return self._request(
            "SandboxLifecycleOperations_PostSandboxResume",
            "POST",
            self._sandbox(sandbox_id, "/resume"),
            idempotent=False,
        )

    def set_lifecycle(self, sandbox_id: str, policy: Mapping[str, object]) -> ApiRequest:
        """`PostSandboxLifecycle`: replaces the whole policy, so re-sending is harmless."""
        return self._request(
            "SandboxLifecycleOperations_PostSandboxLifecycle",
            "POST",
            self._sandbox(sandbox_id, "/lifecycle"),
            idempotent=True,
            json=dict(policy),
        )

    # -- execution ---------------------------------------------------------------------------

    def execute_command(
        self,
        sandbox_id: str,
        command: str,
        args: Sequence[str] = (),
        **options: Unpack[ExecOptions],
    ) -> ApiRequest:
        """`PostSandboxExecuteCommand`: argv[0] in `command`, the rest in `args`. Never retried."""
        return self._execute(
            "SandboxLifecycleOperations_PostSandboxExecuteCommand",
            sandbox_id,
            "/executeCommand",
            options,
            command=command,
            args=list(args) if args else None,
        )

    def execute_shell_command(
        self,
        sandbox_id: str,
        command: str,
        *,
        shell: str | None = None,
        **options: Unpack[ExecOptions],
    ) -> ApiRequest:
        """`PostSandboxExecuteShellCommand`: `command` run by `shell`. Never retried."""
        return self._execute(
            "SandboxLifecycleOperations_PostSandboxExecuteShellCommand",
            sandbox_id,
            "/executeShellCommand",
            options,
            command=command,
            shell=shell,
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
        return self._request(
            "SandboxFilesOperations_PostSandboxFile",
            self.file_write_method,
            self._sandbox(sandbox_id, "/files"),
            ("path", path),
            ("createDirs", _bool(create_dirs)),
            ("mode", _str(mode)),
            ("containerName", container_name),
            idempotent=False,
            success=(200, 201),
            content=bytes(data),
        )

    def read_file(
        self, sandbox_id: str, path: str, *, container_name: str | None = None
    ) -> ApiRequest:
        """`GetSandboxFile`: the 200 body is the raw file bytes (reference section 5.2)."""
        op = "SandboxFilesOperations_GetSandboxFile"
        return self._file_get(op, sandbox_id, "/files", path, container_name, accept="*/*")

    def delete_file(
        self,
        sandbox_id: str,
        path: str,
        *,
        recursive: bool | None = None,
        container_name: str | None = None,
    ) -> ApiRequest:
        return self._delete_request(
            "SandboxFilesOperations_DeleteSandboxFile",
            self._sandbox(sandbox_id, "/files"),
            ("path", path),
            ("recursive", _bool(recursive)),
            ("containerName", container_name),
        )

    def list_files(
        self, sandbox_id: str, path: str, *, container_name: str | None = None
    ) -> ApiRequest:
        op = "SandboxFilesOperations_GetSandboxFilesList"
        return self._file_get(op, sandbox_id, "/files/list", path, container_name)

    def stat_file(
        self, sandbox_id: str, path: str, *, container_name: str | None = None
    ) -> ApiRequest:
        op = "SandboxFilesOperations_GetSandboxFileStat"
        return self._file_get(op, sandbox_id, "/files/stat", path, container_name)

    def mkdir(
        self,
        sandbox_id: str,
        path: str,
        *,
        create_parents: bool | None = None,
        mode: int | None = None,
        container_name: str | None = None,
    ) -> ApiRequest:
        return self._request(
            "SandboxFilesOperations_PostSandboxFileMkdir",
            "POST",
            self._sandbox(sandbox_id, "/files/mkdir"),
            ("containerName", container_name),
            idempotent=False,
            json=_body(path=path, createParents=create_parents, mode=mode),
        )

    # -- egress ------------------------------------------------------------------------------

    def set_egress_policy(self, sandbox_id: str, policy: Mapping[str, object]) -> ApiRequest:
        """`PostSandboxEgressPolicy`: replaces the whole inline policy, so it is idempotent."""
        return self._request(
            "SandboxNetworkingOperations_PostSandboxEgressPolicy",
            "POST",
            self._sandbox(sandbox_id, "/egresspolicy"),
            idempotent=True,
            json=dict(policy),
        )

    def get_egress_decisions(self, sandbox_id: str) -> ApiRequest:
        return self._get_request(
            "SandboxNetworkingOperations_GetSandboxEgressDecisions2",
            self._sandbox(sandbox_id, "/egressDecisions"),
        )

    def list_egress_policies(self, *, skip_token: str | None = None) -> ApiRequest:
        return self._get_request(
            "EgressPoliciesOperations_ListEgressPolicies",
            f"{self.prefix}/egressPolicies",
            ("skipToken", skip_token),
        )

    def get_egress_policy(self, policy_id: str) -> ApiRequest:
        return self._get_request(
            "EgressPoliciesOperations_GetEgressPolicy", self._policy(policy_id)
        )

    def put_egress_policy(self, policy_id: str, policy: Mapping[str, object]) -> ApiRequest:
        return self._request(
            "EgressPoliciesOperations_PutEgressPolicy",
            "PUT",
            self._policy(policy_id),
            idempotent=True,
            success=(200, 201),
            json=dict(policy),
        )

    def delete_egress_policy(self, policy_id: str) -> ApiRequest:
        return self._delete_request(
            "EgressPoliciesOperations_DeleteEgressPolicy", self._policy(policy_id)
        )
