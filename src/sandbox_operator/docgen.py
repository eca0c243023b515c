"""Generate the reference tables of docs/ from their sources (``make docs``), and find drift.

A table kept by hand next to the code it describes goes stale: a reason or a metric is added, a
grant changes, and the page still says what it said. So three tables are rendered from where the
truth is kept, and a unit test (tests/unit/test_docgen.py) fails when a committed page differs from
what this module renders now, the way tests/unit/test_crds.py holds crds/ to the models:

* ``reasons``: every :class:`~sandbox_operator.contract.ConditionReason`, with the conditions
  that carry it, its meaning and whether it is terminal
  (:data:`sandbox_operator.contract.conditions.REASON_DOCS`);
* ``metrics``: every metric :mod:`sandbox_operator.metrics` defines, its type, labels and what it
  counts (name, type, labels and buckets from the metric objects themselves, the rest from
  :data:`sandbox_operator.metrics.METRIC_DOCS`);
* ``router-metrics``: the ports router's, alike (:mod:`sandbox_operator.router.metrics`);
* ``rbac``: the operator's RBAC rules as the Helm chart grants them, read from
  ``charts/sandbox-operator/templates/_rbac_rules.tpl`` (the one place they are kept; a test
  holds that file to the rendered chart), each rule's "why" from the comment inside it;
* ``host-rbac``: the maf host's (the chart's ``hostRole``), read the same way from
  ``_host_rules.tpl``.

In a page, a table sits between two marker comments, and only what is between them is rewritten::

    <!-- generated: reasons (make docs) -->
    | Reason | ...
    <!-- end generated: reasons -->

A source without a description (a reason missing from ``REASON_DOCS``, a metric missing from
``METRIC_DOCS``) is an error, not an empty cell: adding one means saying what it means.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import yaml
from prometheus_client.metrics import MetricWrapperBase

from sandbox_operator import metrics as metrics_module
from sandbox_operator.contract import conditions as conditions_module
from sandbox_operator.metrics.census import SandboxCensus
from sandbox_operator.router import metrics as router_metrics

#: The chart's file of the operator's RBAC rules, relative to the repository root.
RBAC_RULES: Final = Path("charts/sandbox-operator/templates/_rbac_rules.tpl")
#: The chart's file of the maf host's RBAC rules (``hostRole``), relative to the repository root.
HOST_RULES: Final = Path("charts/sandbox-operator/templates/_host_rules.tpl")
#: Where the pages are, relative to the repository root.
DOCS: Final = Path("docs")

REGION: Final = re.compile(
    r"(?P<open><!-- generated: (?P<name>[a-z-]+) \(make docs\) -->\n)"
    r"(?P<body>.*?)"
    r"(?P<close><!-- end generated: (?P=name) -->)",
    re.DOTALL,
)


class DocgenError(ValueError):
    """A source the generator cannot render: a reason or metric without a description, a line
    of the RBAC template it cannot read, a region naming no table."""


def _cell(text: str) -> str:
    """One Markdown table cell: a ``|`` would end the cell, a newline the row."""
    if "\n" in text:
        raise DocgenError(f"a table cell cannot hold a newline: {text!r}")
    return text.replace("|", "\\|")


def _table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    head = list(header)
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# ---- condition reasons -------------------------------------------------------------------------


def reasons_table(module: ModuleType = conditions_module) -> str:
    """Every condition reason of ``module`` (``ConditionReason``), in the enum's order, described
    by its ``REASON_DOCS``: a reason without an entry is an error."""
    reasons: Iterable[StrEnum] = list(module.ConditionReason)
    docs: Mapping[str, conditions_module.ReasonDoc] = module.REASON_DOCS
    missing = [r.value for r in reasons if r not in docs]
    if missing:
        raise DocgenError(
            f"condition reasons without a description in contract.conditions.REASON_DOCS: "
            f"{', '.join(missing)}"
        )
    rows = [
        (f"`{r.value}`", docs[r].conditions, docs[r].meaning, docs[r].terminal) for r in reasons
    ]
    return _table(("Reason", "Condition(s)", "Meaning", "Terminal"), rows)


# ---- metrics -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricShape:
    """What a metric object says of itself: its exposed name, type, label names and buckets."""

    name: str
    type: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()


def _shape(value: object) -> MetricShape | None:
    """The shape of a metric object, or None for anything else.

    prometheus_client has no public accessor for a metric's label names and buckets, so they are
    read from its attributes (``_labelnames``, ``_upper_bounds``); tests/unit/test_docgen.py
    holds the result to what the metrics expose at a scrape, so a change there fails loudly."""
    if isinstance(value, SandboxCensus):
        return MetricShape(value.NAME, "gauge", tuple(value.LABELS))
    if not isinstance(value, MetricWrapperBase):
        return None
    family = next(iter(value.describe()))
    name = family.name + ("_total" if family.type == "counter" else "")
    bounds: Iterable[float] = getattr(value, "_upper_bounds", ())
    labels: Iterable[str] = getattr(value, "_labelnames", ())
    return MetricShape(
        name, family.type, tuple(labels), tuple(b for b in bounds if not math.isinf(b))
    )


def metric_shapes(module: ModuleType = metrics_module) -> dict[str, MetricShape]:
    """Every metric the module defines at top level, by exposed name."""
    shapes = (_shape(v) for v in vars(module).values())
    return {s.name: s for s in shapes if s is not None}


def _bound(value: float, seconds: bool) -> str:
    if not seconds:
        return f"{value:g}"
    return f"{value * 1000:g} ms" if value < 1 else f"{value:g} s"


def metrics_table(module: ModuleType = metrics_module) -> str:
    """Every metric of ``module``, in the order of its ``METRIC_DOCS``: a metric without an entry,
    an entry without a metric, or labels that differ are errors."""
    docs: Mapping[str, metrics_module.MetricDoc] = module.METRIC_DOCS
    shapes = metric_shapes(module)
    problems = [f"{n}: no entry in METRIC_DOCS" for n in sorted(shapes.keys() - docs.keys())]
    problems += [f"{n}: in METRIC_DOCS, no such metric" for n in sorted(docs.keys() - shapes)]
    problems += [
        f"{n}: METRIC_DOCS names labels {list(docs[n].labels)}, the metric has "
        f"{list(shapes[n].labels)}"
        for n in docs
        if n in shapes and tuple(docs[n].labels) != shapes[n].labels
    ]
    if problems:
        raise DocgenError("metrics the docs cannot describe: " + "; ".join(problems))
    rows = []
    for name, doc in docs.items():
        shape = shapes[name]
        kind = shape.type
        if shape.buckets:
            seconds = name.endswith("_seconds")
            lo, hi = _bound(shape.buckets[0], seconds), _bound(shape.buckets[-1], seconds)
            kind += f" ({lo} … {hi})"
        labels = ", ".join(f"`{k}`" + (f" ({v})" if v else "") for k, v in doc.labels.items())
        rows.append((f"`{name}`", kind, labels, doc.counts))
    return _table(("metric", "type", "labels", "what it counts"), rows)


# ---- RBAC --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RbacRule:
    """One rule of the chart's RBAC template, with where and when the chart grants it."""

    define: str
    conditions: tuple[str, ...]
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    resource_names: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str


