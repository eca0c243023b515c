"""Translations between maf-sandbox's vocabulary and this operator's contract, one direction each:
the operator's published declarations -> maf's :class:`~maf_sandbox.BackendDeclarations`, and a
maf :class:`~maf_sandbox.SandboxSpec` -> the contract's ``SandboxSpec``.

Both are lossless or refuse: a declaration says only what the operator enforces (what the
wrapper cannot serve, e.g. ``SNAPSHOT``, is left out), and a spec field the operator cannot hold
to is refused with maf's own refusal type, never dropped silently. ``labels`` are carried
verbatim (the contract stores them and hands them to the client's observers; nothing judges
them), and so is ``outputs_named_at_call_time`` (the contract's ``outputsNamedAtCallTime``;
maf's own ``collect_outputs`` still does the gating on its side). One exception, named here
because it is deliberate: the router-side fields (``min_cleanup``, ``exclusive_admission``,
``confined_to_guest_call_path``, ``program``, ``execution_contract``, ``host_tools``'s
surface), which maf's router enforces itself before and after acquire.
"""

from __future__ import annotations

import maf_sandbox as maf

from sandbox_operator import contract
from sandbox_operator.contract.egressrules import EgressRule
from sandbox_operator.contract.published import PublishedBackend
from sandbox_operator.maf._grants import grant_key

#: Capabilities the wrapper serves whenever the operator declares them.
_SERVED = frozenset(
    {
        contract.Capability.EXEC,
        contract.Capability.RUN_CODE,
        contract.Capability.HOST_TOOLS,
        contract.Capability.FILES_IN,
        contract.Capability.FILES_OUT,
        contract.Capability.FILES_LIST,
        contract.Capability.FILES_DELETE,
    }
)
#: Left out of maf's declarations even when the operator declares them, and why.
WITHHELD: dict[contract.Capability, str] = {
    contract.Capability.SNAPSHOT: (
        "declared from the operator's word, not the backend's configuration: SNAPSHOT where the "
        "published backend resets (spec.resets), never otherwise"
    ),
    contract.Capability.ATTACHED_IDENTITY: "maf's attached identity needs a policy we do not hold",
}

#: Backend types whose data plane removes at the guest's own authority and refuses a link on the
#: way right where it acts (the pod data plane: a no-follow walk by the guest's own ``sh``, over
#: ``pods/exec``), so the wrapper's ``reclaim`` meets maf's RECLAIM rule. Any other type is
#: withheld RECLAIM, an unknown one included; :data:`RECLAIM_WITHHELD` says why for the known.
RECLAIMS: frozenset[str] = frozenset({"runtimeClass"})
#: Backend types whose storage base is a volume mounted at the work directory when the sandbox's
#: compute is made (a runtime-class pod's ``workDir``): on an instance nothing has used, it is a
#: real directory by construction, and the acquire's storage-base check (one exec) is skipped.
#: Anything else (an ``acas`` sandbox's directories are the service's image) is always checked.
BASE_MOUNTED: frozenset[str] = frozenset({"runtimeClass"})
#: Why a known backend type is withheld RECLAIM even when it declares ``FILES_DELETE``.
RECLAIM_WITHHELD: dict[str, str] = {
    "acas": (
        "ACA's file API acts at the service's authority and has no no-follow: the data plane's "
        "stat walk comes before the delete, so a link swapped in on the way is followed"
    ),
}

#: The media type a declared output without one is collected as (ours requires one).
DEFAULT_MEDIA_TYPE = "application/octet-stream"


def _limits(limits: contract.TransferLimits) -> maf.TransferLimits:
    return maf.TransferLimits(
        max_bytes_per_file=limits.max_bytes_per_file,
        max_total_bytes=limits.max_total_bytes,
        max_files=limits.max_files,
    )


