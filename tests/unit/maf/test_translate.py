"""Declarations translated from a published document, the backend chosen from it, and maf specs
mapped onto the contract's."""

from __future__ import annotations

from typing import Any

import maf_sandbox as maf
import pytest

from sandbox_operator import contract
from sandbox_operator.client import SandboxClient
from sandbox_operator.contract.published import (
    PUBLISHED_CONFIGMAP,
    PUBLISHED_KEY,
)
from sandbox_operator.maf import (
    RECLAIM_WITHHELD,
    RECLAIMS,
    BackendNotSelected,
    OperatorBackend,
    OperatorSandbox,
    PublishedBackendsMissing,
    declarations,
    operator_spec,
    parse_published,
    select_backend,
)
from tests.fixtures.maf_translate import ACAS, GVISOR, RUNC, published


def test_declarations_say_what_the_operator_enforces() -> None:
    doc = published(RUNC)
    got = declarations(doc.backends[0])
    assert got.capabilities == {
        maf.Capability.EXEC,
        maf.Capability.FILES_IN,
        maf.Capability.FILES_OUT,
        maf.Capability.FILES_DELETE,
        maf.Capability.HOST_TOOLS,
        maf.Capability.RECLAIM,
    }  # no SNAPSHOT: the operator that published this does not say it resets
    limits = maf.TransferLimits(1000, 2000, 3)
    assert got.limits == maf.SandboxLimits(files_in=limits, files_out=limits)
    assert got.egress_modes == {maf.Egress.CLOSED, maf.Egress.ALLOWLIST}
    assert got.os_families == {maf.OsFamily.POSIX}
    assert got.isolation_scopes == {maf.IsolationScope.CONVERSATION, maf.IsolationScope.CALL}
    assert got.observes_egress is True and got.egress_method_tokens == frozenset()
    assert [type(c) for c in got.program_channels] == [maf.ExecProgramChannel]


def test_acas_is_withheld_reclaim_with_files_delete() -> None:
    """ACA's file API cannot refuse a link on the way, so an acas backend declaring
    ``files_delete`` is not declared RECLAIM (a runtime-class one with the same capabilities
    is); nor is a backend of a type the wrapper does not know."""
    got = declarations(published(ACAS).backends[0])
    assert maf.Capability.FILES_DELETE in got.capabilities
    assert maf.Capability.RECLAIM not in got.capabilities
    assert "acas" in RECLAIM_WITHHELD and "acas" not in RECLAIMS
    same_as_runc = {**ACAS, "type": "runtimeClass"}
    assert maf.Capability.RECLAIM in declarations(published(same_as_runc).backends[0]).capabilities
    unknown = {**ACAS, "type": "someday"}
    assert maf.Capability.RECLAIM not in declarations(published(unknown).backends[0]).capabilities


def test_snapshot_is_declared_where_the_operator_publishes_that_it_resets() -> None:
    """SNAPSHOT comes from the operator's word that it resets the backend's Sandboxes (the
    published ``resets``), never from the capabilities its configuration lists (RUNC lists
    ``snapshot``: ignored without ``resets``); acas never resets."""
    assert maf.Capability.SNAPSHOT not in declarations(published(RUNC).backends[0]).capabilities
    resetting = declarations(published({**RUNC, "resets": True}).backends[0])
    assert maf.Capability.SNAPSHOT in resetting.capabilities
    assert maf.Capability.SNAPSHOT not in declarations(published(ACAS).backends[0]).capabilities


def test_silence_stays_silence() -> None:
    got = declarations(published(GVISOR).backends[0])
    assert got.capabilities == {maf.Capability.EXEC, maf.Capability.FILES_IN}
    assert got.egress_modes == frozenset() and got.os_families == frozenset()
    assert got.program_channels == ()


def test_backend_selection() -> None:
    both = published(RUNC, GVISOR)
    assert select_backend(both, None).name == "runc"  # fixed: the first
    pinned = published(RUNC, GVISOR, pinnedBackend="gvisor")
    assert select_backend(pinned, None).name == "gvisor"
    with pytest.raises(BackendNotSelected):
        select_backend(pinned, "runc")  # fixed on gvisor: runc never serves
    per_spec = published(RUNC, GVISOR, selection="perSpec")
    with pytest.raises(BackendNotSelected):
        select_backend(per_spec, None)
    assert select_backend(per_spec, "gvisor").name == "gvisor"
    assert select_backend(published(GVISOR, selection="perSpec"), None).name == "gvisor"
    with pytest.raises(BackendNotSelected):
        select_backend(both, "kata")


