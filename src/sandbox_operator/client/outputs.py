"""Collecting a spec's declared outputs, and landing them at a sink.

``collect_outputs`` works in phases, and the order is the contract: everything the declaration
alone decides (a sink for what lands, valid landing names, no two names that are one file, the
``maxFiles`` cap) is settled before the sandbox is touched; then every output is stat-ed and capped
(per file and total); then read; and only then is anything delivered. Delivery cannot be taken
back, so a refusal never leaves a partial landing behind -- except a sink's own per-artifact
refusal during delivery (an occupied destination), which by its nature arrives mid-delivery.

Outputs with ``disposition: consume`` are counted against every cap and returned as bytes to the
caller, never delivered.

Outputs a workload can name only when it runs (``named_at_call``, e.g. what :func:`list_outputs`
found in a directory) go through the same phases, together with the declared ones and under the
same caps, and only for a spec that says so (``outputsNamedAtCallTime``): without the flag a
collection could carry out artifacts nothing judging the spec in advance knew of.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from pydantic import ValidationError

from sandbox_operator.client.errors import (
    ArtifactNameCollision,
    ArtifactNameInvalid,
    CallTimeOutputsNotAllowed,
    LandingExists,
    LandingNotConfined,
    OutputMissing,
    OutputNotRegular,
    OutputSizeUnknown,
    SandboxFileNotFound,
    SinkRequired,
    TransferCapExceeded,
    TransferIntegrityError,
)
from sandbox_operator.client.observer import OutputsCollected, failure_name, notify, record_key
from sandbox_operator.client.paths import collision_key, confine, validate_artifact_name
from sandbox_operator.contract import DeclaredOutput, Disposition, SandboxKey

if TYPE_CHECKING:
    from sandbox_operator.client.dataplane import DirEntry, FileStat
    from sandbox_operator.contract import SandboxSpec


class OutputSource(Protocol):
    """What collecting outputs needs of a sandbox handle (:class:`~sandbox_operator.client.Sandbox`
    is one): its spec and name, its work dir, and the gated reads. Typed structurally so this
    module does not import the handle that calls it."""

    @property
    def spec(self) -> SandboxSpec: ...

    @property
    def name(self) -> str: ...

    @property
    def work_dir(self) -> str: ...

    async def stat(self, path: str) -> FileStat: ...

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes: ...

    async def list_dir(self, path: str = ".") -> list[DirEntry]: ...


@dataclass(frozen=True)
class Artifact:
    """One collected output's bytes, with what the declaration says about it."""

    name: str
    path: str
    media_type: str
    data: bytes
    disposition: Disposition = Disposition.LAND

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class LandedArtifact:
    """Where a sink put an artifact. ``display`` is the one line a model may be shown;
    ``handle`` is the host's own reference (e.g. a file path) and is not for the model."""

    name: str
    media_type: str
    size: int
    handle: str
    display: str


@runtime_checkable
class OutputSink(Protocol):
    async def deliver(self, artifact: Artifact) -> LandedArtifact: ...


@dataclass
class CollectedOutputs:
    """The result of a collection: landed artifacts in declaration order, consumed artifacts by
    name, and the names of optional outputs that were absent."""

    landed: list[LandedArtifact] = field(default_factory=list)
    consumed: dict[str, Artifact] = field(default_factory=dict)
    absent: list[str] = field(default_factory=list)


def check_cap(
    direction: Literal["filesIn", "filesOut"], cap: str, limit: int, actual: int, path: str = ""
) -> None:
    """Raise :class:`TransferCapExceeded` when ``actual`` is over ``limit``: one spelling of a
    transfer-cap check for files out (here) and files in (the handle's writes)."""
    if actual > limit:
        raise TransferCapExceeded(
            direction=direction, cap=cap, limit=limit, actual=actual, path=path
        )