def declarations(
    backend: PublishedBackend, attached: maf.AttachedIdentity = maf.NO_ATTACHED_IDENTITY
) -> maf.BackendDeclarations:
    """maf's declarations of one published operator backend.

    ``RECLAIM`` is declared with ``FILES_DELETE`` only for a backend type in :data:`RECLAIMS`:
    the wrapper reclaims with the same data-plane removal, and only the pod data plane removes at
    the guest's own authority with the links on the way refused where it acts (an ``acas``
    backend's file API cannot refuse them: :data:`RECLAIM_WITHHELD`). ``HOST_TOOLS`` brings
    maf's exec program channel, so maf's host tools run over our exec unchanged. ``SNAPSHOT`` is
    declared where the operator publishes that the backend resets (``resets``: a reset replaces
    the pod by a never-used one, which is maf's ``Sandbox.reset``). Egress is declared per mode;
    ``EGRESS_METHODS`` and ``EGRESS_PATHS`` only where the backend's proxy judges rules on plain
    http and inside HTTPS both (``egressRules`` and ``egressRulesHttps``: a maf rule names no
    scheme), with :data:`EGRESS_METHOD_TOKENS`. ``observes_egress`` is True where the backend
    serves ``allowlist``: its egress proxy records every decision for an allowlist sandbox, and
    the backend reports them (``OperatorBackend.observe_egress``); a ``closed`` sandbox's
    attempts are dropped by its NetworkPolicy, which records nothing, so no window of it is
    reported. ``ATTACHED_IDENTITY`` with ``attached`` only where the backend's proxy judges rules
    inside HTTPS and attaches credentials (``egressCredentials``), and the host gave a gateway
    (``_grants.attached_identity``)."""
    published = backend.declarations
    caps = {maf.Capability(c.value) for c in published.capabilities if c in _SERVED}
    if maf.Capability.FILES_DELETE in caps and backend.type in RECLAIMS:
        caps.add(maf.Capability.RECLAIM)
    if backend.resets:
        caps.add(maf.Capability.SNAPSHOT)
    rules = published.egress_rules and published.egress_rules_https
    if rules:
        caps |= {maf.Capability.EGRESS_METHODS, maf.Capability.EGRESS_PATHS}
    if not (rules and published.egress_credentials):
        attached = maf.NO_ATTACHED_IDENTITY
    if attached != maf.NO_ATTACHED_IDENTITY:
        caps.add(maf.Capability.ATTACHED_IDENTITY)
    host_tools = maf.Capability.HOST_TOOLS in caps
    return maf.BackendDeclarations(
        capabilities=frozenset(caps),
        limits=maf.SandboxLimits(
            files_in=_limits(published.limits), files_out=_limits(published.limits)
        ),
        egress_modes=frozenset(maf.Egress(e.value) for e in published.egress_modes),
        os_families=frozenset(maf.OsFamily(f.value) for f in published.os_families),
        isolation_scopes=frozenset(maf.IsolationScope(s.value) for s in published.isolation_scopes),
        observes_egress=contract.Egress.ALLOWLIST in published.egress_modes,
        egress_method_tokens=EGRESS_METHOD_TOKENS if rules else frozenset(),
        program_channels=(maf.ExecProgramChannel(),) if host_tools else (),
        attached_identity=attached,
    )


#: The verbs the operator's proxy judges a maf rule on: maf's named methods but CONNECT (which
#: opens a tunnel through the proxy and is refused in a rule); a finite set, so maf's router
#: refuses a rule naming another token rather than the operator's admission.
EGRESS_METHOD_TOKENS: frozenset[str] = frozenset(
    m.value for m in maf.HttpMethod if m is not maf.HttpMethod.CONNECT
)
#: The capabilities a spec asks for by its rules, which become egressRules (and the backend's
#: egressRules declarations), not ``requires``.
_RULE_CAPABILITIES = frozenset(
    {maf.Capability.EGRESS_METHODS, maf.Capability.EGRESS_PATHS, maf.Capability.ATTACHED_IDENTITY}
)


