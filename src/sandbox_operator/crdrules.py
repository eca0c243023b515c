"""The Kubernetes-only parts of the CRDs that the contract models cannot say in a JSON schema: the
CEL rules for the invariants the API server can check (immutable fields, transitions, egress hosts,
work dirs, resources) and the printer columns. :mod:`sandbox_operator.crdgen` adds them to the
schemas it generates from the models."""

from __future__ import annotations

from typing import Any, Final

from sandbox_operator.contract import RESOURCE_NAMES, ConditionType
from sandbox_operator.contract.base import LABEL_KEY_MAX_LENGTH
from sandbox_operator.contract.egresshosts import (
    IP_LITERAL_PATTERN,
    LOOPBACK_SUFFIX,
    METADATA_HOSTS,
)
from sandbox_operator.contract.egressrules import (
    DOT_SEGMENT_PATTERN,
    ENCODED_SEPARATOR_PATTERN,
    RESERVED_HEADERS,
    UNENFORCEABLE_METHODS,
    WILDCARD_PATTERN,
)
from sandbox_operator.contract.workdir import (
    DRIVE_LETTER_PATTERN,
    POSIX_SYSTEM_WORK_DIR_PATTERN,
    UNNORMALISED_WORK_DIR_PATTERN,
    WINDOWS_ALIAS_WORK_DIR_PATTERN,
    WINDOWS_SYSTEM_WORK_DIR_PATTERN,
)

#: A schema node (or any piece of a CRD) as plain JSON data.
Schema = dict[str, Any]


def _rule(
    rule: str, message: str, reason: str | None = None, field_path: str | None = None
) -> Schema:
    entry: Schema = {"rule": rule, "message": message}
    if reason is not None:
        entry["reason"] = reason
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


def _immutable(field: str) -> Schema:
    return _rule("self == oldSelf", f"{field} is immutable after creation")


#: The egressRules rules a Sandbox spec and a pool template share (``SandboxSpec._combinations``).
EGRESS_RULES_SPEC_RULES: Final[list[Schema]] = [
    _rule(
        "!has(self.egressRules) || size(self.egressRules) == 0 || "
        "(has(self.egress) && self.egress == 'allowlist')",
        "egressRules is only valid with egress allowlist",
        field_path=".egressRules",
    ),
    _rule(
        "!has(self.egressRules) || "
        "self.egressRules.all(r, self.egressRules.exists_one(q, q.host == r.host))",
        "egressRules names a host more than once",
        field_path=".egressRules",
    ),
    _rule(
        "!has(self.egressRules) || !has(self.egressAllow) || "
        "self.egressRules.all(r, !(r.host in self.egressAllow))",
        "egressRules names a host that egressAllow lets through for every method and path: "
        "list a host in one of them",
        field_path=".egressRules",
    ),
]

#: CEL rules on the Sandbox spec object.
SANDBOX_SPEC_RULES: Final[list[Schema]] = [
    _rule(
        "!has(self.egressAllow) || size(self.egressAllow) == 0 || "
        "(has(self.egress) && self.egress == 'allowlist')",
        "egressAllow is only valid with egress allowlist",
        field_path=".egressAllow",
    ),
    _rule(
        "(has(self.isolationScope) && self.isolationScope == 'call') == "
        "(has(self.callId) && size(self.callId) > 0)",
        "callId is required when isolationScope is call, and must be empty otherwise",
        field_path=".callId",
    ),
    _rule(
        "!has(self.declaredOutputs) || size(self.declaredOutputs) == 0 || "
        "(has(self.requires) && 'files_out' in self.requires)",
        "declaredOutputs needs files_out in requires",
        field_path=".declaredOutputs",
    ),
    _rule(
        "!has(self.outputsNamedAtCallTime) || !self.outputsNamedAtCallTime || "
        "(has(self.requires) && 'files_out' in self.requires)",
        "outputsNamedAtCallTime needs files_out in requires",
        field_path=".outputsNamedAtCallTime",
    ),
    _rule(
        "!has(self.declaredOutputs) || !has(self.filesOut) || "
        "size(self.declaredOutputs) <= self.filesOut.maxFiles",
        "declaredOutputs has more entries than filesOut.maxFiles",
        field_path=".declaredOutputs",
    ),
    _rule(
        "!has(self.suspended) || !self.suspended || has(self.storage)",
        "suspended needs storage: without a work volume, suspending would lose the sandbox's "
        "files (delete the Sandbox instead)",
        field_path=".suspended",
    ),
    _rule(
        "!has(self.resets) || self.resets == 0 || !has(self.storage)",
        "resets needs a sandbox without storage: a reset gives the sandbox an empty work "
        "directory, and a persistent work volume is kept, never emptied",
        field_path=".resets",
    ),
    _rule(
        "!has(self.lifetime) || !has(self.lifetime.idleAction) || "
        "self.lifetime.idleAction != 'suspend' || has(self.storage)",
        "lifetime.idleAction suspend needs storage",
        field_path=".lifetime.idleAction",
    ),
]

