"""An engine-side view of one sandbox's pod, for maf-sandbox's ``assert_nothing_left_behind``.

:class:`NodeFingerprintSubject` is a ``maf_sandbox.conformance.FingerprintSubject`` for a pod
served on *this* node (the local cluster's): it asks containerd (``ctr``) for the container's
task, then reads the host kernel's view of it, never running anything inside the sandbox (a
guest utility could lie or be missing):

- changed paths: every entry of the root overlay's upper directory (the container's writable
  layer: what containerd's snapshot marks changed stays changed even when its bytes return), and
  every entry of each other writable mount (the pod's volumes, ``/dev``, ``/dev/shm``, the
  runtime's ``/etc/hosts``...) read through ``/proc/PID/root`` and compared with the first
  fingerprint's;
- running programs: every host process in the container's PID namespace, named by pid, kernel
  start time and command name, so a replacement with the same command line differs.

The first fingerprint is the baseline: the writable layer may already hold the mount points the
runtime created (``/etc/hostname`` and friends) before any call, so "changed" means changed since
the first fingerprint, which ``assert_nothing_left_behind`` takes before the call it measures.

On gVisor the host kernel does not see the container's processes or its root filesystem (the
sentry runs them), so the subject reads what the node still offers, again without a guest
utility:

- running programs: ``runsc --root <containerd's runsc state> ps <container>`` through the
  cluster's runsc wrapper (the shim's binary), the sentry's own task list (pid, start, command);
- changed paths: every writable bind mount of the container's OCI spec (the pod's volumes, the
  work dir's among them, ``/etc/hosts``, ``/dev/shm``...) read at its host source, which gVisor's
  gofer writes through to.

Not measured on gVisor (stated in :attr:`NodeFingerprintSubject.not_measured`): the root
filesystem's overlay (runsc's default ``--overlay2=root:self`` keeps its upper layer in one
opaque filestore file; this operator's pods run with a read-only root unless a backend's
``read_only_root_filesystem`` is turned off, so no call can change it)
and the sentry's own tmpfs mounts (``/dev``), which have no host source.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maf_sandbox.conformance import SandboxFingerprint

#: Filesystems that hold no files a call could leave behind (the kernel's views and handles).
PSEUDO_FILESYSTEMS = frozenset(
    {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "securityfs", "debugfs"}
)

GVISOR_NOT_MEASURED = (
    "gVisor: the root filesystem's overlay (kept inside the sentry's filestore; the pod's root is "
    "read-only unless the backend turns that off) and the sentry's own tmpfs mounts (/dev), "
    "which have no host source"
)


def default_containerd_socket() -> Path:
    """The local cluster's containerd socket (hack/localcluster/layout.py's path)."""
    cache = Path(os.environ.get("SANDBOX_OPERATOR_CACHE", Path.home() / ".cache/sandbox-operator"))
    state = Path(os.environ.get("SANDBOX_OPERATOR_STATE", cache / "state"))
    return state / "containerd" / "containerd.sock"


def pod_of(sandbox: object) -> tuple[str, str]:
    """``(namespace, pod name)`` of a sandbox that names its pod (``OperatorSandbox``: ``pod``
    and ``namespace``; ``pod_name`` is read too)."""
    namespace = getattr(sandbox, "namespace", "")
    pod = getattr(sandbox, "pod_name", "") or getattr(sandbox, "pod", "")
    if not (isinstance(namespace, str) and namespace and isinstance(pod, str) and pod):
        raise TypeError(f"{type(sandbox).__name__} names no pod and namespace")
    return namespace, pod


class FingerprintError(RuntimeError):
    """The node's view of the sandbox could not be read completely; the probe must fail."""


