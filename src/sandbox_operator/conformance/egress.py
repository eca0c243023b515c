"""The ``egress`` conformance suite: a sandbox's network reach, measured from inside it.

The suite runs :mod:`sandbox_operator.egress.probe` (``python3`` in the image, ``exec`` in the
spec) and holds the sandbox to the mode its spec asks (``spec.egress``):

- ``closed``: every ``reachable`` target (hosts the caller has shown reachable from an
  unrestricted vantage point in the same network) is blocked, and each attempt ends within the
  deadline with a named outcome (refused, unreachable, timeout, no name) instead of hanging;
- ``allowlist``: each ``allowed`` target answers through the proxy over CONNECT and over plain
  HTTP; each ``denied`` target is refused by the proxy with 403; and the ``reachable`` targets,
  tried directly (ignoring the proxy variables), are blocked;
- ``unrestricted``: every ``reachable`` target answers.

The caller supplies the targets because only it knows which hosts exist in its network (the
tests start their own "outside" servers; nothing here reaches the internet by itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sandbox_operator.client.sandbox import Sandbox
from sandbox_operator.conformance._probe import ConformanceReport, Probes, asserting, check
from sandbox_operator.contract import Capability, Egress
from sandbox_operator.egress.probe import (
    Expectation,
    ProbeResult,
    ProbeTarget,
    Via,
    expect_answered,
    expect_blocked,
    expect_proxy_refused,
    judge,
    run_probe,
)

#: Seconds an attempt may take beyond its deadline before it counts as hanging.
SLACK = 2.0


def _hold(expectations: Sequence[Expectation]) -> None:
    """Every expectation holds; the failure names the ones that did not."""
    check(all(e.ok for e in expectations), judge([e for e in expectations if not e.ok]))


async def check_egress(
    sandbox: Sandbox,
    *,
    reachable: Sequence[ProbeTarget],
    allowed: Sequence[ProbeTarget] = (),
    denied: Sequence[ProbeTarget] = (),
    proxy: str = "",
    body_contains: str = "",
    deadline: float = 3.0,
) -> ConformanceReport:
    """Run the egress probes the sandbox's mode calls for; see the module docstring. ``proxy``
    ("host:port") overrides the proxy variables in the sandbox's environment; ``body_contains``
    is what an answering target's body must contain."""
    probes = Probes("egress")
    if Capability.EXEC not in sandbox.required:
        probes.skip("all (the egress probe runs through exec)")
        return probes.done()
    mode = Egress(sandbox.spec.egress)
    within = deadline + SLACK

    async def execute(argv: Sequence[str]) -> str:
        res = await sandbox.exec(list(argv), cwd="/", timeout=deadline * 4 + 30)
        return res.stdout_text

    async def probe(targets: Sequence[ProbeTarget]) -> list[ProbeResult]:
        return await run_probe(execute, targets, timeout=deadline)

    def direct(targets: Sequence[ProbeTarget]) -> list[ProbeTarget]:
        return [replace(t, via=Via.DIRECT, proxy="") for t in targets]

    def through(targets: Sequence[ProbeTarget], via: Via) -> list[ProbeTarget]:
        return [replace(t, name=f"{t.name}/{via.value}", via=via, proxy=proxy) for t in targets]

    if mode is Egress.CLOSED:

        async def closed_reaches_nothing() -> None:
            check(bool(reachable), "no reachable targets given: nothing to prove")
            results = await probe(direct(reachable))
            _hold([expect_blocked(r, within=within) for r in results])

        async def closed_refuses_the_proxy_route_too() -> None:
            # Traffic through a proxy, if one was named, is blocked as well.
            if not proxy:
                return
            results = await probe(through(reachable[:1], Via.CONNECT))
            _hold([expect_blocked(r, within=within) for r in results])

        await probes.run_all(closed_reaches_nothing, closed_refuses_the_proxy_route_too)

    elif mode is Egress.ALLOWLIST:

        async def allowed_answers_over_connect() -> None:
            check(bool(allowed), "no allowed targets given")
            results = await probe(through(allowed, Via.CONNECT))
            _hold([expect_answered(r, body_contains=body_contains) for r in results])

        async def allowed_answers_over_http() -> None:
            check(bool(allowed), "no allowed targets given")
            results = await probe(through(allowed, Via.HTTP))
            _hold([expect_answered(r, body_contains=body_contains) for r in results])

        async def denied_refused_with_403() -> None:
            check(bool(denied), "no denied targets given")
            results = await probe(through(denied, Via.CONNECT) + through(denied, Via.HTTP))
            _hold([expect_proxy_refused(r, status=403) for r in results])

        async def direct_route_blocked() -> None:
            targets = direct(reachable)
            check(bool(targets), "no reachable targets given to try directly")
            results = await probe(targets)
            _hold([expect_blocked(r, within=within) for r in results])

        await probes.run_all(
            allowed_answers_over_connect,
            allowed_answers_over_http,
            denied_refused_with_403,
            direct_route_blocked,
        )

    else:

        async def unrestricted_reaches() -> None:
            check(bool(reachable), "no reachable targets given: nothing to prove")
            results = await probe(direct(reachable))
            _hold([expect_answered(r, body_contains=body_contains) for r in results])

        await probes.run_all(unrestricted_reaches)

    return probes.done()


assert_egress_conformance = asserting(check_egress)