#: Immutable key fields of a Sandbox spec.
SANDBOX_IMMUTABLE_FIELDS: Final = ("scopeRef", "agentDir", "callId")

#: Sandbox spec fields that may change after creation: the lifetime (extending a TTL or an idle
#: timeout is judged on the next pass), suspended (suspend and resume), resets (a reset, a
#: counter that only grows: :data:`SANDBOX_RESETS_RULE`) and the allowlist, egressAllow and
#: egressRules (an egress edit: each entry's rules and the spec's egress rules above still hold,
#: and the operator judges the edit against the serving backend before the proxy enforces it;
#: the egress mode stays fixed). Every other field decided the admission or shapes the pod.
SANDBOX_MUTABLE_FIELDS: Final = frozenset(
    {"lifetime", "suspended", "resets", "egressAllow", "egressRules"}
)

#: A transition rule on the spec object: spec.resets never goes down (nor away once set), so a
#: reset asked for is never undone by an older write and status.resets can say which one the
#: serving pod answers.
SANDBOX_RESETS_RULE: Final = _rule(
    "!has(oldSelf.resets) || (has(self.resets) && self.resets >= oldSelf.resets)",
    "resets may only increase: raise it by one to ask for a reset",
    field_path=".resets",
)


def _fixed_after_creation(field: str) -> Schema:
    """A transition rule on the spec object: ``field`` keeps its value, and is neither added nor
    removed. On the spec rather than the field, because a rule on the field itself is not run
    when the field appears or goes away."""
    return _rule(
        f"has(self.{field}) == has(oldSelf.{field}) && "
        f"(!has(self.{field}) || self.{field} == oldSelf.{field})",
        f"{field} cannot change after creation: the sandbox was admitted and started with the "
        "spec it was created with; create a new Sandbox instead (only lifetime, suspended, "
        "resets, egressAllow and egressRules may be edited)",
        field_path=f".{field}",
    )


def sandbox_spec_transition_rules(spec: Schema) -> list[Schema]:
    """One :func:`_fixed_after_creation` rule per spec field admission or the pod depends on."""
    fixed = set(spec["properties"]) - SANDBOX_MUTABLE_FIELDS - set(SANDBOX_IMMUTABLE_FIELDS)
    return [_fixed_after_creation(name) for name in sorted(fixed)] + [SANDBOX_RESETS_RULE]


#: Rules on nested objects, keyed by their type in the contract.
TRANSFER_LIMITS_RULES: Final[list[Schema]] = [
    _rule(
        "self.maxBytesPerFile <= self.maxTotalBytes",
        "maxBytesPerFile must not exceed maxTotalBytes",
        field_path=".maxBytesPerFile",
    )
]
#: Relative output paths: no '.' or '..' segment, no drive letter (the pattern already refuses
#: the rest: a leading '/', backslashes, control and glob characters).
RELATIVE_PATH_RULES: Final[list[Schema]] = [
    _rule(
        f"!self.matches('(^|/)[.][.]?(/|$)') && !self.matches(r'{DRIVE_LETTER_PATTERN}')",
        "must be relative to workDir: no '.' or '..' segments, no drive letter",
    ),
]