#: Where each named template's rules are granted (the chart's rbac.yaml decides).
RBAC_PLACES: Final[Mapping[str, str]] = {
    "sandbox-operator.namespacedRules": "each served namespace (all of them: a ClusterRole)",
    "sandbox-operator.clusterRules": "cluster-wide",
    "sandbox-operator.publishedRule": "where it publishes: each served namespace",
    "sandbox-operator.credentialRule": "the Secret's namespace, per `acas` backend with a Secret "
    "credential",
    "sandbox-operator.hostRules": "each of `hostRole.namespaces`",
    "sandbox-operator.sealRule": "cluster-wide, with `sealIdlePoolPods` (the default)",
    "sandbox-operator.egressCredentialsRules": "each served namespace (all of them: a "
    "ClusterRole); only with `egressCredentials.enabled` and `config.egressProxy`",
}
#: The template conditions, in words.
RBAC_CONDITIONS: Final[Mapping[str, str]] = {
    'kindIs "map" .Values.config.egressProxy': "only with `config.egressProxy` (a managed egress "
    "proxy)",
    ".Values.watchNamespaces": "only serving `watchNamespaces`",
    ".Values.hostRole.credentialGrants": "only with `hostRole.credentialGrants`",
    "and .Values.peering.enabled .Values.watchNamespaces": "only with `peering.enabled`, serving "
    "`watchNamespaces`",
    "and .Values.peering.enabled (not .Values.watchNamespaces)": "only with `peering.enabled`, "
    "serving all namespaces",
}