async def collect_outputs(
    sandbox: OutputSource,
    sink: OutputSink | None = None,
    *,
    outputs: tuple[DeclaredOutput, ...] | None = None,
    named_at_call: Sequence[DeclaredOutput] = (),
) -> CollectedOutputs:
    """Collect ``sandbox.spec.declared_outputs`` (or ``outputs``, which must be a subset of the
    declaration) in phases; see the module docstring.

    ``named_at_call`` adds outputs the workload named only now, after the declared ones, under
    the same caps (``filesOut`` bounds the union); raises :class:`CallTimeOutputsNotAllowed`
    before anything else unless the spec sets ``outputsNamedAtCallTime``.

    With an observer on the handle, the collection is reported as one ``OutputsCollected``
    (counts and bytes, or the class name of the refusal that stopped it part-way, with what had
    been delivered by then); each file read is also reported as a ``StoreFileRead``."""
    observer = getattr(sandbox, "observer", None)
    key = getattr(sandbox, "key", None)
    call = record_key(key)
    result = CollectedOutputs()
    failure: str | None = None
    try:
        await _collect(sandbox, sink, outputs, tuple(named_at_call), result)
    except BaseException as exc:
        failure = failure_name(exc)
        raise
    finally:
        notify(
            observer, "outputs_collected", lambda: _collected(result, key, call, sandbox, failure)
        )
    return result


def _collected(
    result: CollectedOutputs,
    key: SandboxKey | None,
    call: str | None,
    sandbox: OutputSource,
    failure: str | None,
) -> OutputsCollected:
    landed = sum(a.size for a in result.landed)
    consumed = sum(a.size for a in result.consumed.values())
    return OutputsCollected(
        key=key,
        call=call,
        sandbox=sandbox.name,
        landed=len(result.landed),
        consumed=len(result.consumed),
        absent=len(result.absent),
        bytes=landed + consumed,
        failure=failure,
    )


async def _collect(
    sandbox: OutputSource,
    sink: OutputSink | None,
    outputs: tuple[DeclaredOutput, ...] | None,
    named_at_call: tuple[DeclaredOutput, ...],
    result: CollectedOutputs,
) -> None:
    spec = sandbox.spec
    if named_at_call and not spec.outputs_named_at_call_time:
        raise CallTimeOutputsNotAllowed(kind=spec.kind, count=len(named_at_call))
    declared = spec.declared_outputs
    if outputs is None:
        outputs = declared
    else:
        unknown = [o.path for o in outputs if o not in declared]
        if unknown:
            raise ValueError(f"outputs not in the spec's declaration: {unknown}")
    outputs = outputs + named_at_call
    limits = spec.files_out

    # Phase 1: the declaration alone.
    landing = [o for o in outputs if o.disposition is Disposition.LAND]
    if landing and sink is None:
        raise SinkRequired()
    check_cap("filesOut", "max_files", limits.max_files, len(outputs))
    seen: dict[str, str] = {}
    for out in outputs:
        confine(out.path, sandbox.work_dir)
        if out.disposition is Disposition.LAND:
            name = validate_artifact_name(out.landing_name)
            key = collision_key(name)
            if key in seen:
                raise ArtifactNameCollision(first=seen[key], second=name)
            seen[key] = name

    # Phase 2: stat and cap every output.
    present: list[tuple[DeclaredOutput, int]] = []
    absent: list[str] = []
    total = 0
    for out in outputs:
        try:
            st = await sandbox.stat(out.path)
        except SandboxFileNotFound:
            if out.required:
                raise OutputMissing(path=out.path, name=out.landing_name) from None
            absent.append(out.landing_name)
            continue
        if st.kind != "file":
            raise OutputNotRegular(path=out.path, kind=st.kind)
        if st.size is None:
            raise OutputSizeUnknown(path=out.path)
        check_cap("filesOut", "max_bytes_per_file", limits.max_bytes_per_file, st.size, out.path)
        total += st.size
        check_cap("filesOut", "max_total_bytes", limits.max_total_bytes, total, out.path)
        present.append((out, st.size))

    # Phase 3: read, exactly the size that was capped.
    artifacts: list[Artifact] = []
    for out, size in present:
        try:
            data = await sandbox.read_file(out.path, max_bytes=size)
        except TransferCapExceeded as exc:
            raise TransferIntegrityError(
                path=out.path, expected=size, received=exc.actual
            ) from None
        if len(data) != size:
            raise TransferIntegrityError(path=out.path, expected=size, received=len(data))
        artifacts.append(
            Artifact(
                name=out.landing_name,
                path=out.path,
                media_type=out.media_type,
                data=data,
                disposition=out.disposition,
            )
        )

    # Phase 4: deliver.
    result.absent.extend(absent)
    for art in artifacts:
        if art.disposition is Disposition.CONSUME:
            result.consumed[art.name] = art
            continue
        assert sink is not None
        result.landed.append(await sink.deliver(art))