#: The model's static workDir rules (``work_dir_problem``), the same expressions in RE2.
WORK_DIR_RULES: Final[list[Schema]] = [
    _rule(
        f"!self.matches(r'{UNNORMALISED_WORK_DIR_PATTERN}')",
        "workDir must be a normalised path: no empty, '.' or '..' segments",
    ),
    _rule(
        f"!self.matches(r'{WINDOWS_ALIAS_WORK_DIR_PATTERN}')",
        "workDir uses a Windows spelling that names another directory (a ':' after the drive, a "
        "short name like PROGRA~1, or a segment ending in '.' or ' ')",
    ),
    _rule(
        f"!self.matches(r'{POSIX_SYSTEM_WORK_DIR_PATTERN}') && "
        f"!self.matches(r'{WINDOWS_SYSTEM_WORK_DIR_PATTERN}')",
        "workDir must not be a root or system directory (/, /proc, /sys, /dev, /etc, /boot, "
        "/run, /var/run, /bin, /lib, /usr/bin, /usr, a drive root, C:\\Windows, "
        "C:\\Program Files, ...); use a directory of the workload's own, e.g. /workspace",
    ),
]


def _cel_strings(values: tuple[str, ...]) -> str:
    """A CEL list literal of ``values`` (plain tokens: no quotes to escape)."""
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


_METADATA_LIST: Final = _cel_strings(METADATA_HOSTS)

#: The model's static egressAllow entry rules (``egress_host_problem``).
EGRESS_HOST_RULES: Final[list[Schema]] = [
    _rule(
        "self.contains('.')",
        "egressAllow entries must be fully qualified host names: a single label (metadata, "
        "localhost) is resolved through the proxy's search domains",
    ),
    _rule(
        f"!self.matches(r'{IP_LITERAL_PATTERN}')",
        "egressAllow entries must be host names, not IP literals",
    ),
    _rule(
        f"!(self in {_METADATA_LIST}) && !self.endsWith('{LOOPBACK_SUFFIX}')",
        "egressAllow entries must not name a cloud metadata or loopback host",
    ),
    _rule(
        f"!self.startsWith('*.') || !{_METADATA_LIST}.exists(m, m.endsWith(self.substring(1)))",
        "egressAllow wildcard would allow a cloud metadata host",
    ),
]


#: One egressRules entry (``EgressRule._enforceable``).
EGRESS_RULE_RULES: Final[list[Schema]] = [
    _rule(
        "has(self.methods) || has(self.paths) || has(self.credential)",
        "an egressRules entry names methods, paths or a credential (a plain host belongs in "
        "egressAllow)",
    ),
    _rule(
        "!has(self.credential) || (self.schemes == ['https'] && !self.host.startsWith('*.'))",
        "an egressRules credential needs schemes [https] only and an exact host",
        field_path=".credential",
    ),
]
_RESERVED_HEADER_LIST: Final = _cel_strings(RESERVED_HEADERS)
#: An egressRules credential (``EgressCredential``; the patterns hold the characters).
EGRESS_CREDENTIAL_RULES: Final[list[Schema]] = [
    _rule(
        f"!has(self.header) || !(self.header.lowerAscii() in {_RESERVED_HEADER_LIST})",
        "an egressRules credential may not fill a hop-by-hop, framing or Host header",
        field_path=".header",
    ),
]
_UNENFORCEABLE_LIST: Final = _cel_strings(UNENFORCEABLE_METHODS)
#: One method of an egressRules entry (the pattern holds the token and its case).
EGRESS_METHOD_RULES: Final[list[Schema]] = [
    _rule(
        f"!(self in {_UNENFORCEABLE_LIST})",
        "egressRules method CONNECT cannot be enforced: it opens a tunnel through the proxy",
    )
]
#: One path of an egressRules entry (``egress_path_problem``; the pattern holds the characters).
EGRESS_PATH_RULES: Final[list[Schema]] = [
    _rule(
        f"!self.matches(r'{WILDCARD_PATTERN}')",
        "egressRules paths may have '*' only as the whole last segment ('/prefix/*')",
    ),
    _rule(
        f"!self.matches(r'{DOT_SEGMENT_PATTERN}')",
        "egressRules paths must not have '.' or '..' segments",
    ),
    _rule(
        f"!self.matches(r'{ENCODED_SEPARATOR_PATTERN}')",
        "egressRules paths must not have a percent-encoded dot, slash or backslash",
    ),
]


def _request_within_limit(resource: str) -> Schema:
    requests, limits = f"self.requests.{resource}", f"self.limits.{resource}"
    return _rule(
        f"!has(self.requests) || !has(self.limits) || !has({requests}) || !has({limits}) || "
        f"!isQuantity(string({requests})) || !isQuantity(string({limits})) || "
        f"quantity(string({requests})).compareTo(quantity(string({limits}))) <= 0",
        f"requests.{resource} must not exceed limits.{resource}",
        field_path=f".requests.{resource}",
    )