def test_the_backend_is_a_maf_backend() -> None:
    client = SandboxClient.__new__(SandboxClient)  # never called: no cluster in unit tests
    backend = OperatorBackend(
        client, published(RUNC, GVISOR, selection="perSpec"), backend="gvisor"
    )
    assert isinstance(backend, maf.SandboxBackend)
    assert backend.name == "sandbox-operator/gvisor"
    assert backend.isolation is maf.Isolation.HARDENED_CONTAINER
    assert backend.declarations.capabilities == {maf.Capability.EXEC, maf.Capability.FILES_IN}


def _maf_spec(**fields: Any) -> maf.SandboxSpec:
    return maf.SandboxSpec(kind="python", image="python:3.12", **fields)


def test_spec_maps_field_by_field() -> None:
    spec = _maf_spec(
        work_dir="/maf-sandbox/work",
        requires=frozenset({maf.Capability.EXEC, maf.Capability.FILES_OUT}),
        egress=maf.Egress.ALLOWLIST,
        egress_allow=("pypi.org", maf.EgressRule(host="files.pythonhosted.org")),
        files_in=maf.TransferLimits(10, 20, 2),
        declared_outputs=(maf.DeclaredOutput(path="out/a.png", media_type="image/png"),),
        min_isolation=maf.Isolation.CONTAINER,
        isolation_scope=maf.IsolationScope.CALL,
        requires_os_family=maf.OsFamily.POSIX,
    )
    ours = operator_spec(spec)
    assert ours.kind == "python" and ours.image == "python:3.12"
    assert ours.work_dir == "/maf-sandbox/work"
    assert ours.requires == {contract.Capability.EXEC, contract.Capability.FILES_OUT}
    assert ours.egress is contract.Egress.ALLOWLIST
    assert ours.egress_allow == ("pypi.org", "files.pythonhosted.org")
    assert (ours.files_in.max_bytes_per_file, ours.files_in.max_files) == (10, 2)
    assert [(o.path, o.media_type) for o in ours.declared_outputs] == [("out/a.png", "image/png")]
    assert ours.min_isolation == "container"
    assert ours.isolation_scope is contract.IsolationScope.CALL
    assert ours.requires_os_family is contract.OsFamily.POSIX


def test_floor_raises_never_lowers() -> None:
    assert operator_spec(_maf_spec(), floor=maf.Isolation.MICROVM).min_isolation == "microvm"
    strong = _maf_spec(min_isolation=maf.Isolation.VM)
    assert operator_spec(strong, floor=maf.Isolation.CONTAINER).min_isolation == "vm"


def test_egress_methods_and_paths_are_declared_only_where_the_proxy_judges_them() -> None:
    """#38 item 2: EGRESS_METHODS and EGRESS_PATHS only for a backend whose proxy judges rules on
    plain http and inside HTTPS (a maf rule names no scheme), with a finite token set (CONNECT,
    refused in a rule, is not among them)."""
    hosts_only = declarations(published(RUNC).backends[0])
    assert (
        not {maf.Capability.EGRESS_METHODS, maf.Capability.EGRESS_PATHS} & hosts_only.capabilities
    )
    assert hosts_only.egress_method_tokens == frozenset()
    http_only = declarations(published({**RUNC, "declarations": {**RUNC["declarations"],
                                        "egressRules": True}}).backends[0])  # fmt: skip
    assert maf.Capability.EGRESS_METHODS not in http_only.capabilities
    both = {**RUNC["declarations"], "egressRules": True, "egressRulesHttps": True}
    got = declarations(published({**RUNC, "declarations": both}).backends[0])
    assert {maf.Capability.EGRESS_METHODS, maf.Capability.EGRESS_PATHS} <= got.capabilities
    assert got.egress_method_tokens == {
        "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"
    }  # fmt: skip


def test_a_maf_rule_becomes_an_egress_rule_on_both_schemes() -> None:
    spec = _maf_spec(
        egress=maf.Egress.ALLOWLIST,
        egress_allow=(
            "pypi.org",
            maf.EgressRule(host="files.example.com"),
            maf.EgressRule(host="api.example.com", methods=("GET", "POST"), paths=("/v1/*",)),
            maf.EgressRule(host="*.example.org", paths=("/health",)),
        ),
    )
    got = operator_spec(spec)
    assert got.egress_allow == ("pypi.org", "files.example.com")
    assert [r.to_wire() for r in got.egress_rules] == [
        {"host": "api.example.com", "schemes": ["http", "https"], "methods": ["GET", "POST"],
         "paths": ["/v1/*"]},
        {"host": "*.example.org", "schemes": ["http", "https"], "paths": ["/health"]},
    ]  # fmt: skip
    assert contract.Capability.EXEC in got.requires  # the rules' capabilities are not requires