@dataclass(frozen=True)
class Task:
    """The sandbox's container as containerd runs it."""

    container_id: str
    pid: int
    runtime_binary: str


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """What makes an entry "the same": a directory by its own metadata (its entries are listed
    separately), a device by its number, anything else also by size and change times."""
    base = (stat.S_IFMT(st.st_mode), st.st_mode, st.st_uid, st.st_gid, st.st_ino)
    if stat.S_ISDIR(st.st_mode):
        return base
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return (*base, st.st_rdev)
    return (*base, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class NodeFingerprintSubject:
    """The node's view of one sandbox's pod: its container's changed paths and processes.

    Runs where containerd runs (the local cluster's node, as root). Create one per measured
    sandbox: the first :meth:`fingerprint` is its baseline.
    """

    def __init__(
        self,
        sandbox: object,
        *,
        container: str | None = None,
        containerd_socket: Path | None = None,
        ctr: str = "ctr",
        max_entries: int = 50_000,
        timeout: float = 30.0,
    ) -> None:
        self.namespace, self.pod_name = pod_of(sandbox)
        self.container = container
        self.socket = containerd_socket or default_containerd_socket()
        self.ctr = ctr
        self.max_entries = max_entries
        self.timeout = timeout
        #: Why this sandbox cannot be fingerprinted from the node (set when that is found).
        self.unsupported_reason: str | None = None
        #: What of the sandbox the node's view leaves out (set on gVisor), for the report.
        self.not_measured: str | None = None
        self._gvisor = False
        self._task: Task | None = None
        self._baseline: dict[str, tuple[int, ...]] | None = None

    async def _ctr(self, *args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            self.ctr,
            "--address",
            str(self.socket),
            "-n",
            "k8s.io",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), self.timeout)
        if proc.returncode:
            raise FingerprintError(f"ctr {args[0]} {args[1]} failed: {err.decode()[-500:]}")
        return out.decode()

    async def _locate(self) -> Task:
        """The pod's (app) container and its task's pid, by the CRI's labels."""
        filters = [
            f'labels."io.kubernetes.pod.name"=={self.pod_name}',
            f'labels."io.kubernetes.pod.namespace"=={self.namespace}',
        ]
        ids = (await self._ctr("containers", "ls", "-q", ",".join(filters))).split()
        found: list[tuple[str, dict[str, Any]]] = []
        for cid in ids:
            info: dict[str, Any] = json.loads(await self._ctr("containers", "info", cid))
            labels = info.get("Labels") or {}
            if labels.get("io.cri-containerd.kind") != "container":
                continue  # the pod's sandbox (pause) container
            if self.container and labels.get("io.kubernetes.container.name") != self.container:
                continue
            found.append((cid, info))
        if len(found) != 1:
            names = sorted(
                (i.get("Labels") or {}).get("io.kubernetes.container.name", "?") for _, i in found
            )
            raise FingerprintError(
                f"pod {self.namespace}/{self.pod_name}: expected one app container, found {names}"
            )
        cid, info = found[0]
        binary = _runtime_binary((info.get("Runtime") or {}).get("Options") or {})
        pid = 0
        for line in (await self._ctr("tasks", "ls")).splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 3 and fields[0] == cid:
                if fields[2] != "RUNNING":
                    raise FingerprintError(f"container {cid[:12]} is {fields[2]}, not running")
                pid = int(fields[1])
        if pid <= 0:
            raise FingerprintError(f"container {cid[:12]} has no running task")
        return Task(cid, pid, binary)

    async def fingerprint(self) -> SandboxFingerprint | None:
        """Snapshot the container's changed paths and processes; ``None`` on gVisor."""
        task = await self._locate()
        if self._task is not None and task.container_id != self._task.container_id:
            raise FingerprintError("the sandbox's container was replaced between fingerprints")
        if self._task is not None and ("runsc" in task.runtime_binary) != self._gvisor:
            raise FingerprintError("the sandbox's runtime changed between fingerprints")
        self._gvisor = "runsc" in task.runtime_binary
        if self._gvisor:
            self.not_measured = GVISOR_NOT_MEASURED
            mounts = await self._writable_binds(task)
            entries = await asyncio.to_thread(self._read_binds, mounts)
            programs = await self._runsc_programs(task)
            self._task = task
            return self._compare(entries, programs)
        self._task = task
        entries, programs = await asyncio.to_thread(self._read, task.pid)
        return self._compare(entries, programs)

    def _compare(
        self, entries: dict[str, tuple[int, ...]], programs: set[str]
    ) -> SandboxFingerprint:
        if self._baseline is None:
            self._baseline = entries
        changed = {
            path
            for path in entries.keys() | self._baseline.keys()
            if entries.get(path) != self._baseline.get(path)
        }
        return SandboxFingerprint(
            changed_paths=frozenset(p.split(":", 1)[1] for p in changed),
            running_programs=frozenset(programs),
        )

    # -- gVisor: the OCI spec's writable binds and the sentry's task list

    async def _writable_binds(self, task: Task) -> list[tuple[str, Path]]:
        """``(destination, host source)`` of each writable bind mount of the container."""
        info: dict[str, Any] = json.loads(await self._ctr("containers", "info", task.container_id))
        binds: list[tuple[str, Path]] = []
        for mount in (info.get("Spec") or {}).get("mounts") or []:
            options = mount.get("options") or []
            if mount.get("type") != "bind" or "ro" in options:
                continue
            binds.append((str(mount["destination"]), Path(mount["source"])))
        if not binds:
            raise FingerprintError(f"container {task.container_id[:12]} has no writable mount")
        return binds

    def _read_binds(self, binds: list[tuple[str, Path]]) -> dict[str, tuple[int, ...]]:
        entries: dict[str, tuple[int, ...]] = {}
        for destination, source in binds:
            self._walk(source, destination, "mount", entries, same_device=True)
        return entries

    async def _runsc_programs(self, task: Task) -> set[str]:
        """The sentry's tasks of this container, as ``pid:start:command`` (``runsc ps``)."""
        binary, root = task.runtime_binary, str(self.socket.parent / "runsc")
        if not binary.startswith("/"):  # containerd's runc Options: 6 binary_name, 7 root
            options = _protobuf_strings(binary.encode("latin-1"))
            binary, root = options.get(6, ""), options.get(7, root)
        if "runsc" not in binary:
            raise FingerprintError("the container's runtime names no runsc binary")
        proc = await asyncio.create_subprocess_exec(
            binary,
            "--root",
            f"{root}/k8s.io",  # the runtime's root holds one directory per containerd namespace
            "ps",
            task.container_id,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), self.timeout)
        if proc.returncode:
            raise FingerprintError(f"runsc ps failed: {err.decode()[-500:]}")
        lines = out.decode().splitlines()
        if not lines or lines[0].split()[:2] != ["UID", "PID"]:
            raise FingerprintError("runsc ps printed no process table")
        programs: set[str] = set()
        for line in lines[1:]:
            fields = line.split(None, 8)
            if len(fields) == 9:  # UID PID PPID PGID C TTY STIME TIME CMD
                programs.add(f"{fields[1]}:{fields[6]}:{fields[8]}")
        return programs

    # -- the host's view (blocking; run in a thread)

    def _read(self, pid: int) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        mounts = _mountinfo(pid)
        entries: dict[str, tuple[int, ...]] = {}
        root = next((m for m in mounts if m.point == "/"), None)
        if root is None or root.fstype != "overlay" or "upperdir" not in root.super_options:
            raise FingerprintError("the container's root is not an overlay with an upper layer")
        upper = Path(root.super_options["upperdir"])
        self._walk(upper, "/", "upper", entries, same_device=False)
        for mount in mounts:
            if mount.point == "/" or mount.fstype in PSEUDO_FILESYSTEMS or not mount.writable:
                continue
            if mount.point.startswith(("/proc/", "/sys/")) and mount.fstype not in ("tmpfs",):
                continue  # masked kernel paths (bind mounts of /dev/null)
            host_path = Path(f"/proc/{pid}/root{mount.point}")
            self._walk(host_path, mount.point, "mount", entries, same_device=True)
        return entries, _pid_namespace_programs(pid)

    def _walk(
        self,
        top: Path,
        shown_as: str,
        kind: str,
        entries: dict[str, tuple[int, ...]],
        *,
        same_device: bool,
    ) -> None:
        """Every entry under ``top`` (without following links or crossing into other mounts),
        keyed ``kind:path as the sandbox sees it``."""
        try:
            top_stat = top.lstat()
        except OSError as exc:
            raise FingerprintError(f"cannot read {shown_as}: {exc.strerror}") from exc
        if kind == "mount":
            entries[f"mount:{shown_as}"] = _identity(top_stat)
        if not stat.S_ISDIR(top_stat.st_mode):
            return
        stack = [(top, shown_as.rstrip("/"))]
        while stack:
            directory, shown = stack.pop()
            try:
                listing = list(os.scandir(directory))
            except OSError as exc:
                raise FingerprintError(f"cannot list {shown or '/'}: {exc.strerror}") from exc
            for entry in listing:
                st = entry.stat(follow_symlinks=False)
                if same_device and st.st_dev != top_stat.st_dev:
                    continue  # another mount: read as its own if it is writable
                path = f"{shown}/{entry.name}"
                entries[f"{kind}:{path}"] = _identity(st)
                if len(entries) > self.max_entries:
                    raise FingerprintError(f"more than {self.max_entries} entries to compare")
                if stat.S_ISDIR(st.st_mode):
                    stack.append((Path(entry.path), path))


