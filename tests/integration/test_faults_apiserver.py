"""Fault test: the local cluster's kube-apiserver killed and restarted in the middle of a burst of
creates (`hack/cluster.py restart kube-apiserver --kill`: a crash, requests in flight cut; a
graceful SIGTERM keeps the old process around for ~9 s on this machine, a longer outage). The
operator runs on through the outage (its watches break and resume), the creates are retried as
an agent's client would, and every Sandbox converges: Ready, exactly one pod ever, no orphan, no
flap. On kwok's fake nodes (the control plane is what is tested).

The restart disturbs everything else that uses the cluster for the outage (a few seconds): the
test runs only against the project's own local cluster, once per run.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.fixtures.cluster import CLUSTER_PY
from tests.fixtures.faults import (
    PEERING,
    Recorder,
    assert_one_pod_each_and_no_flap,
    census,
    create_retrying,
    delete_scopes_until_empty,
    ensure_peering,
    kwok_config,
    sandbox_body,
    spread,
    terminal,
    wait_census,
)

# exclusive: restarts the API server under every test (run alone, after the concurrent part).
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.exclusive]

SCOPES = 3
CREATES = 60
RESTART_AT = 20  # the create after which the API server is restarted
PACE = 0.25


@pytest.fixture
def say(request: pytest.FixtureRequest) -> Callable[[str], None]:
    return terminal(request.config)


def test_api_server_restarted_mid_burst_every_sandbox_converges(
    kit, start_operator, api_client, kubectl, kwok_nodes, cluster_is_local, say
):
    if not cluster_is_local:
        pytest.skip("restarts the local cluster's API server (hack/cluster.py restart)")
    assert kwok_nodes, "no kwok fake node Ready"
    ensure_peering(kubectl, kit.ns)
    op = start_operator(kwok_config(), args=("--peering", PEERING))
    rec = Recorder(api_client, kit.ns).start()
    restart: dict[str, Any] = {}

    def restart_api_server() -> None:
        restart["at"] = time.monotonic()
        proc = subprocess.run(
            [sys.executable, str(CLUSTER_PY), "restart", "kube-apiserver", "--kill"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        restart["back"] = time.monotonic()
        restart["rc"] = proc.returncode
        restart["out"] = proc.stdout + proc.stderr

    names = [f"a{i:02d}" for i in range(CREATES)]
    failed_attempts = 0
    restarter = threading.Thread(target=restart_api_server, daemon=True)
    try:
        for s in range(SCOPES):
            kit.scope(f"scope-{s}", thread_id=f"thread-{s}")
        t0 = time.monotonic()
        for i, name in enumerate(names):
            if i == RESTART_AT:
                restarter.start()
            failures, _ = create_retrying(
                kit, "sandboxes", sandbox_body(kit, name, f"scope-{i % SCOPES}"), timeout=180
            )
            failed_attempts += failures
            time.sleep(max(0.0, t0 + (i + 1) * PACE - time.monotonic()))
        last_create = time.monotonic()
        restarter.join(300)
        say(f"[faults apiserver] {str(restart.get('out', '')).strip().splitlines()[-1:]}")
        assert restart.get("rc") == 0, f"hack/cluster.py restart kube-apiserver:\n{restart}"
        final, _ = wait_census(
            kit,
            lambda c: c.sandboxes == CREATES and c.converged,
            150,
            f"{CREATES} Sandboxes Ready with one pod each after the API server restart",
        )
        converged = time.monotonic()
        time.sleep(3)  # and it stays so
        final = census(kit)
        metrics = op.metrics()
        # Deleting the scopes leaves nothing.
        left, purge = delete_scopes_until_empty(kit, (f"scope-{s}" for s in range(SCOPES)))
    finally:
        rec.stop()
        if restarter.is_alive() or restart.get("rc") not in (None, 0):
            # The restart did not bring the API server back: bring the cluster up again, so
            # this test's failure is not every later test's too.
            restarter.join(timeout=300)
            subprocess.run([sys.executable, str(CLUSTER_PY), "up"], timeout=600, check=False)

    assert restart.get("rc") == 0, f"hack/cluster.py restart failed:\n{restart.get('out')}"
    out = str(restart.get("out", ""))
    m = re.search(r"down for ([\d.]+)s", out)
    back = restart["back"]
    watch_restarts = sum(
        v for (name, _), v in metrics.items() if name == "sandbox_operator_watch_restarts_total"
    )
    duplicates = rec.duplicates()
    latencies = rec.create_to_ready(names)
    say(
        f"[faults apiserver] creates {CREATES} (API server restarted after create {RESTART_AT}"
        f" at +{restart['at'] - t0:.1f}s; down {m.group(1) if m else '?'}s), "
        f"create attempts refused or lost {failed_attempts}, pods ever created {len(rec.pods)}, "
        f"duplicates {sum(duplicates.values())}, flaps {len(rec.flaps)}, orphan pods "
        f"{len(final.orphan_pods)}, orphan NetworkPolicies {len(final.orphan_policies)}, "
        f"stuck {len(final.not_ready)}; converged {converged - back:.1f}s after the API server "
        f"was back, {converged - last_create:.1f}s after the last create; create->Ready "
        f"p50/p90/max {spread(latencies)}s; "
        f"operator watch restarts {watch_restarts:.0f}; recorder watch reconnects/relists "
        f"{rec.reconnects}/{rec.relists}; purge: {left} left after {purge:.1f}s"
    )
    assert op.running, f"the operator exited during the outage:\n{op.log()}"
    assert final.converged and final.sandboxes == CREATES, final.brief()
    assert_one_pod_each_and_no_flap(rec, names)
    assert not any(left.values()), f"deleting the scopes left {left} after {purge:.0f}s"
