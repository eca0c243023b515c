"""A closed sandbox's name lookups fail at once, every time, under runc and under gVisor.

Why this test exists: with the node's resolver, a closed sandbox's queries are REJECTed by its
deny-all NetworkPolicy with ICMP errors that the node rate-limits to about one a second, so back
to back lookups took 0.1, 5.0, 0.003, 5.0 s: every other one waited out the resolver's timeout.
The operator now gives such pods a resolver configuration that is refused inside the pod
(``dns_settings`` in backends/runtimeclass.py, docs/egress.md "Name lookups").

Ten lookups of distinct names (no cache can answer) are made one after the other by glibc's
``getaddrinfo`` in a sandbox made by the real operator, each timed inside the pod, so no exec
round trip is in the figures.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from tests.fixtures.egress_probe import backend
from tests.fixtures.node import exec_in
from tests.fixtures.operator import PYTHON

# exclusive: asserts lookups fail at once: timing under load (run alone, after the concurrent part).
pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]

LOOKUPS = 10
WITHIN = 1.0  # seconds, per lookup

#: Runs in the sandbox: LOOKUPS back-to-back lookups, each timed, one JSON line out.
SCRIPT = f"""
import json, socket, time
results = []
for i in range({LOOKUPS}):
    name = f"lookup-{{i}}.closed-dns.test"
    started = time.monotonic()
    try:
        socket.getaddrinfo(name, 443, proto=socket.IPPROTO_TCP)
        outcome = "resolved"
    except socket.gaierror as exc:
        outcome = f"gaierror {{exc.errno}}"
    except OSError as exc:
        outcome = f"oserror {{exc.errno}}"
    results.append([name, round(time.monotonic() - started, 4), outcome])
print(json.dumps(results))
"""


@pytest.mark.parametrize("runtime_class", ["runc", "gvisor"])
def test_closed_sandbox_lookups_fail_within_a_second_each(
    kit, start_operator, core_v1: client.CoreV1Api, runtime_class: str
) -> None:
    start_operator(backend(runtime_class))
    kit.scope()
    kit.sandbox("closed", image=PYTHON, requires=["exec"])
    obj = kit.wait_condition("closed", reasons=("Ready",), status="True", timeout=150)
    assert obj["spec"].get("egress", "closed") == "closed"
    pod = obj["status"]["servedBy"]["name"]

    out = exec_in(core_v1, kit.ns, pod, "python3", "-c", SCRIPT)
    results = json.loads(out.strip().splitlines()[-1])
    resolv = exec_in(core_v1, kit.ns, pod, "cat", "/etc/resolv.conf")
    report = "\n".join(f"  {name}: {seconds:.3f} s {outcome}" for name, seconds, outcome in results)
    print(f"\n{runtime_class}, /etc/resolv.conf: {resolv.strip()!r}\n{report}")

    assert len(results) == LOOKUPS, out
    assert all(outcome != "resolved" for _, _, outcome in results), report
    slow = [(name, seconds) for name, seconds, _ in results if seconds >= WITHIN]
    assert not slow, f"lookups that took {WITHIN} s or more:\n{report}"
