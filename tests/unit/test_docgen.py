"""The reference tables of docs/ are generated (``make docs``, sandbox_operator.docgen), and a
committed page that differs from what the code renders now fails here, as crds/ does against the
models (test_crds.py). The drift tests are shown able to fail: a reason, a metric or an RBAC rule
added to the sources the generator reads, without regenerating, is reported as drift."""

from __future__ import annotations

import shutil
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import Counter, Histogram

from sandbox_operator import docgen, metrics
from sandbox_operator.contract import conditions
from sandbox_operator.contract.conditions import REASON_DOCS, ConditionReason, ReasonDoc
from sandbox_operator.metrics import METRIC_DOCS, MetricDoc
from sandbox_operator.reconcile.lifecycle import TERMINAL_REASONS
from tests.fixtures.chart import ROOT, acas_values, by_kind, managed_proxy_values, template

RBAC_PAGE = "docs/rbac.md: the rbac table"


def test_committed_docs_match_the_generator() -> None:
    stale = docgen.drift(ROOT)
    assert not stale, f"generated tables out of date: {stale}: run `make docs` and commit them"


def test_every_table_is_held_by_one_page() -> None:
    held = [name for page in docgen.pages(ROOT) for name in docgen.regions(page.read_text())]
    assert sorted(held) == sorted(docgen.tables(ROOT))


# ---- reasons -----------------------------------------------------------------------------------


def test_every_condition_reason_has_a_description() -> None:
    assert list(REASON_DOCS) == list(ConditionReason)
    for reason, doc in REASON_DOCS.items():
        assert doc.conditions and doc.meaning and doc.terminal, reason


def test_the_terminal_column_is_the_lifecycles() -> None:
    said = {reason for reason, doc in REASON_DOCS.items() if doc.terminal == "yes"}
    assert said == TERMINAL_REASONS


def _with_reason(monkeypatch: pytest.MonkeyPatch, *, described: bool) -> None:
    """ConditionReason with one more member, as if added to contract/conditions.py."""
    members = [(r.name, r.value) for r in ConditionReason] + [("QUARANTINED", "Quarantined")]
    extended = StrEnum("ConditionReason", members)
    monkeypatch.setattr(conditions, "ConditionReason", extended)
    if described:
        docs = {**REASON_DOCS, "Quarantined": ReasonDoc("Ready=False", "held for review", "no")}
        monkeypatch.setattr(conditions, "REASON_DOCS", docs)