_ACTION = re.compile(r"^\{\{-?\s*(?P<word>define|if|else|end|include)\b\s*(?P<arg>.*?)\s*-?\}\}$")
_INLINE = re.compile(r"\{\{-?\s*\.(?P<path>[\w.]+)(?:\s*\|\s*quote)?\s*-?\}\}")
_RULE_KEYS = {"apiGroups", "resources", "resourceNames", "verbs"}


@dataclass
class _Reader:
    """The state of :func:`rbac_rules` reading the template line by line."""

    source: Path = RBAC_RULES
    define: str | None = None
    conditions: tuple[str, ...] = ()
    chunk: list[str] | None = None
    why: list[str] | None = None


def _finish(state: _Reader, rules: list[RbacRule], lineno: int) -> None:
    """Close the rule being read, if any, and add it to ``rules``."""
    if state.chunk is None or state.why is None:
        return
    text = _INLINE.sub(lambda m: f'"<{m["path"]}>"', "".join(state.chunk))
    if "{{" in text:
        raise DocgenError(f"{state.source}:{lineno}: a template expression the table cannot show")
    loaded: Any = yaml.safe_load(text)
    if not (isinstance(loaded, list) and len(loaded) == 1 and isinstance(loaded[0], dict)):
        raise DocgenError(f"{state.source}:{lineno}: not one rule: {text!r}")
    rule: dict[str, Any] = loaded[0]
    if not set(rule) <= _RULE_KEYS or not {"apiGroups", "resources", "verbs"} <= set(rule):
        raise DocgenError(f"{state.source}:{lineno}: a rule with keys {sorted(rule)}")
    rules.append(
        RbacRule(
            define=state.define or "",
            conditions=state.conditions,
            api_groups=tuple(rule["apiGroups"]),
            resources=tuple(rule["resources"]),
            resource_names=tuple(rule.get("resourceNames", ())),
            verbs=tuple(rule["verbs"]),
            why=" ".join(state.why),
        )
    )
    state.chunk = state.why = None


def _action(state: _Reader, word: str, arg: str, lineno: int) -> None:
    """Apply one template action line (define, if, else, end, include) to the reader."""
    if word == "define":
        state.define, state.conditions = arg.strip('"'), ()
    elif word == "if":
        state.conditions += (arg,)
    elif word == "else" and state.conditions:
        state.conditions = (*state.conditions[:-1], f"not ({state.conditions[-1]})")
    elif word == "end":
        if state.conditions:
            state.conditions = state.conditions[:-1]
        elif state.define is not None:
            state.define = None
        else:
            raise DocgenError(f"{state.source}:{lineno}: end outside a define")
    elif word != "include":  # an include: the named template's rules are listed on their own
        raise DocgenError(f"{state.source}:{lineno}: {word} outside a condition")