def _egress(
    entries: tuple[str | maf.EgressRule, ...], grant_secret: str | None = None
) -> tuple[tuple[str, ...], tuple[EgressRule, ...]]:
    """maf's allowlist as ``egressAllow`` hosts and ``egressRules``: a rule naming methods or
    paths holds for any scheme in maf, so it becomes one judged on http and https. A rule with an
    ``authority`` becomes an https rule whose credential is its audience's key in
    ``grant_secret`` (the Secret the backend installs the gateway's grant in: ``_grants``)."""
    hosts: list[str] = []
    rules: list[EgressRule] = []
    for entry in entries:
        if isinstance(entry, str):
            hosts.append(entry)
            continue
        if entry.authority is not None:
            if grant_secret is None:
                raise maf.SandboxAttachedIdentityNotPermitted(
                    f"egress rule {entry.host!r} attaches an authority; this backend attaches none"
                )
            rules.append(_authority_rule(entry, grant_secret))
            continue
        if entry.methods is None and entry.paths is None:
            hosts.append(entry.host)
            continue
        rules.append(
            EgressRule.model_validate(
                {
                    "host": entry.host,
                    "schemes": ["http", "https"],
                    "methods": None if entry.methods is None else [str(m) for m in entry.methods],
                    "paths": None if entry.paths is None else list(entry.paths),
                }
            )
        )
    return tuple(hosts), tuple(rules)


def _authority_rule(entry: maf.EgressRule, grant_secret: str) -> EgressRule:
    assert entry.authority is not None
    return EgressRule.model_validate(
        {
            "host": entry.host,
            "schemes": ["https"],
            "methods": None if entry.methods is None else [str(m) for m in entry.methods],
            "paths": None if entry.paths is None else list(entry.paths),
            "credential": {"secretName": grant_secret, "key": grant_key(entry.authority)},
        }
    )


def _requires(spec: maf.SandboxSpec) -> frozenset[contract.Capability]:
    known = {c.value for c in contract.Capability}
    required = spec.required_capabilities - _RULE_CAPABILITIES
    unknown = sorted(c.value for c in required if c.value not in known)
    if unknown:
        raise maf.SandboxCapabilityNotSupported(
            f"the operator has no capability {', '.join(unknown)}"
        )
    return frozenset(contract.Capability(c.value) for c in required)


def _output(output: maf.DeclaredOutput) -> contract.DeclaredOutput:
    return contract.DeclaredOutput(
        path=output.path,
        media_type=output.media_type or DEFAULT_MEDIA_TYPE,
        required=output.required,
        name=output.name,
        disposition=contract.Disposition(output.disposition.value),
    )


def operator_spec(
    spec: maf.SandboxSpec,
    *,
    floor: maf.Isolation | None = None,
    default_image: str | None = None,
    grant_secret: str | None = None,
) -> contract.SandboxSpec:
    """The contract spec a maf spec asks for. ``floor`` raises ``min_isolation`` (never lowers
    it); ``image_id`` (a pinned reference) wins over ``image``, and ``default_image`` serves a
    spec naming neither. Raises maf's refusal for what the operator cannot enforce, and
    ``ValueError`` for a spec the contract rejects."""
    image = spec.image_id or spec.image or default_image
    if not image:
        raise ValueError(f"kind {spec.kind!r} names no image and the backend has no default")
    hosts, rules = _egress(spec.egress_allow, grant_secret)
    min_isolation = spec.min_isolation
    if floor is not None and (min_isolation is None or _rank(floor) > _rank(min_isolation)):
        min_isolation = floor
    fields: dict[str, object] = {
        "kind": spec.kind,
        "image": image,
        "requires": _requires(spec),
        "isolation_scope": contract.IsolationScope(spec.isolation_scope.value),
        "egress": contract.Egress(spec.egress.value),
        "egress_allow": hosts,
        "egress_rules": rules,
        "files_in": _contract_limits(spec.files_in),
        "files_out": _contract_limits(spec.files_out),
        "declared_outputs": tuple(_output(o) for o in spec.declared_outputs),
        "labels": dict(spec.labels),
        "outputs_named_at_call_time": spec.outputs_named_at_call_time,
    }
    if spec.work_dir is not None:
        fields["work_dir"] = spec.work_dir
    if min_isolation is not None:
        fields["min_isolation"] = contract.Isolation(min_isolation.value)
    if spec.requires_os_family is not None:
        fields["requires_os_family"] = contract.OsFamily(spec.requires_os_family.value)
    return contract.SandboxSpec.model_validate(fields)


def _contract_limits(limits: maf.TransferLimits) -> contract.TransferLimits:
    return contract.TransferLimits(
        max_bytes_per_file=limits.max_bytes_per_file,
        max_total_bytes=limits.max_total_bytes,
        max_files=limits.max_files,
    )


def _rank(level: maf.Isolation) -> int:
    return list(maf.Isolation).index(level)
