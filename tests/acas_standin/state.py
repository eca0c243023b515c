"""State of the ACA sandboxes stand-in: sandboxes, their files (a real directory per sandbox),
named egress policies, call counters and the faults a test has armed.

Deliberately independent of `sandbox_operator`: the stand-in is written from the reference
document, so it cannot inherit a bug from the client it tests.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

API_VERSION = "2026-09-01-preview"


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Fault:
    """One armed fault. `operation` is an operationId (None: any operation of the API).

    `status`: answer with this status (ProblemDetails body unless `body` is given) instead of
    handling the request; `retry_after`: a Retry-After header value; `delay`: seconds to sleep
    before answering (with or without a status); `times`: how many matching requests it applies
    to (-1: until cleared). `sandbox_id` narrows it to one sandbox.
    """

    operation: str | None = None
    status: int | None = None
    retry_after: str | None = None
    delay: float = 0.0
    times: int = 1
    body: Any = None
    code: str = "InjectedFault"
    sandbox_id: str | None = None
    hits: int = 0

    def matches(self, operation: str, sandbox_id: str | None) -> bool:
        if self.times == 0:
            return False
        if self.operation is not None and self.operation != operation:
            return False
        return self.sandbox_id is None or self.sandbox_id == sandbox_id

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Fault:
        return cls(
            operation=data.get("operation"),
            status=data.get("status"),
            retry_after=None if data.get("retryAfter") is None else str(data["retryAfter"]),
            delay=float(data.get("delay", 0.0)),
            times=int(data.get("times", 1)),
            body=data.get("body"),
            code=str(data.get("code", "InjectedFault")),
            sandbox_id=data.get("sandboxId"),
        )


@dataclass
class Sandbox:
    id: str
    seq: int
    labels: dict[str, str]
    body: dict[str, Any]
    root: Path
    created_at: str
    created_mono: float
    state: str = "Creating"
    state_details: dict[str, Any] | None = None
    gets_since_create: int = 0
    egress_policy: dict[str, Any] | None = None
    lifecycle: dict[str, Any] | None = None
    delete_requested: bool = False
    snapshot_id: str | None = None
    #: monotonic time of the last use (create, resume, execution, file operation): what the
    #: service's idle auto-suspend counts from (when the stand-in honours it).
    last_active: float = field(default_factory=time.monotonic)
    stopping_gets: int = 0
    decisions_allowed: list[dict[str, Any]] = field(default_factory=list)
    decisions_denied: list[dict[str, Any]] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "labels": dict(self.labels),
            "sourcesRef": self.body.get("sourcesRef")
            or {"diskImage": {"name": "ubuntu", "isPublic": True}},
            "resources": self.body.get("resources") or {"cpu": "1000m", "memory": "2048Mi"},
            "createdAt": self.created_at,
            "state": self.state,
        }
        for key in ("entrypoint", "cmd", "ports", "connections", "credentialRefs"):
            if key in self.body:
                out[key] = self.body[key]
        if self.state_details is not None:
            out["stateDetails"] = dict(self.state_details)
        if self.snapshot_id is not None:
            out["snapshotId"] = self.snapshot_id
        if self.egress_policy is not None:
            out["egressPolicy"] = self.egress_policy
        if self.lifecycle is not None:
            out["lifecycle"] = self.lifecycle
        return out

    def expires_at(self) -> float | None:
        """Monotonic deadline of an AfterCreation auto-delete policy, if any."""
        policy = (self.lifecycle or {}).get("autoDeletePolicy") or {}
        if not policy.get("enabled") or policy.get("trigger", "AfterCreation") != "AfterCreation":
            return None
        seconds = policy.get("deleteIntervalInSeconds")
        if seconds is None and policy.get("deleteIntervalInDays") is not None:
            seconds = int(policy["deleteIntervalInDays"]) * 86400
        if seconds is None:
            return None
        return self.created_mono + float(seconds)

    def idle_suspend_after(self) -> float | None:
        """Seconds of disuse after which the service idle-suspends it (autoSuspendPolicy)."""
        policy = (self.lifecycle or {}).get("autoSuspendPolicy") or {}
        if not policy.get("enabled") or policy.get("interval") is None:
            return None
        return float(policy["interval"])

    def stop(self, reason: str, *, state: str = "Stopped") -> None:
        """What a stop leaves (reference section 3.6): the state, its reason and time, and the
        snapshot the state was saved to. The sandbox, its files and policies stay."""
        self.state = state
        self.state_details = {"stoppedReason": reason, "stoppedAt": now_iso()}
        if state in ("Stopped", "Stopping"):
            self.snapshot_id = f"snap-{self.id}-{uuid.uuid4().hex[:8]}"


#: Run as `sh -c ROOTED_EXEC rooted ROOT WORKDIR ARGV...` under `unshare --mount`: bind the
#: host's system directories read-only and /dev into ROOT (in the private namespace only, so
#: they vanish with its last process), then chroot there, change to WORKDIR, run ARGV.
ROOTED_EXEC = r"""r=$1; wd=$2; shift 2
for d in /usr /bin /sbin /lib /lib32 /lib64 /libx32 /etc; do
  [ -e "$d" ] || continue
  if [ -L "$d" ]; then
    [ -e "$r$d" ] || [ -L "$r$d" ] || ln -s "$(readlink "$d")" "$r$d"
    continue
  fi
  mkdir -p "$r$d" && mount --rbind "$d" "$r$d" && mount -o remount,bind,ro "$r$d" || exit 126
