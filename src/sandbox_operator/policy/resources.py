"""Resource policy: the requests and limits a sandbox runs with, and the host's ceilings.

Pure functions over contract models; no Kubernetes. A spec states what it needs (or nothing);
the host policy (``hostPolicy.resources``) fills what the spec leaves out and bounds what it may
ask. Per resource (cpu, memory):

* limit: the spec's; else the host's default limit, raised to the spec's request when that is
  larger (a default never contradicts what the spec states);
* request: the spec's; else the host's default request, capped at the limit.

So requests never exceed limits, and every sandbox has both for both resources. A stated amount
above the host's ceiling is refused with :class:`ResourcesExceedCeiling`, never clamped. A host
that sets no ``maxLimits`` for a resource still has one: the built-in
:data:`~sandbox_operator.contract.quantities.DEFAULT_RESOURCE_CEILING` (8 CPU, 16Gi), raised to the
host's default limit when that is larger (see :func:`limit_ceilings`).
"""

from __future__ import annotations

from sandbox_operator.contract import (
    RESOURCE_NAMES,
    HostPolicy,
    ResourceExcess,
    ResourceList,
    ResourceRequirements,
    ResourcesExceedCeiling,
    SandboxSpec,
    parse_quantity,
)
from sandbox_operator.contract.quantities import DEFAULT_RESOURCE_CEILING


def _larger(a: str, b: str) -> str:
    return b if parse_quantity(b) > parse_quantity(a) else a


def _smaller(a: str, b: str) -> str:
    return b if parse_quantity(b) < parse_quantity(a) else a


def resolve_resources(host: HostPolicy, spec: SandboxSpec) -> ResourceRequirements:
    """The requests and limits ``spec`` runs with under ``host``: every field set.

    What the spec states wins; the host's defaults fill the rest (see the module docstring).
    Idempotent: resolving resolved resources changes nothing. Ceilings are not applied here:
    :func:`check_resources` refuses a larger ask.
    """
    policy = host.resources
    stated = spec.resources
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    for r in RESOURCE_NAMES:
        request: str | None = getattr(stated.requests, r)
        limit: str | None = getattr(stated.limits, r)
        if limit is None:
            limit = getattr(policy.default_limits, r)
            assert limit is not None  # ResourcePolicy completes its defaults
            if request is not None:
                limit = _larger(limit, request)
        if request is None:
            default_request = getattr(policy.default_requests, r)
            assert default_request is not None
            request = _smaller(default_request, limit)
        requests[r] = request
        limits[r] = limit
    return ResourceRequirements(
        requests=ResourceList.model_validate(requests),
        limits=ResourceList.model_validate(limits),
    )


def resolve_spec(host: HostPolicy, spec: SandboxSpec) -> SandboxSpec:
    """``spec`` with its resources resolved under ``host`` (:func:`resolve_resources`).

    This is the spec a backend driver is given (``EnsureRequest.spec``), so the pod runs with the
    host's defaults for whatever the Sandbox left out.
    """
    resolved = resolve_resources(host, spec)
    if resolved == spec.resources:
        return spec
    return spec.model_copy(update={"resources": resolved})


def limit_ceilings(host: HostPolicy) -> tuple[ResourceList, frozenset[str]]:
    """The limit ceilings in force under ``host``, and the resources whose ceiling is built in.

    ``maxLimits`` where the host sets it; otherwise the built-in ceiling, raised to the host's
    default limit when that is larger (a host handing out 32 CPUs by default means sandboxes that
    large, and a spec stating what it would get anyway is not refused).
    """
    policy = host.resources
    ceilings: dict[str, str] = {}
    built_in: set[str] = set()
    for r in RESOURCE_NAMES:
        configured: str | None = getattr(policy.max_limits, r)
        if configured is not None:
            ceilings[r] = configured
            continue
        default_limit = getattr(policy.default_limits, r)
        built: str | None = getattr(DEFAULT_RESOURCE_CEILING, r)
        assert default_limit is not None and built is not None
        ceilings[r] = _larger(built, default_limit)
        built_in.add(r)
    return ResourceList.model_validate(ceilings), frozenset(built_in)


def resource_excesses(host: HostPolicy, spec: SandboxSpec) -> list[ResourceExcess]:
    """Every amount ``spec`` states above the host's ceilings, requests first.

    A request is held to ``maxRequests`` and ``maxLimits`` (it can never exceed its limit), and
    reported against the tighter one it exceeds; a limit to ``maxLimits`` (or, unset, the built-in
    ceiling: :func:`limit_ceilings`). The host's defaults are validated against the ceilings when
    the policy is built (and the built-in ceiling never falls below them), so only stated amounts
    can exceed.
    """
    policy = host.resources
    max_limits, built_in = limit_ceilings(host)
    excesses: list[ResourceExcess] = []
    for part, stated, ceilings in (
        (
            "requests",
            spec.resources.requests,
            (("maxRequests", policy.max_requests), ("maxLimits", max_limits)),
        ),
        ("limits", spec.resources.limits, (("maxLimits", max_limits),)),
    ):
        for r in RESOURCE_NAMES:
            asked: str | None = getattr(stated, r)
            if asked is None:
                continue
            exceeded = [
                (parse_quantity(ceiling), name, ceiling)
                for name, values in ceilings
                if (ceiling := getattr(values, r)) is not None
                and parse_quantity(asked) > parse_quantity(ceiling)
            ]
            if exceeded:
                _, name, ceiling = min(exceeded)
                excesses.append(
                    ResourceExcess(
                        f"{part}.{r}",
                        asked,
                        f"{name}.{r}",
                        ceiling,
                        built_in=name == "maxLimits" and r in built_in,
                    )
                )
    return excesses


def check_resources(host: HostPolicy, spec: SandboxSpec) -> None:
    """Refuse ``spec`` with :class:`ResourcesExceedCeiling` when it states an amount above the
    host's ceilings (``hostPolicy.resources.maxRequests`` / ``maxLimits``, or the built-in
    ceiling where the host sets none).

    Runs before any backend is judged: the ceilings are the host's, whichever backend serves.
    """
    excesses = resource_excesses(host, spec)
    if excesses:
        raise ResourcesExceedCeiling(kind=spec.kind, excesses=excesses)
