"""maf-sandbox's own egress suites through ``maf_sandbox.SandboxRouter`` over
:class:`~sandbox_operator.maf.OperatorBackend` (#38 item 6), on runc and gVisor, with the egress
proxy the operator runs terminating TLS for a host with method and path rules:

- ``assert_egress_conformance`` for an allowlist whose one HTTPS host has a GET-only rule below
  ``/ok/`` (allowed: a GET there; denied: a host off the allowlist, which answers 2xx when
  reached), and again for a plain allowlisted host (no rule, no interception);
- ``assert_egress_methods_conformance``: that GET-only rule lets GET through and refuses POST,
  against an all-methods control sandbox that reaches the same URL with POST;
- the path rule: a GET outside ``/ok/`` (also spelled with percent-encoded dots) is refused, each
  refusal carrying the proxy's reason.

Every request is the guest's own ``curl`` (maf's harness; the python image carries it,
hack/images.sh), trusting the proxy's CA through ``CURL_CA_BUNDLE`` and finding the proxy through
``https_proxy``/``http_proxy``, as the pod was given them. The upstreams are on this machine
(tests/fixtures/egress_upstream.py says why not in a pod). One operator per runtime serves the
module (``served`` below overrides the tier's).
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
import uuid
from collections.abc import Iterator

import maf_sandbox as maf
import pytest
from kubernetes import client
from maf_sandbox import conformance
from tests.fixtures.egress_probe import node_address
from tests.fixtures.egress_upstream import (
    DENIED,
    PLAIN,
    RULED,
    Upstreams,
    intercepting_config,
    upstreams,
)
from tests.fixtures.maf_cluster import RUNTIMES, Served, serving

from sandbox_operator.maf import OperatorBackend

pytestmark = [pytest.mark.e2e]

#: The guest's working directory for every request (the spec's work dir, maf's default).
BASE = "/maf-sandbox/work"

#: In the guest: one curl per argument pair (METHOD URL); one line each, the status and the
#: proxy's X-Egress-Reason (empty where there is none).
REASONS = r"""
while [ $# -gt 0 ]; do
  head=$(curl -s -o /dev/null -D - --max-time 20 -X "$1" "$2" | tr -d '\r')
  status=$(printf '%s\n' "$head" | sed -n 's/^HTTP[^ ]* \([0-9]*\).*/\1/p' | tail -n 1)
  reason=$(printf '%s\n' "$head" | sed -n 's/^[Xx]-[Ee]gress-[Rr]eason: *//p' | tail -n 1)
  echo "$status $reason"
  shift 2
done
"""


@pytest.fixture(scope="module")
def up(core_v1: client.CoreV1Api, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstreams]:
    """Both upstreams; the plain one checked to answer 2xx from here (bypassing the proxy): maf's
    requirement of a denied URL, so its deny probe passing means the proxy refused it."""
    with upstreams(node_address(core_v1), tmp_path_factory.mktemp("upstreams")) as servers:
        plain = f"http://{servers.outside.address}:{servers.outside.port}/"
        with urllib.request.urlopen(plain, timeout=10) as answer:
            assert answer.status == 200
        yield servers


@pytest.fixture(scope="module", params=["gvisor", "runc"])
def served(
    request: pytest.FixtureRequest,
    kubeconfig: str,
    crds: None,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
    operator_image: tuple[str, str],
    up: Upstreams,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    """A namespace served by an operator whose only backend is ``runc`` or ``gvisor``, with the
    managed proxy intercepting TLS (the tier's ``served`` declares egress ``closed`` only)."""
    runtime: str = request.param
    image = ":".join(operator_image)
    with serving(
        runtime,
        lambda _ns: intercepting_config(runtime, image, up),
        kubeconfig=kubeconfig,
        core_v1=core_v1,
        custom_objects=custom_objects,
        tmp=tmp_path_factory.mktemp(f"maf-egress-{runtime}"),
        isolation=RUNTIMES[runtime],
    ) as served:
        yield served


def allowlist(kind: str, *allow: str | maf.EgressRule) -> maf.SandboxSpec:
    return maf.SandboxSpec(
        kind=kind,
        requires=frozenset({maf.Capability.EXEC}),
        egress=maf.Egress.ALLOWLIST,
        egress_allow=allow,
    )


async def reasons(sandbox: maf.Sandbox, *requests: tuple[str, str]) -> list[str]:
    """``"<status> <X-Egress-Reason>"`` for each (method, url) the guest's curl sends."""
    argv = [item for pair in requests for item in pair]
    result = await sandbox.exec(
        ["sh", "-c", REASONS, "reasons", *argv], working_directory=BASE, timeout=120
    )
    assert result.exit_code == 0, result
    return [line.strip() for line in result.stdout.splitlines()]


async def test_maf_egress_suites_with_method_and_path_rules(
    served: Served,
    backend: OperatorBackend,
    router: maf.SandboxRouter,
    key: maf.SandboxKey,
    up: Upstreams,
) -> None:
    declared = backend.declarations
    caps = declared.capabilities
    assert {maf.Capability.EGRESS_METHODS, maf.Capability.EGRESS_PATHS} <= caps, declared
    assert maf.Egress.ALLOWLIST in declared.egress_modes, declared
    denied_url = f"http://{DENIED}:{up.outside.port}/"  # the plain upstream (`up` checked it)

    ruled = f"https://{RULED}:{up.tls_port}"
    try:
        scoped = await router.acquire(
            key,
            allowlist("scoped", maf.EgressRule(RULED, methods=("GET",), paths=("/ok/*",)), PLAIN),
        )
        control = await router.acquire(
            key, allowlist("control", maf.EgressRule(RULED, paths=("/*",)))
        )
        subject = conformance.PosixGuestSubject(scoped, BASE, caps, exec_timeout=60)
        # The HTTPS host with rules (intercepted), then the plain host (no interception).
        await conformance.assert_egress_conformance(
            subject, allowed_url=f"{ruled}/ok/x", denied_url=denied_url
        )
        await conformance.assert_egress_conformance(
            subject, allowed_url=f"http://{PLAIN}:{up.outside.port}/", denied_url=denied_url
        )
        await conformance.assert_egress_methods_conformance(
            conformance.ExecEgressMethodsSubject(scoped, caps, BASE),
            conformance.ExecEgressMethodsSubject(control, caps, BASE),
            allowed_url=f"{ruled}/ok/x",
        )
        got = await reasons(
            scoped,
            ("GET", f"{ruled}/ok/x"),
            ("POST", f"{ruled}/ok/x"),
            ("GET", f"{ruled}/no"),
            ("GET", f"{ruled}/ok/%2e%2e/no"),
        )
        assert got == ["200", "403 MethodNotAllowed", "403 PathNotAllowed", "403 PathNotAllowed"]
    finally:
        await router.dispose(key)


class EgressRecorder(maf.SandboxObserver):
    """A host's observer keeping the egress events it is given."""

    def __init__(self, wanted: int) -> None:
        self.events: list[maf.EgressObserved] = []
        self.wanted = wanted
        self.enough = asyncio.Event()

    def decisions(self) -> list[maf.EgressDecision]:
        return [d for event in self.events for d in event.decisions]

    def egress_observed(self, event: maf.EgressObserved) -> None:
        self.events.append(event)
        if len(self.decisions()) >= self.wanted:
            self.enough.set()


async def test_the_proxys_decisions_reach_mafs_observer_in_order(
    served: Served, backend: OperatorBackend, up: Upstreams
) -> None:
    """#38 item 4 on the cluster: a router with an observer receives, as ``EgressObserved``,
    every decision the proxy recorded for the Sandbox it served, in the order the guest made
    the requests (one record per connection), and nothing marked truncated."""
    assert backend.declarations.observes_egress
    recorder = EgressRecorder(wanted=4)
    router = maf.SandboxRouter([backend], min_isolation=served.isolation, observer=recorder)
    key = maf.SandboxKey("maf-tier", f"observed-{uuid.uuid4().hex[:8]}", "agent")
    ruled = f"https://{RULED}:{up.tls_port}"
    try:
        sandbox = await router.acquire(
            key, allowlist("observed", maf.EgressRule(RULED, methods=("GET",), paths=("/ok/*",)))
        )
        got = await reasons(
            sandbox,
            ("GET", f"{ruled}/ok/x"),
            ("POST", f"{ruled}/ok/x"),
            ("GET", f"{ruled}/no"),
            ("GET", f"http://{DENIED}:{up.outside.port}/"),
        )
        assert [line.split()[0] for line in got] == ["200", "403", "403", "403"], got
    finally:
        await router.dispose(key)
    expected = [
        maf.EgressDecision("ALLOW", RULED, up.tls_port),
        maf.EgressDecision("DENY", RULED, up.tls_port),
        maf.EgressDecision("DENY", RULED, up.tls_port),
        maf.EgressDecision("DENY", DENIED, up.outside.port),
    ]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(recorder.enough.wait(), 30)
    assert recorder.decisions() == expected, recorder.events
    assert {event.key for event in recorder.events} == {key}
    assert {event.backend for event in recorder.events} == {backend.backend_name}
    assert not any(event.truncated for event in recorder.events), recorder.events