def rbac_rules(template: str, source: Path = RBAC_RULES) -> list[RbacRule]:
    """The rules of the chart's RBAC template, in its order, each with its named template and
    the conditions around it.

    The file is YAML inside Go template actions. Read here: ``define``, ``if``/``else``/``end``
    lines, ``include`` lines (skipped: the included template is read on its own), template
    comments, YAML comments and rules. An inline expression (``{{ .credential.secretName }}``)
    is shown as ``<credential.secretName>``. Anything else is an error rather than a table that
    silently leaves a rule out."""
    rules: list[RbacRule] = []
    state = _Reader(source=source)
    in_comment = False
    for lineno, line in enumerate(template.splitlines(keepends=True), start=1):
        stripped = line.strip()
        if in_comment or stripped.startswith(("{{/*", "{{- /*")):
            in_comment = "*/" not in stripped
            _finish(state, rules, lineno)
            continue
        action = _ACTION.match(stripped)
        if action:
            _finish(state, rules, lineno)
            _action(state, action["word"], action["arg"], lineno)
        elif stripped.startswith("{{"):
            raise DocgenError(f"{state.source}:{lineno}: cannot read {stripped!r}")
        elif not stripped or line.startswith("#"):
            _finish(state, rules, lineno)
        elif state.define is None:
            raise DocgenError(f"{state.source}:{lineno}: a rule outside a define")
        elif line.startswith("- "):
            _finish(state, rules, lineno)
            state.chunk, state.why = [line], []
        elif line.startswith("  ") and state.chunk is not None and state.why is not None:
            if stripped.startswith("#"):
                state.why.append(stripped.lstrip("#").strip())
            else:
                state.chunk.append(line)
        else:
            raise DocgenError(f"{state.source}:{lineno}: cannot read {stripped!r}")
    _finish(state, rules, lineno=len(template.splitlines()))
    return rules


def _granted(rule: RbacRule) -> str:
    where = RBAC_PLACES.get(rule.define, f"`{rule.define}`")
    when = [RBAC_CONDITIONS.get(c, f"`{{{{ if {c} }}}}`") for c in rule.conditions]
    return "; ".join([where, *when])


def rbac_table(template: str, source: Path = RBAC_RULES) -> str:
    """The grants a chart's RBAC template (``source``) holds, one row per rule."""
    rows = []
    for rule in rbac_rules(template, source):
        resources = ", ".join(f"`{r}`" for r in rule.resources)
        if rule.resource_names:
            resources += " named " + ", ".join(f"`{n}`" for n in rule.resource_names)
        groups = ", ".join(f"`{g}`" if g else '`""`' for g in rule.api_groups)
        rows.append((groups, resources, ", ".join(rule.verbs), _granted(rule), rule.why))
    return _table(("API group", "Resources", "Verbs", "Granted", "Why"), rows)


# ---- pages -------------------------------------------------------------------------------------


def tables(root: Path) -> dict[str, str]:
    """Every generated table, by region name, as rendered from the sources under ``root``."""
    makers: dict[str, Callable[[], str]] = {
        "reasons": reasons_table,
        "metrics": metrics_table,
        "router-metrics": lambda: metrics_table(router_metrics),
        "rbac": lambda: rbac_table((root / RBAC_RULES).read_text()),
        "host-rbac": lambda: rbac_table((root / HOST_RULES).read_text(), HOST_RULES),
    }
    return {name: make() for name, make in makers.items()}


def render(text: str, generated: Mapping[str, str]) -> str:
    """``text`` with the body of every generated region replaced by its table."""

    def body(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in generated:
            raise DocgenError(f"a generated region names no table: {name!r}")
        return match["open"] + generated[name] + match["close"]

    return REGION.sub(body, text)


def regions(text: str) -> list[str]:
    """The names of the generated regions in ``text``, in order."""
    return [m["name"] for m in REGION.finditer(text)]


def pages(root: Path) -> list[Path]:
    """The Markdown pages that may hold generated regions."""
    return sorted((root / DOCS).rglob("*.md"))


def drift(root: Path, generated: Mapping[str, str] | None = None) -> list[str]:
    """What is out of date: each page region that differs from its table now, and each table no
    page holds. Empty when the docs are current."""
    generated = tables(root) if generated is None else generated
    found: list[str] = []
    held: set[str] = set()
    for page in pages(root):
        text = page.read_text()
        for match in REGION.finditer(text):
            name = match["name"]
            held.add(name)
            if match["body"] != generated.get(name, match["body"]):
                found.append(f"{page.relative_to(root)}: the {name} table")
        render(text, generated)  # an unknown region name raises
    found += [f"no page holds the {name} table" for name in sorted(generated.keys() - held)]
    return found


def write_all(root: Path) -> list[Path]:
    """Rewrite the generated regions of every page under ``root``; the pages that changed."""
    generated = tables(root)
    changed = []
    for page in pages(root):
        text = page.read_text()
        new = render(text, generated)
        if new != text:
            page.write_text(new)
            changed.append(page)
    return changed
