"""Lexical confinement under the work dir and landing-name validation."""

from __future__ import annotations

import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox_operator.client.errors import ArtifactNameInvalid, PathRefused
from sandbox_operator.client.paths import collision_key, confine, validate_artifact_name

WD = "/workspace"


@pytest.mark.parametrize(
    ("path", "rel"),
    [
        ("a.txt", "a.txt"),
        ("d/e/f", "d/e/f"),
        ("/workspace/a", "a"),
        ("/workspace/d/e", "d/e"),
        ("..a", "..a"),
        ("a..", "a.."),
        (".hidden", ".hidden"),
    ],
)
def test_confined(path: str, rel: str) -> None:
    c = confine(path, WD)
    assert c.relative == rel
    assert c.absolute == f"{WD}/{rel}"


@pytest.mark.parametrize(
    ("path", "rule"),
    [
        ("", "empty"),
        (".", "work_dir_itself"),
        ("/workspace", "work_dir_itself"),
        ("/workspace/", "work_dir_itself"),
        ("..", "parent_traversal"),
        ("../x", "parent_traversal"),
        ("a/../../x", "parent_traversal"),
        ("/workspace/../etc/passwd", "parent_traversal"),
        ("/etc/passwd", "absolute_outside_work_dir"),
        ("/workspace2/x", "absolute_outside_work_dir"),
        ("/", "absolute_outside_work_dir"),
        ("a\\b", "backslash"),
        ("..\\x", "backslash"),
        ("a//b", "empty_segment"),
        ("a/", "empty_segment"),
        ("./a", "dot_segment"),
        ("a/./b", "dot_segment"),
        ("a\x00b", "nul"),
        ("a\nb", "control_character"),
    ],
)
def test_refused(path: str, rule: str) -> None:
    with pytest.raises(PathRefused) as info:
        confine(path, WD)
    assert info.value.rule == rule
    assert info.value.path == path


def test_work_dir_allowed_for_listing() -> None:
    assert confine(".", WD, allow_work_dir=True).relative == ""
    assert confine("/workspace", WD, allow_work_dir=True).absolute == WD


def test_trailing_slash_work_dir_normalized() -> None:
    assert confine("a", "/workspace/").absolute == "/workspace/a"


@given(st.text(alphabet=st.sampled_from(list("ab./\\-_ \x00")), max_size=24))
def test_confined_paths_never_escape(path: str) -> None:
    try:
        c = confine(path, WD)
    except PathRefused:
        return
    norm = posixpath.normpath(c.absolute)
    assert norm.startswith(WD + "/")
    assert norm == c.absolute
    assert norm != WD


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("", "empty"),
        ("/abs", "absolute_outside_work_dir"),
        ("../x", "parent_traversal"),
        ("a\\b", "backslash"),
        ("a//b", "empty_segment"),
        ("a\tb", "control_character"),
    ],
)
def test_artifact_name_refused(name: str, rule: str) -> None:
    with pytest.raises(ArtifactNameInvalid) as info:
        validate_artifact_name(name)
    assert info.value.rule == rule


def test_collision_key_case_and_unicode_forms() -> None:
    assert collision_key("Report.PNG") == collision_key("report.png")
    assert collision_key("caf\u00e9") == collision_key("cafe\u0301")
    assert collision_key("a") != collision_key("b")
