"""The conformance suites pass on a correct data plane and catch each deliberate defect."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from sandbox_operator.conformance import (
    ConformanceError,
    assert_files_in_conformance,
    check_call_scope,
    check_exec,
    check_files_delete,
    check_files_in,
    check_files_out,
    check_host_tools,
    check_reclaim,
    check_sandbox,
)
from sandbox_operator.contract import Capability
from sandbox_operator.testing.fakes import DEFECTS, local_sandbox

SMALL_IN = {"max_bytes_per_file": 64 * 1024, "max_total_bytes": 128 * 1024, "max_files": 8}


def sandbox(tmp_path: Path, *defects: str, **kw: object):  # type: ignore[no-untyped-def]
    return local_sandbox(root=str(tmp_path), defects=set(defects), files_in=SMALL_IN, **kw)


async def test_all_suites_pass_on_the_correct_data_plane(tmp_path: Path) -> None:
    reports = await check_sandbox(sandbox(tmp_path))
    for report in reports:
        assert report.ok, report.failures
        assert report.passed and not report.skipped
    assert [r.suite for r in reports] == [
        "files_in",
        "files_out",
        "exec",
        "files_delete",
        "reclaim",
    ]


SUITES = {
    "files_in": check_files_in,
    "files_out": check_files_out,
    "exec": check_exec,
    "files_delete": check_files_delete,
    "reclaim": check_reclaim,
    # Short runs: a defect that loses an answer leaves the program waiting until its timeout.
    "host_tools": functools.partial(check_host_tools, run_timeout=1.5, overrun_timeout=1.5),
}

# defect -> (suite, probes that must fail)
CAUGHT = {
    "write_follows_symlinks": (
        "files_in",
        {
            "refuses_symlinked_parent",
            "refuses_symlink_destination",
            "refuses_dangling_symlink_destination",
            "escapes_created_nothing",
        },
    ),
    "write_mangles_bytes": ("files_in", {"bytes_round_trip"}),
    "read_truncates": ("files_out", {"cap_refuses_not_truncates"}),
    "read_follows_symlinks": ("files_out", {"symlink_unreadable", "linked_parent_refused"}),
    "stat_follows_symlinks": ("files_out", {"symlink_stat_as_symlink", "linked_parent_refused"}),
    "list_follows_symlinks": ("files_out", {"listing"}),
    "exec_through_shell": ("exec", {"verbatim_argv"}),
    "exec_ignores_cwd": ("exec", {"cwd", "default_cwd_is_work_dir"}),
    "exec_no_kill": ("exec", {"timeout_kills_group"}),
    "remove_follows_symlinks": ("files_delete", {"link_not_followed", "linked_dir_not_followed"}),
    "remove_missing_raises": ("files_delete", {"missing_is_success"}),
    "remove_noop": ("reclaim", {"dir_gone", "link_itself_removed"}),
    "resp_write_lost": ("host_tools", {"round_trip_exact", "delivered_means_received"}),
    "exec_kill_noop": ("host_tools", {"overrun_signalled"}),
    "exec_reaps_detached": ("host_tools", {"round_trip_exact", "overrun_signalled"}),
}

# defect -> (suite, probes that must still pass): a hostile environment the channel itself
# defends against, so the suite holding the backend to the contract must not blame the backend.
TOLERATED = {
    # An image's PYTHONPATH naming the working directory ("/app:" or "."): the launcher keeps
    # only absolute entries, so a model-named file in work/ cannot shadow a module the shim uses.
    "exec_env_imports_cwd": ("host_tools", {"model_files_cannot_shadow_shim", "round_trip_exact"}),
}


def test_every_defect_is_exercised() -> None:
    assert set(CAUGHT) | set(TOLERATED) == DEFECTS
    assert not set(CAUGHT) & set(TOLERATED)


@pytest.mark.parametrize("defect", sorted(TOLERATED))
async def test_channel_withstands_defect(tmp_path: Path, defect: str) -> None:
    suite, must_pass = TOLERATED[defect]
    report = await SUITES[suite](sandbox(tmp_path, defect))
    assert must_pass <= set(report.passed), (defect, report.failures)


@pytest.mark.parametrize("defect", sorted(CAUGHT))
async def test_suite_catches_defect(tmp_path: Path, defect: str) -> None:
    suite, must_fail = CAUGHT[defect]
    report = await SUITES[suite](sandbox(tmp_path, defect))
    assert must_fail <= set(report.failed), (defect, report.failures)
    assert not report.ok


async def test_defects_also_caught_elsewhere(tmp_path: Path) -> None:
    report = await check_reclaim(sandbox(tmp_path, "remove_follows_symlinks"))
    assert "links_not_followed" in report.failed or "link_itself_removed" in report.failed
    report = await check_files_delete(sandbox(tmp_path / "b", "remove_noop"))
    assert "remove_file" in report.failed
    # A removal that removes nothing leaves a host-tool run's transport behind.
    report = await SUITES["host_tools"](sandbox(tmp_path / "c", "remove_noop"))
    assert {"transport_removed", "overrun_signalled", "delivery_uncertain_when_cut"} <= set(
        report.failed
    )


async def test_failures_reported_together_with_names(tmp_path: Path) -> None:
    sb = sandbox(tmp_path, "write_follows_symlinks", "write_mangles_bytes")
    with pytest.raises(ConformanceError) as info:
        await assert_files_in_conformance(sb)
    names = set(info.value.probes)
    assert {"bytes_round_trip", "refuses_symlinked_parent"} <= names
    text = str(info.value)
    assert "bytes_round_trip" in text and "refuses_symlinked_parent" in text


async def test_wrong_exception_type_is_a_failure(tmp_path: Path) -> None:
    # stat_follows_symlinks answers a missing parent link with SandboxFileNotFound rather than
    # PathRefused: a failure, not a pass.
    report = await check_files_out(sandbox(tmp_path, "stat_follows_symlinks"))
    detail = {f.probe: f.detail for f in report.failures}
    assert "linked_parent_refused" in detail


async def test_unrequired_capabilities_skip_and_must_refuse(tmp_path: Path) -> None:
    sb = local_sandbox(root=str(tmp_path), requires=frozenset({Capability.EXEC}))
    report = await check_files_in(sb)
    assert report.passed == ["write_file_refused_without_capability"]
    assert report.skipped
    report = await check_files_out(sb)
    assert report.passed == ["read_file_refused_without_capability"]


async def test_call_scope_suite(tmp_path: Path) -> None:
    a = sandbox(tmp_path / "a")
    b = sandbox(tmp_path / "b")
    assert (await check_call_scope(a, b)).ok
    shared = local_sandbox(root=str(tmp_path / "a"), files_in=SMALL_IN)
    report = await check_call_scope(a, shared)
    assert {"files_not_shared", "tmp_not_shared"} <= set(report.failed)


async def test_host_tools_suite_passes_on_the_correct_data_plane(tmp_path: Path) -> None:
    report = await check_host_tools(sandbox(tmp_path), run_timeout=30.0, overrun_timeout=5.0)
    assert report.ok, report.failures
    assert report.skipped == []
    assert set(report.passed) == {
        "round_trip_exact",
        "unregistered_tool_refused",
        "bad_arguments_refused_not_executed",
        "cap_counts_refusals",
        "oversized_response_refused",
        "transport_removed",
        "cwd_is_work_dir",
        "model_files_cannot_shadow_shim",
        "overrun_signalled",
        "delivery_uncertain_when_cut",
        "delivered_means_received",
    }
    # Nothing of the runs is left in the work dir.
    assert not (tmp_path / "work" / ".host-tools").exists()


async def test_host_tools_suite_needs_the_channel_and_host_tools(tmp_path: Path) -> None:
    # Without files_out the channel itself must refuse, naming it.
    no_out = local_sandbox(
        root=str(tmp_path / "a"),
        requires=frozenset({Capability.EXEC, Capability.FILES_IN, Capability.HOST_TOOLS}),
    )
    report = await check_host_tools(no_out)
    assert report.passed == ["run_refused_without_capability"]
    assert report.skipped
    # The channel's capabilities but not host_tools: nothing to hold the backend to.
    no_tools = local_sandbox(
        root=str(tmp_path / "b"),
        requires=frozenset({Capability.EXEC, Capability.FILES_IN, Capability.FILES_OUT}),
    )
    report = await check_host_tools(no_tools)
    assert report.passed == [] and report.failures == [] and report.skipped
