"""Lexical path confinement under a sandbox's work dir, and landing-name validation.

The lexical checks here run on the client before anything reaches the sandbox. The checks that
depend on what is on disk (a symlinked parent, a symlinked destination) cannot be answered here:
the data plane answers them inside the sandbox, right before it acts.
"""

from __future__ import annotations

import posixpath
import unicodedata
from dataclasses import dataclass

from sandbox_operator.client.errors import ArtifactNameInvalid, PathRefused


@dataclass(frozen=True)
class ConfinedPath:
    """A path confined under ``work_dir``: ``relative`` has no empty, ``.`` or ``..`` segment."""

    work_dir: str
    relative: str

    @property
    def absolute(self) -> str:
        return f"{self.work_dir}/{self.relative}" if self.relative else self.work_dir

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.relative.split("/")) if self.relative else ()


def normalize_work_dir(work_dir: str) -> str:
    """The work dir as an absolute path without a trailing slash (refused when not absolute)."""
    if not work_dir.startswith("/") or "\\" in work_dir or "\x00" in work_dir:
        raise PathRefused(path=work_dir, rule="absolute_outside_work_dir", detail="work dir")
    wd = posixpath.normpath(work_dir)
    if wd.startswith("//"):
        wd = "/" + wd.lstrip("/")
    if wd == "/":
        raise PathRefused(path=work_dir, rule="work_dir_itself", detail="work dir may not be /")
    return wd


def _lexical_rule(segments: list[str]) -> str | None:
    for seg in segments:
        if seg == "":
            return "empty_segment"
        if seg == "..":
            return "parent_traversal"
        if seg == ".":
            return "dot_segment"
    return None


def _character_rule(text: str, *, nul: str) -> str | None:
    """The rule a character of ``text`` breaks (a NUL breaks ``nul``), or None."""
    if "\\" in text:
        return "backslash"
    if "\x00" in text:
        return nul
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        return "control_character"
    return None


def confine(path: str, work_dir: str, *, allow_work_dir: bool = False) -> ConfinedPath:
    """Confine ``path`` (relative to ``work_dir``, or absolute inside it) lexically.

    Refuses: empty paths, backslashes, NUL and other control characters, ``..``/``.``/empty
    segments, absolute paths outside ``work_dir``, and ``work_dir`` itself (unless
    ``allow_work_dir``, for listing).
    """
    wd = normalize_work_dir(work_dir)
    if path == "" or path == ".":
        if allow_work_dir:
            return ConfinedPath(wd, "")
        raise PathRefused(path=path, rule="work_dir_itself" if path else "empty")
    rule = _character_rule(path, nul="nul")
    if rule is not None:
        raise PathRefused(path=path, rule=rule)
    if path.startswith("/"):
        raw = path.split("/")[1:]
        rule = _lexical_rule(raw[:-1] if raw and raw[-1] == "" else raw)
        if rule == "parent_traversal":
            raise PathRefused(path=path, rule=rule)
        stripped = path.rstrip("/")
        if stripped == wd:
            if allow_work_dir:
                return ConfinedPath(wd, "")
            raise PathRefused(path=path, rule="work_dir_itself")
        if not stripped.startswith(wd + "/"):
            raise PathRefused(path=path, rule="absolute_outside_work_dir")
        rel = path[len(wd) + 1 :]
    else:
        rel = path
    segments = rel.split("/")
    rule = _lexical_rule(segments)
    if rule is not None:
        raise PathRefused(path=path, rule=rule)
    return ConfinedPath(wd, rel)


def validate_artifact_name(name: str) -> str:
    """Check a landing name lexically: relative, no ``..``/``.``/empty segments, no backslash,
    no control characters. Returns the name unchanged."""
    if not name:
        raise ArtifactNameInvalid(name=name, rule="empty")
    rule = _character_rule(name, nul="control_character")
    if rule is not None:
        raise ArtifactNameInvalid(name=name, rule=rule)
    if name.startswith("/"):
        raise ArtifactNameInvalid(name=name, rule="absolute_outside_work_dir")
    rule = _lexical_rule(name.split("/"))
    if rule is not None:
        raise ArtifactNameInvalid(name=name, rule=rule)
    return name


def collision_key(name: str) -> str:
    """Two landing names with the same key are one file on some destination."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFD", name).casefold())