# --------------------------------------------------------------------------------------------
# Listing, for outputs named at the call


async def list_outputs(
    sandbox: OutputSource,
    directory: str = ".",
    *,
    media_type: str = "application/octet-stream",
    disposition: Disposition = Disposition.LAND,
    required: bool = True,
) -> tuple[DeclaredOutput, ...]:
    """The first half of the list-then-collect route: one :class:`DeclaredOutput` per entry
    directly under ``directory`` (relative to the work dir), to pass to
    ``collect_outputs(named_at_call=...)``. Gated like :meth:`Sandbox.list_dir` (the spec must
    require ``files_list``); one level, never recursive.

    Directories are left out (the caller lists them itself if it wants them); a symlink or other
    non-file entry is kept, so the collection refuses it by name (:class:`OutputNotRegular`)
    rather than this listing hiding it. The names are the guest's: one that cannot be a literal
    output path (a glob character, a backslash, a control or invisible character) is refused
    with :class:`ArtifactNameInvalid`, never skipped. ``media_type`` is the caller's, never
    sniffed from the bytes."""
    entries = await sandbox.list_dir(directory)
    prefix = "" if directory in ("", ".") else directory.rstrip("/") + "/"
    found: list[DeclaredOutput] = []
    for entry in entries:
        if entry.kind == "dir":
            continue
        path = prefix + entry.name
        try:
            found.append(
                DeclaredOutput(
                    path=path, media_type=media_type, disposition=disposition, required=required
                )
            )
        except ValidationError:
            raise ArtifactNameInvalid(name=path, rule="not_a_literal_output_path") from None
    return tuple(found)


# --------------------------------------------------------------------------------------------
# Filesystem sink


def _default_display(artifact: Artifact) -> str:
    return f"{artifact.name} ({artifact.media_type}, {artifact.size} bytes)"


class FileSystemSink:
    """Lands artifacts under ``root`` on the host.

    Each destination is resolved component by component: a symlink anywhere below ``root`` is
    refused with :class:`LandingNotConfined` (a link could carry the write out of ``root``), a
    destination that exists is refused with :class:`LandingExists` unless ``existing="replace"``,
    and missing parents are created. A fresh file is an exclusive, no-follow create; a replacement
    is written beside the destination and renamed over it (a rename replaces a link, never follows
    it).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        existing: Literal["refuse", "replace"] = "refuse",
        display: Callable[[Artifact], str] | None = None,
    ) -> None:
        self.root = Path(root)
        self.existing = existing
        self.display = display or _default_display

    def _destination(self, name: str) -> Path:
        validate_artifact_name(name)
        root = self.root.resolve()
        root.mkdir(parents=True, exist_ok=True)
        parts = name.split("/")
        cur = root
        for part in parts[:-1]:
            cur = cur / part
            if cur.is_symlink():
                raise LandingNotConfined(name=name)
            if not cur.exists():
                cur.mkdir()
            elif not cur.is_dir():
                raise LandingNotConfined(name=name)
        dest = cur / parts[-1]
        if dest.is_symlink():
            raise LandingNotConfined(name=name)
        if not dest.resolve().is_relative_to(root):  # belt and braces
            raise LandingNotConfined(name=name)
        return dest

    async def deliver(self, artifact: Artifact) -> LandedArtifact:
        dest = self._destination(artifact.name)
        if self.existing == "refuse":
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
            try:
                fd = os.open(dest, flags, 0o644)
            except FileExistsError:
                raise LandingExists(name=artifact.name) from None
            with os.fdopen(fd, "wb") as fh:
                fh.write(artifact.data)
        else:
            if dest.is_dir():
                raise LandingExists(name=artifact.name)
            tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
            fd = os.open(tmp, flags, 0o644)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(artifact.data)
                os.replace(tmp, dest)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        return LandedArtifact(
            name=artifact.name,
            media_type=artifact.media_type,
            size=artifact.size,
            handle=str(dest),
            display=self.display(artifact),
        )


def make_file_system_sink(
    root: str | os.PathLike[str],
    *,
    existing: Literal["refuse", "replace"] = "refuse",
    display: Callable[[Artifact], str] | None = None,
) -> FileSystemSink:
    """A :class:`FileSystemSink` under ``root``."""
    return FileSystemSink(root, existing=existing, display=display)