def test_a_reason_added_without_regenerating_is_drift(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_reason(monkeypatch, described=True)
    assert docgen.drift(ROOT) == ["docs/conditions.md: the reasons table"]
    assert "| `Quarantined` | Ready=False | held for review | no |" in docgen.reasons_table()


def test_a_reason_without_a_description_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_reason(monkeypatch, described=False)
    with pytest.raises(docgen.DocgenError, match="REASON_DOCS: Quarantined"):
        docgen.drift(ROOT)


# ---- metrics -----------------------------------------------------------------------------------


def test_every_metric_has_a_description() -> None:
    shapes = docgen.metric_shapes()
    assert list(shapes) and set(shapes) == set(METRIC_DOCS)
    for name, doc in METRIC_DOCS.items():
        assert tuple(doc.labels) == shapes[name].labels, name
        assert doc.counts, name


def test_metric_shapes_are_what_the_metrics_expose() -> None:
    """The shapes read off the metric objects (two private attributes among them) agree with
    what the objects accept and expose: these label names, these buckets."""
    objects = {
        docgen._shape(v).name: v  # type: ignore[union-attr]
        for v in vars(metrics).values()
        if docgen._shape(v) is not None and not isinstance(v, metrics.SandboxCensus)
    }
    for name, shape in docgen.metric_shapes().items():
        if name == metrics.SandboxCensus.NAME:
            family = metrics.SANDBOXES.describe()[0]
            assert (family.name, family.type) == (name, shape.type)
            continue
        obj: Any = objects[name]
        probe = dict.fromkeys(shape.labels, "docgen-probe")
        obj.labels(**probe)  # raises on label names the metric does not have
        try:
            samples = [s for family in obj.collect() for s in family.samples]
            ours = [s for s in samples if all(s.labels.get(k) == v for k, v in probe.items())]
            assert ours, name
            bounds = sorted({float(s.labels["le"]) for s in ours if "le" in s.labels})
            assert tuple(b for b in bounds if b != float("inf")) == shape.buckets, name
            exposed = {s.name for s in ours}
            assert any(n == name or n.startswith(name + "_") for n in exposed), (name, exposed)
        finally:
            obj.remove(*probe.values())


def _with_metric(monkeypatch: pytest.MonkeyPatch, *, described: bool) -> None:
    """One more metric in sandbox_operator.metrics (outside the global registry)."""
    extra = Histogram(
        "sandbox_operator_quarantine_seconds", "x", ["pool"], buckets=(0.5, 30), registry=None
    )
    monkeypatch.setattr(metrics, "QUARANTINE_SECONDS", extra, raising=False)
    if described:
        doc = MetricDoc({"pool": ""}, "time in quarantine")
        docs = {**METRIC_DOCS, "sandbox_operator_quarantine_seconds": doc}
        monkeypatch.setattr(metrics, "METRIC_DOCS", docs)


def test_a_metric_added_without_regenerating_is_drift(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_metric(monkeypatch, described=True)
    assert docgen.drift(ROOT) == ["docs/metrics.md: the metrics table"]
    row = "| `sandbox_operator_quarantine_seconds` | histogram (500 ms … 30 s) | `pool` |"
    assert row in docgen.metrics_table()


def test_a_metric_without_a_description_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_metric(monkeypatch, described=False)
    with pytest.raises(docgen.DocgenError, match="sandbox_operator_quarantine_seconds: no entry"):
        docgen.drift(ROOT)


def test_a_description_naming_other_labels_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = Counter("sandbox_operator_quarantines_total", "x", ["pool"], registry=None)
    monkeypatch.setattr(metrics, "QUARANTINES", extra, raising=False)
    doc = MetricDoc({"backend": ""}, "quarantines")
    monkeypatch.setattr(metrics, "METRIC_DOCS", {**METRIC_DOCS, extra.describe()[0].name: doc})
    with pytest.raises(docgen.DocgenError, match="no entry in METRIC_DOCS"):
        docgen.metrics_table()  # keyed without _total: the exposed name is what counts
    name = "sandbox_operator_quarantines_total"
    monkeypatch.setattr(metrics, "METRIC_DOCS", {**METRIC_DOCS, name: doc})
    with pytest.raises(docgen.DocgenError, match=r"names labels \['backend'\]"):
        docgen.metrics_table()


# ---- RBAC --------------------------------------------------------------------------------------


def _copy(tmp_path: Path) -> Path:
    """The docs and the chart's RBAC template under a root of their own."""
    shutil.copytree(ROOT / docgen.DOCS, tmp_path / docgen.DOCS)
    (tmp_path / docgen.RBAC_RULES).parent.mkdir(parents=True)
    shutil.copy(ROOT / docgen.RBAC_RULES, tmp_path / docgen.RBAC_RULES)
    shutil.copy(ROOT / docgen.HOST_RULES, tmp_path / docgen.HOST_RULES)
    return tmp_path


def test_an_rbac_rule_added_without_regenerating_is_drift(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    rules = root / docgen.RBAC_RULES
    text = rules.read_text()
    anchor = '{{- define "sandbox-operator.clusterRules" -}}\n'
    grant = "- apiGroups: [storage.k8s.io]\n  resources: [storageclasses]\n  verbs: [get]\n"
    rules.write_text(text.replace(anchor, anchor + grant))
    assert docgen.drift(root) == [RBAC_PAGE]
    assert docgen.write_all(root) == [root / "docs" / "rbac.md"]
    assert docgen.drift(root) == []
    assert (
        "| `storage.k8s.io` | `storageclasses` | get | cluster-wide |  |"
        in (root / "docs" / "rbac.md").read_text()
    )


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    return {
        (g, r, v, n)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
        for n in rule.get("resourceNames", ["*"])
    }


def test_the_rbac_table_holds_every_rule_the_chart_renders(tmp_path: Path) -> None:
    """The template read as the table reads it grants exactly what helm renders for the operator
    in both modes, with every optional part on (peering, the managed proxy, an acas Secret)."""
    secret = {"source": "secret", "secretName": "acas-sp"}
    files = [managed_proxy_values(tmp_path), acas_values(tmp_path, secret)]
    rendered: set[tuple[str, str, str, str]] = set()
    for values in ({}, {"watchNamespaces": "{team-a}"}):
        objs = template({**values, "egressCredentials.enabled": "true"}, values_files=files)
        roles = by_kind(objs, "ClusterRole") + by_kind(objs, "Role")
        # Not the operator's: the agents' Role, and the Secrets reader it binds to the proxy.
        theirs = ("agent", "egress-credentials")
        rendered |= _grants(
            [rule for role in roles if not any(t in role["metadata"]["name"] for t in theirs)
             for rule in role["rules"]]
        )  # fmt: skip
    read = _grants(
        [
            {
                "apiGroups": r.api_groups,
                "resources": r.resources,
                "verbs": r.verbs,
                **({"resourceNames": r.resource_names} if r.resource_names else {}),
            }
            for r in docgen.rbac_rules((ROOT / docgen.RBAC_RULES).read_text())
        ]
    )
    # The table's placeholders, as the default release ("so") renders them.
    names = {
        "<credential.secretName>": "acas-sp",
        "<connect>": "so-sandbox-operator-sealed-pool-pods",
        "<update>": "so-sandbox-operator-sealed-pool-pods-update",
        "<role>": "so-sandbox-operator-egress-credentials",
    }
    assert {(*g[:3], names.get(g[3], g[3])) for g in read} == rendered


def test_the_host_rbac_table_holds_what_the_chart_grants_the_maf_host(tmp_path: Path) -> None:
    """(#37 item 3) The host table is read from the rules the chart's hostRole renders (no
    more, no fewer), and a host rule added without regenerating is drift in docs/rbac.md."""
    objs = template(
        {
            "hostRole.create": "true",
            "hostRole.namespaces": "{hosts}",
            "hostRole.subjects[0].kind": "ServiceAccount",
            "hostRole.subjects[0].name": "maf-host",
            "hostRole.credentialGrants": "true",  # every optional rule on
        }
    )
    (role,) = [r for r in by_kind(objs, "Role") if r["metadata"]["name"].endswith("-host")]
    read = docgen.rbac_rules((ROOT / docgen.HOST_RULES).read_text(), docgen.HOST_RULES)
    assert {r.define for r in read} == {"sandbox-operator.hostRules"}
    as_rules = [
        {
            "apiGroups": r.api_groups,
            "resources": r.resources,
            "verbs": r.verbs,
            **({"resourceNames": r.resource_names} if r.resource_names else {}),
        }
        for r in read
    ]
    assert _grants(as_rules) == _grants(role["rules"])
    root = _copy(tmp_path)
    rules = root / docgen.HOST_RULES
    grant = "- apiGroups: ['']\n  resources: [secrets]\n  verbs: [get]\n"
    anchor = '{{- define "sandbox-operator.hostRules" -}}\n'
    rules.write_text(rules.read_text().replace(anchor, anchor + grant))
    assert docgen.drift(root) == ["docs/rbac.md: the host-rbac table"]
    docgen.write_all(root)
    assert '| `""` | `secrets` | get | each of `hostRole.namespaces` |  |' in (
        (root / "docs" / "rbac.md").read_text()
    )


def test_rbac_rules_carry_their_conditions() -> None:
    rules = docgen.rbac_rules((ROOT / docgen.RBAC_RULES).read_text())
    by_resource = {(r.define, r.resources): r for r in rules}
    peering = by_resource[("sandbox-operator.clusterRules", ("clusterkopfpeerings",))]
    assert peering.conditions == ("and .Values.peering.enabled (not .Values.watchNamespaces)",)
    pods = by_resource[("sandbox-operator.namespacedRules", ("pods",))]
    assert pods.conditions == () and pods.why.startswith("patch: claiming a warm pool")


@pytest.mark.parametrize(
    "line",
    [
        "{{- range .Values.extra }}\n",
        "{{- end }}\n{{- end }}\n",
        "- apiGroups: ['']\n  resources: [x]\n  verbs: [{{ printf \"get\" }}]\n",
        "  stray: indented\n",
    ],
)
def test_an_rbac_template_it_cannot_read_is_an_error(line: str) -> None:
    text = '{{- define "sandbox-operator.clusterRules" -}}\n' + line + "{{- end }}\n"
    with pytest.raises(docgen.DocgenError):
        docgen.rbac_rules(text)


def test_a_rule_outside_a_define_is_an_error() -> None:
    with pytest.raises(docgen.DocgenError, match="outside a define"):
        docgen.rbac_rules("- apiGroups: ['']\n  resources: [x]\n  verbs: [get]\n")


# ---- pages -------------------------------------------------------------------------------------


def test_render_replaces_only_the_regions() -> None:
    text = (
        "before\n<!-- generated: reasons (make docs) -->\nold\n<!-- end generated: reasons -->\n"
        "after | kept\n"
    )
    assert docgen.render(text, {"reasons": "| a \\| b |\n"}) == (
        "before\n<!-- generated: reasons (make docs) -->\n| a \\| b |\n"
        "<!-- end generated: reasons -->\nafter | kept\n"
    )


def test_a_region_naming_no_table_is_an_error() -> None:
    text = "<!-- generated: colours (make docs) -->\n<!-- end generated: colours -->\n"
    with pytest.raises(docgen.DocgenError, match="colours"):
        docgen.render(text, {})


def test_a_table_no_page_holds_is_drift(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    page = root / "docs" / "metrics.md"
    page.write_text(page.read_text().replace("<!-- generated: metrics", "<!-- metrics"))
    assert docgen.drift(root) == ["no page holds the metrics table"]


def test_a_cell_escapes_pipes_and_refuses_newlines() -> None:
    assert docgen._cell("a|b") == "a\\|b"
    with pytest.raises(docgen.DocgenError):
        docgen._cell("a\nb")