done
mkdir -p "$r/dev" "$r/tmp" && mount --rbind /dev "$r/dev" || exit 126
exec chroot "$r" /bin/sh -c 'cd "$1" || exit 125; shift; exec "$@"' sh "$wd" "$@"
"""


def rooted_argv(root: Path, workdir: str, argv: list[str]) -> list[str]:
    """`argv` run with `root` as its `/` and `workdir` (a sandbox path) as its directory."""
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--fork",
        "sh",
        "-c",
        ROOTED_EXEC,
        "rooted",
        str(root),
        workdir or "/",
        *argv,
    ]


def resolve_in_root(root: Path, path: str, *, follow_final: bool) -> Path:
    """The host path a process whose `/` is `root` reaches at `path`: every link on the way
    (and the last one with `follow_final`) resolved with `root` as `/`; `..` stops at it."""
    pending = [p for p in path.split("/") if p][::-1]
    parts: list[str] = []
    hops = 0
    while pending:
        name = pending.pop()
        if name == ".":
            continue
        if name == "..":
            if parts:
                parts.pop()
            continue
        here = root.joinpath(*parts, name)
        if here.is_symlink() and (follow_final or pending):
            hops += 1
            if hops > 40:
                raise PermissionError("too many levels of symbolic links")
            target = os.readlink(here)
            if target.startswith("/"):
                parts = []
            pending.extend([p for p in target.split("/") if p][::-1])
            continue
        parts.append(name)
    return root.joinpath(*parts)


class StandinState:
    """Everything the stand-in knows; tests read and steer it directly (or over /_standin)."""

    def __init__(self, *, tokens: tuple[str, ...] | None = ("test-token",)) -> None:
        self.tokens: set[str] | None = None if tokens is None else set(tokens)
        self.expired_tokens: set[str] = set()
        self.sandboxes: dict[str, Sandbox] = {}
        self.policies: dict[str, dict[str, Any]] = {}
        self.faults: list[Fault] = []
        self.calls: Counter[str] = Counter()
        self.executions: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        # behaviour knobs
        self.ready_after_gets = 1
        self.ready_after_seconds = 0.0
        self.startup_state = "Running"
        self.delete_leaves_listed = False
        self.max_file_bytes = 64 * 1024 * 1024
        self.max_sandboxes: int | None = None
        self.exec_timeout = 60.0
        # stop / resume (reference sections 3.6 and 3.8)
        self.stopping_gets = 1  # reads a stop/async sandbox stays Stopping before Stopped
        self.stop_outcome = "Stopped"  # or "StopFailed": the stop cannot save the state
        self.auto_suspend = False  # honour lifecycle.autoSuspendPolicy (idle -> Stopped/Idle)
        # host_paths: sandbox paths ARE host paths (files and executions agree on absolute
        # paths, as conformance suites need). No confinement at all: loopback tests only.
        self.host_paths = False
        # rooted: each sandbox's directory is its `/` for files AND executions, as in a real
        # sandbox's own filesystem: executions run chrooted there (`rooted_argv`: a private
        # mount namespace, the host's system directories bound read-only, /dev), and file
        # operations resolve links with that directory as `/`. Two sandboxes share nothing.
        # Needs root (unshare, mount, chroot). Wins over host_paths.
        self.rooted = False
        self._seq = itertools.count()
        self._base = Path(tempfile.mkdtemp(prefix="acas-standin-"))

    # -- faults --------------------------------------------------------------------------

    def add_fault(self, fault: Fault | None = None, **kw: Any) -> Fault:
        fault = fault or Fault(**kw)
        self.faults.append(fault)
        return fault

    def take_fault(self, operation: str, sandbox_id: str | None) -> Fault | None:
        for fault in self.faults:
            if fault.matches(operation, sandbox_id):
                fault.hits += 1
                if fault.times > 0:
                    fault.times -= 1
                return fault
        return None

    def clear_faults(self) -> None:
        self.faults.clear()

    # -- sandboxes -------------------------------------------------------------------------

    def new_sandbox(
        self,
        body: dict[str, Any],
        *,
        sandbox_id: str | None = None,
        state: str = "Creating",
    ) -> Sandbox:
        sid = sandbox_id or str(uuid.uuid4())
        root = self._base / sid / "root"
        root.mkdir(parents=True, exist_ok=True)
        labels = body.get("labels") or {}
        sandbox = Sandbox(
            id=sid,
            seq=next(self._seq),
            labels={str(k): str(v) for k, v in labels.items()},
            body=dict(body),
            root=root,
            created_at=now_iso(),
            created_mono=time.monotonic(),
            state=state,
            egress_policy=body.get("egressPolicy"),
            lifecycle=body.get("lifecycle"),
        )
        self.sandboxes[sid] = sandbox
        return sandbox

    def seed_sandbox(
        self, sandbox_id: str, *, labels: dict[str, str] | None = None, state: str = "Running"
    ) -> Sandbox:
        """Put a sandbox with a chosen id in place (tests replaying published examples)."""
        return self.new_sandbox({"labels": labels or {}}, sandbox_id=sandbox_id, state=state)

    def advance(self, sandbox: Sandbox) -> None:
        """Creating -> startup_state after `ready_after_gets` reads and `ready_after_seconds`."""
        if sandbox.state == "Creating":
            sandbox.gets_since_create += 1
            old_enough = time.monotonic() - sandbox.created_mono >= self.ready_after_seconds
            if sandbox.gets_since_create >= self.ready_after_gets and old_enough:
                sandbox.state = self.startup_state
        elif sandbox.state == "Stopping":
            sandbox.stopping_gets += 1
            if sandbox.stopping_gets >= self.stopping_gets:
                sandbox.state = self.stop_outcome
                if self.stop_outcome != "Stopped":
                    sandbox.state_details = None

    def remove(self, sandbox_id: str) -> None:
        sandbox = self.sandboxes.pop(sandbox_id, None)
        if sandbox is not None:
            shutil.rmtree(sandbox.root.parent, ignore_errors=True)

    def sweep_expired(self) -> None:
        now = time.monotonic()
        for sandbox in list(self.sandboxes.values()):
            deadline = sandbox.expires_at()
            if deadline is not None and now >= deadline:
                self.remove(sandbox.id)

    def sweep_idle(self) -> None:
        """With `auto_suspend`: a Running sandbox unused for its autoSuspendPolicy interval is
        stopped by the service itself (`Stopped`, `stoppedReason: Idle`)."""
        if not self.auto_suspend:
            return
        now = time.monotonic()
        for sandbox in self.sandboxes.values():
            after = sandbox.idle_suspend_after()
            idle = after is not None and now - sandbox.last_active >= after
            if sandbox.state == "Running" and idle:
                sandbox.stop("Idle")

    def ordered(self) -> list[Sandbox]:
        return sorted(self.sandboxes.values(), key=lambda s: s.seq)

    def close(self) -> None:
        shutil.rmtree(self._base, ignore_errors=True)

    # -- files -------------------------------------------------------------------------------

    def host_path(self, sandbox: Sandbox, path: str, *, follow: bool = False) -> Path:
        """Map a sandbox path (absolute, or relative to /) into the sandbox's directory.

        `..` cannot climb above the sandbox root; a symlink that resolves outside it is refused.
        When `rooted`, links resolve inside the sandbox (its directory as `/`), the last one
        too when `follow` (the operations that act on what a link names, as the service's file
        API does: it has no no-follow).
        """
        if self.rooted:
            return resolve_in_root(sandbox.root, path, follow_final=follow)
        clean = os.path.normpath("/" + path.lstrip("/"))
        if self.host_paths:
            return Path(clean)
        candidate = sandbox.root / clean.lstrip("/")
        resolved_parent = candidate.parent.resolve()
        root = sandbox.root.resolve()
        if resolved_parent != root and root not in resolved_parent.parents:
            raise PermissionError("path escapes the sandbox")
        if candidate.is_symlink():
            target = candidate.resolve()
            if target != root and root not in target.parents:
                raise PermissionError("symlink leads out of the sandbox")
        return candidate

    def sandbox_path(self, sandbox: Sandbox, host: Path) -> str:
        if self.host_paths and not self.rooted:
            return str(host)
        rel = host.relative_to(sandbox.root)
        return "/" + str(rel) if str(rel) != "." else "/"

    def dump(self) -> dict[str, Any]:
        return {
            "sandboxes": [s.to_wire() for s in self.ordered()],
            "calls": dict(self.calls),
            "executions": len(self.executions),
            # stop / stop-async / resume as received, for checks against the reference
            "lifecycleRequests": [
                r
                for r in self.requests
                if "PostSandboxStop" in r["operation"] or "PostSandboxResume" in r["operation"]
            ],
            "faults": [
                {"operation": f.operation, "status": f.status, "times": f.times, "hits": f.hits}
                for f in self.faults
            ],
        }