def _runtime_binary(options: dict[str, Any]) -> str:
    """The shim's runtime binary from containerd's runc options: ``ctr`` shows them as JSON or,
    for the CRI's containers, as the protobuf ``containerd.runc.v1.Options`` in base64, whose
    binary name field is a plain string in it."""
    if "BinaryName" in options or "binary_name" in options:
        return str(options.get("BinaryName") or options.get("binary_name"))
    try:
        raw = base64.b64decode(str(options.get("value", "")))
    except ValueError:
        return ""
    return raw.decode("latin-1")


def _protobuf_strings(raw: bytes) -> dict[int, str]:
    """The length-delimited fields of a flat protobuf message, by field number (containerd's
    runc ``Options``: 6 = binary_name, 7 = root); other wire types are stepped over."""

    def varint(at: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            byte = raw[at]
            value |= (byte & 0x7F) << shift
            at += 1
            if not byte & 0x80:
                return value, at
            shift += 7

    fields: dict[int, str] = {}
    at = 0
    try:
        while at < len(raw):
            tag, at = varint(at)
            wire = tag & 7
            if wire == 0:
                _, at = varint(at)
            elif wire == 2:
                size, at = varint(at)
                fields[tag >> 3] = raw[at : at + size].decode("utf-8", "replace")
                at += size
            elif wire in (1, 5):
                at += 8 if wire == 1 else 4
            else:
                break
    except IndexError:
        pass
    return fields


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    writable: bool
    super_options: dict[str, str]


def _mountinfo(pid: int) -> list[Mount]:
    """The container's mounts as its own mount namespace lists them."""
    mounts: list[Mount] = []
    text = Path(f"/proc/{pid}/mountinfo").read_text()
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        point = fields[4].encode().decode("unicode_escape")
        options = set(fields[5].split(","))
        supers: dict[str, str] = {}
        for item in tail[2].split(",") if len(tail) > 2 else ():
            key, _, value = item.partition("=")
            supers[key] = value
        mounts.append(Mount(point, tail[0], "rw" in options, supers))
    return mounts


def _pid_namespace_programs(pid: int) -> set[str]:
    """Every host process in ``pid``'s PID namespace, as ``pid:start time:command``."""
    namespace = os.readlink(f"/proc/{pid}/ns/pid")
    programs: set[str] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/ns/pid") != namespace:
                continue
            raw = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue  # exited meanwhile
        command = raw[raw.index("(") + 1 : raw.rindex(")")]
        start = raw[raw.rindex(")") + 2 :].split()[19]
        programs.add(f"{name}:{start}:{command}")
    return programs