#: Requests never above limits (Kubernetes quantity comparison, as ``parse_quantity`` does).
RESOURCES_RULES: Final[list[Schema]] = [_request_within_limit(r) for r in RESOURCE_NAMES]

#: No two declared outputs land under one name (``name``, else ``path``).
DECLARED_OUTPUTS_RULES: Final[list[Schema]] = [
    _rule(
        "self.all(o, self.exists_one(p, (has(p.name) ? p.name : p.path) == "
        "(has(o.name) ? o.name : o.path)))",
        "declaredOutputs land two artifacts under the same name (name, or path when unset)",
    )
]

#: A spec's ports: names and numbers unique (``ports_problem``).
PORTS_RULES: Final[list[Schema]] = [
    _rule(
        "self.all(p, self.exists_one(q, q.name == p.name))",
        "ports declares a name more than once",
    ),
    _rule(
        "self.all(p, self.exists_one(q, q.port == p.port))",
        "ports declares a port number more than once",
    ),
]

#: The one rule a spec's ``labels`` keys meet (the values' length is the map's own schema): the
#: same bound the model holds them to, since a structural schema cannot constrain a map's keys.
LABELS_RULES: Final[list[Schema]] = [
    _rule(
        f"self.all(k, size(k) >= 1 && size(k) <= {LABEL_KEY_MAX_LENGTH})",
        f"a labels key must be 1 to {LABEL_KEY_MAX_LENGTH} characters",
    )
]

#: Rules on the object holding workDir and requiresOsFamily (a Sandbox spec, a pool template).
WORKLOAD_RULES: Final[list[Schema]] = [
    _rule(
        "!has(self.requiresOsFamily) || self.requiresOsFamily != 'posix' || "
        f"!has(self.workDir) || !self.workDir.matches(r'{DRIVE_LETTER_PATTERN}')",
        "workDir is a Windows path, but requiresOsFamily is posix",
        field_path=".workDir",
    )
]
LIFETIME_RULES: Final[list[Schema]] = [
    _rule(
        "self.idleTimeoutSeconds <= self.ttlSeconds",
        "idleTimeoutSeconds must not exceed ttlSeconds",
        field_path=".idleTimeoutSeconds",
    )
]

#: The whole SandboxScope spec is fixed at creation: key parts and the conversation's floors.
SCOPE_SPEC_RULES: Final[list[Schema]] = [
    _rule(
        "self == oldSelf",
        "SandboxScope spec is immutable after creation; create a new SandboxScope instead",
    )
]

_READY = f'.status.conditions[?(@.type=="{ConditionType.READY.value}")]'

SANDBOX_PRINTER_COLUMNS: Final[list[Schema]] = [
    {"name": "Ready", "type": "string", "jsonPath": f"{_READY}.status"},
    {"name": "Reason", "type": "string", "jsonPath": f"{_READY}.reason"},
    {"name": "Backend", "type": "string", "jsonPath": ".status.backend"},
    {"name": "Isolation", "type": "string", "jsonPath": ".status.isolation"},
    {"name": "Suspended", "type": "string", "jsonPath": ".status.suspendedBy"},
    {"name": "Kind", "type": "string", "jsonPath": ".spec.kind", "priority": 1},
    {"name": "Floor", "type": "string", "jsonPath": ".status.effectiveFloor", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

SCOPE_PRINTER_COLUMNS: Final[list[Schema]] = [
    {"name": "Scope", "type": "string", "jsonPath": ".spec.scope"},
    {"name": "Thread", "type": "string", "jsonPath": ".spec.threadId"},
    {"name": "Sandboxes", "type": "integer", "jsonPath": ".status.sandboxCount"},
    {"name": "Ready", "type": "string", "jsonPath": f"{_READY}.status"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


POOL_PRINTER_COLUMNS: Final[list[Schema]] = [
    {"name": "Backend", "type": "string", "jsonPath": ".status.backend"},
    {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
    {"name": "Idle", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Claimed", "type": "integer", "jsonPath": ".status.claimed"},
    {"name": "Reason", "type": "string", "jsonPath": f"{_READY}.reason"},
    {"name": "Image", "type": "string", "jsonPath": ".spec.template.image", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

#: The template carries the Sandbox spec's rule on egressAllow.
POOL_TEMPLATE_RULES: Final[list[Schema]] = [SANDBOX_SPEC_RULES[0]]
