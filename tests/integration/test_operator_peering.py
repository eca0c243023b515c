"""Peering and restarts: a container restarted after SIGKILL resumes at once.

With kopf peering on (the chart's default), each replica keeps a record in the peering object.
A replica SIGKILLed leaves its record behind until the record's lifetime runs out. A container
restart keeps the pod, so the restarted process has the same pod name, and so the same derived
priority, as its dead predecessor. If its peering identity were per process, it would find a
"peer" with its own priority and pause itself until that record expired (up to 60 s). The
identity is the pod's, so the restarted process recognises the record as its own.
"""

from __future__ import annotations

import time

import pytest

from tests.fixtures.faults import runc_config
from tests.fixtures.nodeless import off_node, serve
from tests.fixtures.operator import REPO

# exclusive: peering and SIGKILL timings (run alone, after the concurrent part).
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.exclusive]

PEERING = "sandbox-operator"
#: create→Ready of a Sandbox (its pod on no node, reported Ready by the test as a kubelet would:
#: tests/fixtures/nodeless.py) is about a second; a restarted operator that paused itself on its
#: dead predecessor waits up to the peer lifetime (60 s).
READY_WITHIN = 20.0


def runc_only():
    return off_node(runc_config(resyncSeconds=30))


def _peering_object(kit, kubectl) -> None:
    crd = kubectl("get", "crd", "kopfpeerings.kopf.dev", check=False)
    if crd.returncode != 0:
        kubectl("apply", "-f", str(REPO / "examples/kopf-peering.yaml"), check=False)
        kubectl("wait", "--for=condition=Established", "crd/kopfpeerings.kopf.dev")
    kubectl(
        "apply",
        "-n",
        kit.ns,
        "-f",
        "-",
        input=f"apiVersion: kopf.dev/v1\nkind: KopfPeering\nmetadata:\n  name: {PEERING}\n",
    )


def _peers(kit) -> dict:
    obj = kit.custom.get_namespaced_custom_object("kopf.dev", "v1", kit.ns, "kopfpeerings", PEERING)
    return dict(obj.get("status") or {})


def _create_to_ready(kit, name: str, timeout: float = 90) -> float:
    started = time.monotonic()
    kit.sandbox(name)
    serve(kit, name, timeout=timeout)
    return time.monotonic() - started


def test_a_container_restarted_after_sigkill_resumes_at_once(
    kit, start_operator, kubectl, monkeypatch
):
    _peering_object(kit, kubectl)
    # What the chart's Deployment gives the container (downward API); a container restart keeps
    # the pod, so the restarted process sees the same values.
    monkeypatch.setenv("POD_NAME", f"sandbox-operator-{kit.ns[-12:]}-7d4b9c-x2x4q")
    monkeypatch.setenv("POD_NAMESPACE", kit.ns)
    op = start_operator(runc_only(), args=("--peering", PEERING))
    kit.scope()
    first = _create_to_ready(kit, "before")
    assert len(_peers(kit)) == 1, _peers(kit)

    op.kill()  # no clean exit: its peering record stays behind, alive for its lifetime
    assert len(_peers(kit)) == 1, "the SIGKILLed operator's record should still be there"
    log_offset = len(op.log_path.read_bytes())
    op.restart()  # new ports, same environment: as the kubelet restarts the container
    after = _create_to_ready(kit, "after")
    print(f"\ncreate→Ready: {first:.1f}s before the SIGKILL, {after:.1f}s after the restart")
    restarted_log = op.log_path.read_bytes()[log_offset:].decode(errors="replace")
    assert "Possibly conflicting operators" not in restarted_log, restarted_log[-4000:]
    assert "Pausing" not in restarted_log, restarted_log[-4000:]
    assert after < READY_WITHIN, f"create→Ready took {after:.1f}s after the restart"
    # One record: the restarted process took over its predecessor's.
    assert len(_peers(kit)) == 1, _peers(kit)