def test_what_the_operator_cannot_enforce_is_refused() -> None:
    methods = _maf_spec(
        egress=maf.Egress.ALLOWLIST,
        egress_allow=(maf.EgressRule(host="api.example.com", methods=("CONNECT",)),),
    )
    with pytest.raises(ValueError, match="CONNECT"):
        operator_spec(methods)
    # A path maf accepts but the proxy cannot judge one way (an encoded dot, a '..;' segment).
    for path in ("/a/%2e%2e/b", "/a/..;/b"):
        odd = _maf_spec(
            egress=maf.Egress.ALLOWLIST,
            egress_allow=(maf.EgressRule(host="api.example.com", paths=(path,)),),
        )
        with pytest.raises(ValueError, match="egressRules path"):
            operator_spec(odd)
    with pytest.raises(ValueError, match="no image"):
        operator_spec(maf.SandboxSpec(kind="python"))
    assert operator_spec(maf.SandboxSpec(kind="python"), default_image="img").image == "img"
    assert operator_spec(maf.SandboxSpec(kind="python", work_dir=None), default_image="i").work_dir


def test_published_document_read_or_refused_by_name() -> None:
    doc = published(RUNC)
    data = {PUBLISHED_KEY: doc.model_dump_json(by_alias=True)}
    assert parse_published(data, "ns") == doc
    with pytest.raises(PublishedBackendsMissing) as missing:
        parse_published({}, "ns")
    assert missing.value.what == "key" and PUBLISHED_CONFIGMAP in str(missing.value)
    with pytest.raises(PublishedBackendsMissing) as invalid:
        parse_published({PUBLISHED_KEY: '{"backends": []}'}, "ns")
    assert invalid.value.what == "document"
    with pytest.raises(PublishedBackendsMissing):
        parse_published({PUBLISHED_KEY: "not json"}, "ns")


def test_labels_are_carried_verbatim() -> None:
    """#25 item 9: a maf spec's labels land in the contract spec as given (they were dropped)."""
    labels = {"tenant": "Contoso Ltd / EU", "cost centre": "  42  "}
    ours = operator_spec(_maf_spec(labels=dict(labels)))
    assert ours.labels == labels
    assert ours.to_wire()["labels"] == labels
    assert "labels" not in operator_spec(_maf_spec()).to_wire()


def test_outputs_named_at_call_time_is_carried() -> None:
    """#25 item 9: the flag is part of the contract's spec now, so it crosses as given."""
    requires = frozenset({maf.Capability.EXEC, maf.Capability.FILES_OUT})
    ours = operator_spec(_maf_spec(requires=requires, outputs_named_at_call_time=True))
    assert ours.outputs_named_at_call_time
    assert ours.to_wire()["outputsNamedAtCallTime"] is True
    assert not operator_spec(_maf_spec()).outputs_named_at_call_time


def test_acas_backend_sits_at_the_default_floor_without_reclaim() -> None:
    """An acas backend is ``MICROVM``: maf's router admits it at its own default floor (nothing
    lowered), and a sandbox it hands out refuses ``reclaim`` as maf's protocol asks of a backend
    withholding RECLAIM (NotImplementedError), so maf's cleanup disposes instead."""
    client = SandboxClient.__new__(SandboxClient)  # never called: no cluster in unit tests
    backend = OperatorBackend(client, published(ACAS))
    assert backend.isolation is maf.Isolation.MICROVM
    router = maf.SandboxRouter([backend])  # maf's default floor: microvm
    router.ensure_can_serve(
        maf.SandboxSpec(kind="python", requires=frozenset({maf.Capability.FILES_DELETE}))
    )


async def test_a_sandbox_withheld_reclaim_refuses_it() -> None:
    spec = maf.SandboxSpec(kind="python", requires=frozenset({maf.Capability.FILES_DELETE}))
    plane: Any = object()  # never reached: the refusal comes first
    sandbox = OperatorSandbox(plane, spec, base="/work", instance_id="i", reclaims=False)
    with pytest.raises(NotImplementedError, match="RECLAIM"):
        await sandbox.reclaim("call", working_directory=".", timeout=5)
