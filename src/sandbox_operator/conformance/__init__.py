"""Reusable conformance suites over a live ``Sandbox`` handle, for every backend.

Each suite names its probes, runs all of them, counts a wrong exception type as a failure and
reports every failure together. See :mod:`sandbox_operator.conformance.suites`.
"""

from sandbox_operator.conformance._probe import (
    ConformanceError,
    ConformanceReport,
    ProbeFailure,
)
from sandbox_operator.conformance.egress import assert_egress_conformance, check_egress
from sandbox_operator.conformance.host_tools import (
    assert_host_tools_conformance,
    check_host_tools,
)
from sandbox_operator.conformance.suites import (
    assert_call_scope_conformance,
    assert_exec_conformance,
    assert_files_delete_conformance,
    assert_files_in_conformance,
    assert_files_out_conformance,
    assert_reclaim_conformance,
    assert_sandbox_conformance,
    check_call_scope,
    check_exec,
    check_files_delete,
    check_files_in,
    check_files_out,
    check_reclaim,
    check_sandbox,
)

__all__ = [
    "ConformanceError",
    "ConformanceReport",
    "ProbeFailure",
    "assert_call_scope_conformance",
    "assert_egress_conformance",
    "assert_exec_conformance",
    "assert_files_delete_conformance",
    "assert_files_in_conformance",
    "assert_files_out_conformance",
    "assert_host_tools_conformance",
    "assert_reclaim_conformance",
    "assert_sandbox_conformance",
    "check_call_scope",
    "check_egress",
    "check_exec",
    "check_files_delete",
    "check_files_in",
    "check_files_out",
    "check_host_tools",
    "check_reclaim",
    "check_sandbox",
]
