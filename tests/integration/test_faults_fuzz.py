"""Fault test: 1,000 generated Sandbox and SandboxScope specs against the real API server and a
real operator (issue 13, Deliver 8).

The specs are generated with hypothesis, derandomized (the same list on every run with the same
hypothesis version): valid specs built from the contract's constraints (``contract/models.py``
and the modules it builds on, ``contract/resources.py``), specs the host policy refuses, and
specs with one to three hostile values (control and invisible characters, unicode, very long
strings, huge and negative numbers, wrong types, unknown fields, nulls, missing fields,
duplicates, globs, system and Windows work dirs, IP literals and metadata names in
``egressAllow``, quantities Kubernetes does not know).
They are created 16 at a time in one namespace served by the operator (a subprocess, as in every
e2e test) whose two backends run on kwok's fake nodes, so an admitted Sandbox becomes Ready
without a container. Each spec ends as one of:

* refused by the API server (422, or 400 for an unknown field under ``fieldValidation=Strict``),
* accepted, then refused by a typed condition (``Admitted=False`` / ``Ready=False`` with a
  ``ConditionReason``),
* accepted and served (Ready; or a later terminal outcome of a served sandbox).

Asserted:

* no accepted spec is one the models refuse: the operator never has to end a Sandbox
  ``StartupFailed "spec is invalid"`` or leave a SandboxScope ``Pending "spec is invalid"``
  (a CRD that admits what the models refuse);
* every spec the models refuse, or that breaks a host rule (a work dir under a system path or a
  Windows path on POSIX backends, a glob in ``declaredOutputs``, an IP literal in
  ``egressAllow``, resources above the host's ceilings) is never admitted, and a refusal by
  condition names the field;
* every refusal by the API server names the field;
* every valid, servable spec is accepted and Ready; every spec the policy refuses is accepted
  and refused by a typed condition;
* every accepted object settles (a terminal or refusal condition) within a bound, and a plain
  Sandbox created after the fuzz is Ready at once (nothing wedged);
* the operator never crashed or restarted (same pid throughout) and its log has no traceback
  of an unexpected error (a pass retried because the API server did not answer, when another
  test restarts it, is tolerated and counted);
* every object is deletable afterwards: all gone within a bound.

Also printed, not asserted: specs the models accept and the API server refuses (a CRD stricter
than the models), specs the models raise on instead of refusing, hostile values that were
served.

A table of outcomes is printed (``pytest -s`` shows it).
"""

from __future__ import annotations

import contextlib
import copy
import json
import posixpath
import random
import re
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from sandbox_operator.contract import ConditionReason
from sandbox_operator.contract.errors import RefusalReason
from sandbox_operator.contract.quantities import parse_quantity
from sandbox_operator.contract.resources import SandboxResourceSpec, SandboxScopeResourceSpec
from tests.fixtures.operator import GROUP, VERSION, Kit, OperatorProcess, local_config

# exclusive: a thousand specs, a load that would starve concurrent tests (run alone, last).
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.exclusive]

N_SANDBOXES = 800
N_SCOPES = 200
IN_FLIGHT = 16
SETTLE_TIMEOUT = 150.0  # seconds after the last create for every accepted object to settle
DELETE_TIMEOUT = 120.0  # seconds after the deletes for every object to be gone
CANARY_TIMEOUT = 30.0  # seconds for a plain Sandbox created after the fuzz to be Ready

# ---- the host this runs against -----------------------------------------------------------------

SERVED_CAPS = ["exec", "run_code", "files_in", "files_out", "files_list", "files_delete"]
UNSERVED_CAPS = ["host_tools", "snapshot", "attached_identity"]
SERVED_RUNGS = ["none", "runtime", "os_process", "container", "hardened_container"]
MAX_LIMITS = {"cpu": "4", "memory": "8Gi"}
# The backends declare no transfer limits: the default ceilings hold (contract TransferLimits).
MAX_FILES, MAX_PER_FILE, MAX_TOTAL = 64, 8 * 1024 * 1024, 32 * 1024 * 1024
SYSTEM_DIRS = ("/proc", "/sys", "/dev", "/etc")

DECLARATIONS = {
    "capabilities": SERVED_CAPS,
    "egressModes": ["closed", "allowlist"],
    "osFamilies": ["posix"],
    "isolationScopes": ["conversation", "call"],
}
# An external egress proxy (nobody runs it; kwok pods send nothing): allowlist Sandboxes are
# served without waiting for a proxy to admit them.
EXTERNAL_PROXY = {
    "url": "http://192.0.2.10:3128",
    "port": 3128,
    "podSelector": {"app.kubernetes.io/name": "fuzz-egress-proxy"},
}


def fuzz_config() -> dict[str, Any]:
    """Two backends on kwok's fake nodes (hardened_container first, then container), per spec,
    floor container, resource ceilings of 4 CPU and 8Gi."""
    backends = [
        {
            "name": name,
            "type": "runtimeClass",
            "runtimeClassName": "kwok",
            "isolation": isolation,
            "declarations": DECLARATIONS,
            "egressProxy": EXTERNAL_PROXY,
        }
        for name, isolation in (("kwok-hardened", "hardened_container"), ("kwok", "container"))
    ]
    cfg = local_config(
        floor="container",
        backends=backends,
        operator={"resyncSeconds": 30, "disposeTimeoutSeconds": 20, "disposalRetrySeconds": 3},
    )
    cfg["hostPolicy"]["resources"] = {"maxLimits": dict(MAX_LIMITS)}
    return cfg


# SandboxScopes made before the fuzz: what a generated Sandbox names (name -> spec).
HOST_SCOPES: dict[str, dict[str, Any]] = {
    "host-a": {"scope": "tenant-a", "threadId": "thread-a"},
    "host-b": {"scope": "tenant-b", "threadId": "thread-b"},
    "host-hard": {
        "scope": "tenant-a",
        "threadId": "thread-hard",
        "minIsolation": "hardened_container",
    },
    "host-vm": {"scope": "tenant-b", "threadId": "thread-vm", "minIsolation": "microvm"},
    "host-call": {"scope": "tenant-c", "threadId": "thread-call", "minIsolationScope": "call"},
}
SERVING_SCOPES = ["host-a", "host-b", "host-hard"]

REFUSALS = frozenset(r.value for r in RefusalReason)
CONDITION_REFUSALS = REFUSALS | {ConditionReason.SCOPE_NOT_FOUND, ConditionReason.KEY_UNCLEAN}
TERMINAL = frozenset(
    {
        ConditionReason.STARTUP_FAILED,
        ConditionReason.STARTUP_TIMEOUT,
        ConditionReason.FAILED,
        ConditionReason.EXPIRED,
    }
)
SETTLED = CONDITION_REFUSALS | TERMINAL | {ConditionReason.READY}

# ---- cases --------------------------------------------------------------------------------------

DELETE = object()  # a Mutation value: remove the key
Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Mutation:
    """Hostile values set into a spec. ``field`` is the spec field a refusal should name."""

    label: str
    field: str
    sets: tuple[tuple[Path, Any], ...]
    #: Pruned or defaulted by the API server (an unknown field, a null): left out of the spec
    #: the models are asked about.
    benign: bool = False
    unknown: bool = False


@dataclass(frozen=True)
class Draft:
    """A generated spec before it gets its name: the base, what it is meant to be, mutations."""

    spec: dict[str, Any]
    base: str  # "serve": valid and servable; "refuse:<why>": the policy refuses it; "other"
    mutations: tuple[Mutation, ...]


@dataclass
class Case:
    plural: str  # sandboxes | sandboxscopes
    name: str
    spec: Any
    base: str
    mutations: tuple[Mutation, ...]
    strict: bool  # created with fieldValidation=Strict
    kept: Any = None  # the spec as the API server keeps it, as far as the test knows
    # outcome
    code: int = 0  # HTTP status of the create (201 accepted)
    message: str = ""
    causes: list[str] = field(default_factory=list)
    stored: dict[str, Any] | None = None
    final: dict[str, Any] | None = None

    @property
    def fields(self) -> set[str]:
        return {m.field for m in self.mutations}

    @property
    def accepted(self) -> bool:
        return self.code in (200, 201)


# ---- strategies ---------------------------------------------------------------------------------

CONTROLS = ["\x00", "\x01", "\x07", "\t", "\n", "\r", "\x0b", "\x0c", "\x1b", "\x1f", "\x7f"]
# Not control characters in the models' sense (C0 and DEL), but whitespace or invisible.
ODD_CHARS = ["\x85", "\xa0", "\u2028", "\u202e", "\u3000", "\ufeff", "\u200b", "\x80", "\x9f"]
SAFE_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12)
PRINTABLE = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Z")), min_size=1, max_size=30)
WRONG_TYPE = st.one_of(
    st.integers(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.sampled_from(["a", "b"]), st.integers(), max_size=2),
)


def hostile_text(max_len: int = 253) -> st.SearchStrategy[str]:
    # Hypothesis favours the first alternative: the most telling comes first, "" last.
    return st.one_of(
        st.builds(lambda a, c, b: a + c + b, SAFE_TEXT, st.sampled_from(CONTROLS), SAFE_TEXT),
        st.builds(lambda a, c, b: a + c + b, SAFE_TEXT, st.sampled_from(ODD_CHARS), SAFE_TEXT),
        st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40),
        st.sampled_from([max_len + 1, max_len, 4096, 70_000]).map(lambda n: "x" * n),
        st.sampled_from(
            [
                "..",
                "../../etc/passwd",
                "*",
                "**/*",
                "C:\\Windows",
                "/proc/self",
                " ",
                " lead",
                "trail ",
                "a b",
                "$(id)",
                "${HOME}",
                "😀" * 10,
                "\uff21\uff22\uff23",
                "\u202eevil",
                "é" * 253,
                "\U0001d538" * 254,
            ]
        ),
        st.just(""),
    )


HOSTILE_INT = st.one_of(
    st.sampled_from([-1, 0, 1, -(2**63), 2**31, 2**53 + 1, 2**63 - 1, 2**63, 10**30]),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["64", "1e3", "", "0x10"]),
    st.booleans(),
)
HOSTILE_QUANTITY = st.one_of(
    st.sampled_from(
        [
            -1,
            "-1",
            "-100m",
            "0",
            0,
            "1e3",
            "1E3",
            "0.5.5",
            "+1",
            " 1",
            "1 ",
            "1\n",
            "1.",
            ".5",
            "1Ei",
            "1m\n",
            "0.0001",
            "1000000000000000000",
            10**18,
            2**63 - 1,
            2**63,
            10**30,
            "9" * 64,
            "9" * 65,
            "1.5Gi",
            "100Mi",
            "1ki",
            "1KI",
            "\u0663",
            "\uff11",
            "5",
            "16Gi",
        ]
    ),
    WRONG_TYPE,
)
SYSTEM_WORKDIRS = [
    "/proc",
    "/proc/self",
    "/proc/1/root",
    "/sys",
    "/sys/fs/cgroup",
    "/dev",
    "/dev/shm",
    "/etc",
    "/etc/ssl",
    "/proc/",
    "//proc",
    "/./etc",
    "/workspace/../etc",
]
WINDOWS_WORKDIRS = ["C:\\Windows", "C:/Users/agent", "c:\\", "D:\\work", "C:\\Windows\\System32"]
ODD_WORKDIRS = [
    "/work\x00",
    "/work\n",
    "/work\x1bdir",
    "/",
    "/tmp",
    "/tmp/work",
    "/var/run/secrets/kubernetes.io/serviceaccount",
    "/usr",
    "/bin",
    "/root",
    "/PROC",
    "/workspace/./x",
    "/a b",
    "/\u202e",
    "/😀",
    "relative/path",
    "",
    "~",
    "/" + "x" * 1023,
    "/" + "x" * 1024,
    "\\\\server\\share",
    "C:",
    "C:relative",
]
HOSTILE_HOSTS = [
    "169.254.169.254",
    "10.0.0.1",
    "127.0.0.1",
    "0.0.0.0",
    "1.1.1.1",
    "999.999.999.999",
    "::1",
    "[::1]",
    "metadata.google.internal",
    "metadata",
    "localhost",
    "kubernetes.default.svc",
    "*",
    "*.*",
    "*.com",
    "Example.com",
    "exa mple.com",
    "bücher.de",
    "xn--bcher-kva.de",
    "a..b",
    "-a.com",
    "a-.com",
    "a" * 64 + ".com",
    ".".join(["a" * 63] * 4),
    "example.com.",
    "example.com:443",
    "http://example.com",
    "",
    "example.com\n",
]
GLOBS = ["*", "**/*", "out/*.png", "*.txt", "a/**", "report-*.json"]
ODD_PATHS = [
    "a?b",
    "[ab].txt",
    "..",
    "a/../b",
    "./a",
    "a/./b",
    "/abs",
    "a//b",
    "a\\b",
    "C:foo",
    "a\x00b",
    "a\nb",
    "a/",
    "",
    "x" * 1025,
    "😀.png",
]
HOSTILE_MEDIA = ["", "text", "text/", "/plain", "text/plain; charset=utf-8", "a b/c", "*/*"]


def _hosts() -> st.SearchStrategy[str]:
    label = st.from_regex(r"[a-z]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
    tld = st.sampled_from(["com", "dev", "org", "io", "example"])
    return st.builds(
        lambda wild, labels, top: ("*." if wild else "") + ".".join([*labels, top]),
        st.booleans(),
        st.lists(label, min_size=1, max_size=3),
        tld,
    )


def _path() -> st.SearchStrategy[str]:
    segment = st.from_regex(r"[a-z0-9_-][a-z0-9._-]{0,11}", fullmatch=True).filter(
        lambda s: s not in (".", "..")
    )
    return st.lists(segment, min_size=1, max_size=3).map("/".join)


QUANTITIES = {
    "cpu": ["10m", "100m", "250m", "500m", "1", "2", "4", "1500m", "0.5"],
    "memory": ["16Mi", "64Mi", "128Mi", "512Mi", "1Gi", "2Gi", "8Gi", "1G", "100M"],
}


@st.composite
def valid_resources(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, dict[str, str]] = {}
    for resource, values in QUANTITIES.items():
        limit = draw(st.none() | st.sampled_from(values))
        if limit is not None:
            out.setdefault("limits", {})[resource] = limit
        below = [v for v in values if limit is None or parse_quantity(v) <= parse_quantity(limit)]
        request = draw(st.none() | st.sampled_from(below))
        if request is not None:
            out.setdefault("requests", {})[resource] = request
    return out


@st.composite
def valid_sandbox(draw: st.DrawFn, why: str | None) -> tuple[dict[str, Any], str]:
    """A spec the models accept; servable by this host unless ``why`` names what makes the
    policy refuse it (base ``refuse:<why>``), or ``fuzzed-scope`` (base ``other``: it names a
    generated SandboxScope, no expectation)."""
    spec: dict[str, Any] = {
        "scopeRef": draw(st.sampled_from(SERVING_SCOPES)),
        "agentDir": draw(
            st.sampled_from(["agents", "agents/coder", "a", "\uff21\uff22", "agent 😀"])
        ),
        "kind": draw(st.from_regex(r"[a-z0-9]([a-z0-9._-]{0,20}[a-z0-9])?", fullmatch=True)),
        "image": draw(
            st.sampled_from(
                [
                    "sandbox-operator.dev/busybox:1",
                    "sandbox-operator.dev/python:1",
                    "registry.example.com/team/app:1.2.3",
                    "ghcr.io/x/y@sha256:" + "0" * 64,
                ]
            )
            | st.from_regex(r"[a-z0-9./:@_-]{1,60}", fullmatch=True)
        ),
    }
    if draw(st.booleans()):
        spec["workDir"] = draw(
            st.sampled_from(["/workspace", "/home/agent", "/work/dir-1", "/data/run", "/srv/app"])
        )
    requires = draw(st.lists(st.sampled_from(SERVED_CAPS), unique=True, max_size=6))
    if draw(st.booleans()):
        spec["requires"] = requires
    if draw(st.booleans()):
        spec["minIsolation"] = draw(st.sampled_from(SERVED_RUNGS))
    if draw(st.booleans()):
        spec["isolationScope"] = "call"
        spec["callId"] = draw(PRINTABLE)
        if draw(st.booleans()):
            spec["scopeRef"] = "host-call"
    if draw(st.booleans()):
        spec["requiresOsFamily"] = "posix"
    if draw(st.booleans()):
        spec["egress"] = draw(st.sampled_from(["closed", "allowlist"]))
        if spec["egress"] == "allowlist":
            spec["egressAllow"] = draw(st.lists(_hosts(), unique=True, max_size=5))
    files_out_max = MAX_FILES
    for direction in ("filesIn", "filesOut"):
        if draw(st.booleans()):
            total = draw(st.integers(0, MAX_TOTAL))
            limits = {
                "maxTotalBytes": total,
                "maxBytesPerFile": draw(st.integers(0, min(total, MAX_PER_FILE))),
                "maxFiles": draw(st.integers(0, MAX_FILES)),
            }
            spec[direction] = limits
            if direction == "filesOut":
                files_out_max = limits["maxFiles"]
    if "files_out" in requires and "requires" in spec and draw(st.booleans()):
        outputs = draw(
            st.lists(
                st.fixed_dictionaries(
                    {"path": _path(), "mediaType": st.sampled_from(["text/plain", "image/png"])},
                    optional={"required": st.booleans(), "name": _path()},
                ),
                max_size=min(4, files_out_max),
                unique_by=lambda o: o.get("name") or o["path"],
            )
        )
        if outputs:
            spec["declaredOutputs"] = outputs
    if draw(st.booleans()):
        spec["resources"] = draw(valid_resources())
    if draw(st.booleans()):
        ttl = draw(st.integers(600, 7 * 24 * 3600))
        spec["lifetime"] = {
            "startupTimeoutSeconds": draw(st.integers(60, 3600)),
            "ttlSeconds": ttl,
            "idleTimeoutSeconds": draw(st.integers(300, ttl)),
        }
    base = "serve"
    if why == "capability":
        spec["requires"] = [*requires, draw(st.sampled_from(UNSERVED_CAPS))]
    elif why == "floor":
        spec["minIsolation"] = draw(st.sampled_from(["microvm", "vm"]))
    elif why == "os":
        spec["requiresOsFamily"] = "windows"
    elif why == "egress":
        spec["egress"] = "unrestricted"
        spec.pop("egressAllow", None)
    elif why == "transfer":
        spec["filesIn"] = {"maxFiles": draw(st.integers(MAX_FILES + 1, 100_000))}
    elif why == "ceiling":
        spec["resources"] = {"limits": {"cpu": draw(st.sampled_from(["5", "8", "64", "4001m"]))}}
    elif why == "call-scope":
        spec["scopeRef"] = "host-call"
        spec.pop("isolationScope", None)
        spec.pop("callId", None)
    elif why == "scope-floor":
        spec["scopeRef"] = "host-vm"
    elif why == "no-scope":
        spec["scopeRef"] = "no-such-scope"
    elif why == "fuzzed-scope":
        spec["scopeRef"] = f"fz-scope-{draw(st.integers(0, N_SCOPES - 1)):04d}"
    if why == "fuzzed-scope":
        base = "other"
    elif why is not None:
        base = f"refuse:{why}"
    return spec, base


def _mut(
    label: str, fld: str, values: st.SearchStrategy[Any], path: Path | None = None, **kw: Any
) -> st.SearchStrategy[Mutation]:
    return values.map(lambda v: Mutation(label, fld, (((path or (fld,)), v),), **kw))


def _outputs(path_values: st.SearchStrategy[Any], key: str = "path") -> st.SearchStrategy[Any]:
    return path_values.map(lambda p: [{"path": "ok.txt", "mediaType": "text/plain", key: p}])


def _sandbox_mutations() -> list[st.SearchStrategy[Mutation]]:
    """One strategy per kind of hostile value (a plan picks among them evenly)."""
    with_files_out: tuple[Path, Any] = (("requires",), ["exec", "files_in", "files_out"])
    return [
        _mut("agentDir:hostile", "agentDir", hostile_text()),
        _mut("agentDir:wrong-type", "agentDir", WRONG_TYPE),
        hostile_text().map(
            lambda v: Mutation(
                "callId:hostile",
                "callId",
                ((("isolationScope",), "call"), (("callId",), v)),
            )
        ),
        _mut("callId:without-call", "callId", PRINTABLE),
        _mut(
            "scopeRef:hostile",
            "scopeRef",
            hostile_text() | st.sampled_from(["Host-A", "host-a.", "-a", "a" * 254, "host_a"]),
        ),
        _mut("kind:hostile", "kind", hostile_text(63) | st.sampled_from(["Python", "a" * 64])),
        _mut(
            "image:hostile",
            "image",
            hostile_text(512)
            | st.sampled_from(["busybox\x0b", "busy\xa0box", "a b", "\u3000", "busybox\n"]),
        ),
        _mut("workDir:system", "workDir", st.sampled_from(SYSTEM_WORKDIRS)),
        _mut("workDir:windows", "workDir", st.sampled_from(WINDOWS_WORKDIRS)),
        _mut("workDir:odd", "workDir", st.sampled_from(ODD_WORKDIRS) | hostile_text(1024)),
        _mut(
            "requires:hostile",
            "requires",
            st.sampled_from(
                [
                    ["exec", "exec"],
                    ["exec", "files_in", "exec"],
                    ["teleport"],
                    ["EXEC"],
                    [],
                    SERVED_CAPS + UNSERVED_CAPS,
                    [*SERVED_CAPS, "exec"],
                    "exec",
                    [1],
                    [None],
                ]
            )
            | WRONG_TYPE,
        ),
        _mut(
            "minIsolation:hostile",
            "minIsolation",
            st.sampled_from(["process", "VM", "", "hardened-container", "microVM", "gvisor"])
            | WRONG_TYPE,
        ),
        _mut(
            "isolationScope:hostile",
            "isolationScope",
            st.sampled_from(["thread", "Call", "", "CONVERSATION"]) | WRONG_TYPE,
        ),
        _mut(
            "requiresOsFamily:hostile",
            "requiresOsFamily",
            st.sampled_from(["linux", "Posix", "", "darwin"]) | WRONG_TYPE,
        ),
        _mut("egress:hostile", "egress", st.sampled_from(["open", "Closed", "", "none"])),
        st.one_of(
            st.lists(st.sampled_from(HOSTILE_HOSTS), min_size=1, max_size=3),
            st.sampled_from(
                [["a.com", "a.com"], [f"h{i}.example" for i in range(65)], "example.com", [1]]
            ),
        ).map(
            lambda hosts: Mutation(
                "egressAllow:hostile",
                "egressAllow",
                ((("egress",), "allowlist"), (("egressAllow",), hosts)),
            )
        ),
        _mut("egressAllow:not-allowlist", "egressAllow", st.just(["example.com"])),
        st.tuples(
            st.sampled_from(["filesIn", "filesOut"]),
            st.sampled_from(["maxBytesPerFile", "maxTotalBytes", "maxFiles"]),
            HOSTILE_INT,
        ).map(lambda t: Mutation(f"{t[0]}:hostile", t[0], (((t[0], t[1]), t[2]),))),
        st.sampled_from(["filesIn", "filesOut"]).map(
            lambda d: Mutation(
                f"{d}:per-file-above-total",
                d,
                (((d,), {"maxBytesPerFile": 1000, "maxTotalBytes": 999}),),
            )
        ),
        *(
            variants.map(
                lambda t: Mutation(
                    f"declaredOutputs:{t[0]}",
                    "declaredOutputs",
                    (with_files_out, (("declaredOutputs",), t[1])),
                )
            )
            for variants in (
                st.one_of(
                    _outputs(hostile_text(1024) | st.sampled_from(ODD_PATHS)).map(
                        lambda v: ("path", v)
                    ),
                    _outputs(st.sampled_from(ODD_PATHS), "name").map(lambda v: ("name", v)),
                ),
                st.one_of(
                    _outputs(st.sampled_from(GLOBS)).map(lambda v: ("glob", v)),
                    _outputs(st.sampled_from(GLOBS), "name").map(lambda v: ("glob", v)),
                ),
                st.one_of(
                    st.just(
                        (
                            "duplicate",
                            [
                                {"path": "a.txt", "mediaType": "text/plain"},
                                {"path": "b.txt", "name": "a.txt", "mediaType": "text/plain"},
                            ],
                        )
                    ),
                    _outputs(st.sampled_from(HOSTILE_MEDIA), "mediaType").map(
                        lambda v: ("media", v)
                    ),
                    st.just(
                        (
                            "too-many",
                            [{"path": f"o{i}.txt", "mediaType": "text/plain"} for i in range(65)],
                        )
                    ),
                ),
            )
        ),
        _mut("declaredOutputs:no-files-out", "declaredOutputs", _outputs(st.just("a.txt"))),
        st.tuples(
            st.sampled_from(["requests", "limits"]),
            st.sampled_from(["cpu", "memory"]),
            HOSTILE_QUANTITY,
        ).map(
            lambda t: Mutation("resources:hostile", "resources", ((("resources", *t[:2]), t[2]),))
        ),
        st.sampled_from(["cpu", "memory"]).map(
            lambda r: Mutation(
                "resources:requests-above-limits",
                "resources",
                ((("resources",), {"requests": {r: "2"}, "limits": {r: "1"}}),),
            )
        ),
        _mut(
            "resources:unknown-resource",
            "resources",
            st.sampled_from(["1", 1, "nvidia.com/gpu"]),
            ("resources", "limits", "nvidia.com/gpu"),
            benign=True,
            unknown=True,
        ),
        st.tuples(
            st.sampled_from(["startupTimeoutSeconds", "ttlSeconds", "idleTimeoutSeconds"]),
            HOSTILE_INT,
        ).map(lambda t: Mutation("lifetime:hostile", "lifetime", ((("lifetime", t[0]), t[1]),))),
        st.just(
            Mutation(
                "lifetime:idle-above-ttl",
                "lifetime",
                ((("lifetime",), {"ttlSeconds": 600, "idleTimeoutSeconds": 601}),),
            )
        ),
        st.sampled_from(
            [("fooBar",), ("lifetime", "extra"), ("filesIn", "x"), ("resources", "claims")]
        ).map(
            lambda p: Mutation("unknown-field", str(p[-1]), ((p, 1),), benign=True, unknown=True)
        ),
        st.sampled_from(
            ["workDir", "requires", "egress", "filesIn", "lifetime", "minIsolation", "kind"]
        ).map(lambda f: Mutation("null", f, (((f,), None),), benign=True)),
        st.sampled_from(["kind", "image", "agentDir", "scopeRef"]).map(
            lambda f: Mutation("missing-required", f, (((f,), DELETE),))
        ),
        st.sampled_from(["x", [], 5, None, True]).map(
            lambda v: Mutation("spec:wrong-type", "spec", (((), v),))
        ),
    ]


def _scope_mutations() -> list[st.SearchStrategy[Mutation]]:
    return [
        _mut("scope:hostile", "scope", hostile_text()),
        _mut("threadId:hostile", "threadId", hostile_text()),
        _mut("scope:wrong-type", "scope", WRONG_TYPE),
        _mut(
            "minIsolation:hostile",
            "minIsolation",
            st.sampled_from(["process", "VM", "", "gvisor"]) | WRONG_TYPE,
        ),
        _mut(
            "minIsolationScope:hostile",
            "minIsolationScope",
            st.sampled_from(["thread", "Call", ""]) | WRONG_TYPE,
        ),
        st.sampled_from([("fooBar",), ("threadID",)]).map(
            lambda p: Mutation("unknown-field", str(p[0]), ((p, "x"),), benign=True, unknown=True)
        ),
        st.sampled_from(["minIsolation", "minIsolationScope", "scope"]).map(
            lambda f: Mutation("null", f, (((f,), None),), benign=True)
        ),
        st.sampled_from(["scope", "threadId"]).map(
            lambda f: Mutation("missing-required", f, (((f,), DELETE),))
        ),
        st.sampled_from(["x", [], 5, None]).map(
            lambda v: Mutation("spec:wrong-type", "spec", (((), v),))
        ),
    ]


@st.composite
def _valid_scope(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "scope": draw(st.sampled_from(["tenant-a", "tenant-b", "acme"]) | PRINTABLE),
        "threadId": draw(st.sampled_from(["thread", "t", "conv"]) | PRINTABLE),
    }
    if draw(st.booleans()):
        spec["minIsolation"] = draw(st.sampled_from([*SERVED_RUNGS, "microvm", "vm"]))
    if draw(st.booleans()):
        spec["minIsolationScope"] = draw(st.sampled_from(["conversation", "call"]))
    return spec


# Built once: building strategies costs more than drawing from them.
SANDBOX_MUTATIONS = _sandbox_mutations()
SCOPE_MUTATIONS = _scope_mutations()
VALID_SCOPE = _valid_scope()
REFUSED_BASES = [
    "capability",
    "floor",
    "os",
    "egress",
    "transfer",
    "ceiling",
    "call-scope",
    "scope-floor",
    "no-scope",
]
VALID_SANDBOX = {why: valid_sandbox(why) for why in [None, *REFUSED_BASES, "fuzzed-scope"]}
#: How many hostile values a spec gets: none for about a third.
MUTATION_COUNTS = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3]
#: Which base a generated Sandbox spec gets: servable (None) for about half, else what makes
#: the policy refuse it, or a generated SandboxScope (no expectation).
WHYS = [None] * 11 + [*REFUSED_BASES, "fuzzed-scope"]


def _rng(spec: Any) -> random.Random:
    """A Random seeded by a drawn spec: picks how many hostile values it gets and of which
    kinds, evenly (hypothesis's own choices favour the first alternative), and still a function
    of what hypothesis drew, so every run makes the same picks."""
    return random.Random(zlib.crc32(_key(spec).encode()))


@st.composite
def sandbox_draft(draw: st.DrawFn) -> Draft:
    spec, base = draw(VALID_SANDBOX[draw(st.sampled_from(WHYS))])
    rng = _rng(spec)
    kinds = [rng.randrange(len(SANDBOX_MUTATIONS)) for _ in range(rng.choice(MUTATION_COUNTS))]
    return Draft(spec, base, tuple(draw(SANDBOX_MUTATIONS[k]) for k in kinds))


@st.composite
def scope_draft(draw: st.DrawFn) -> Draft:
    spec = draw(VALID_SCOPE)
    rng = _rng(spec)
    kinds = [rng.randrange(len(SCOPE_MUTATIONS)) for _ in range(rng.choice(MUTATION_COUNTS))]
    return Draft(spec, "serve", tuple(draw(SCOPE_MUTATIONS[k]) for k in kinds))


def draw_all(strategy: st.SearchStrategy[Draft], n: int) -> list[Draft]:
    """``n`` examples of ``strategy``: derandomized, the same ones on every run (with the same
    hypothesis version)."""
    out: list[Draft] = []

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(draft: Draft) -> None:
        out.append(draft)

    collect()
    return out


def _key(value: Any) -> str:
    """A canonical text of a draft, to count distinct ones."""

    def plain(v: Any) -> Any:
        if v is DELETE:
            return "<delete>"
        if isinstance(v, Mutation):
            return [v.label, [[list(p), plain(x)] for p, x in v.sets]]
        if isinstance(v, Draft):
            return [v.spec, v.base, [plain(m) for m in v.mutations]]
        return v

    return json.dumps(plain(value), sort_keys=True, default=repr)


# ---- building the cases -------------------------------------------------------------------------


def _apply(spec: Any, path: Path, value: Any) -> Any:
    """``spec`` with ``value`` set at ``path`` (DELETE removes); intermediate dicts are made."""
    if not path:
        return value
    root = spec if isinstance(spec, dict) else {}
    node: Any = root
    for key in path[:-1]:
        child = node.get(key) if isinstance(node, dict) else None
        if not isinstance(child, dict):
            if value is DELETE:
                return root
            child = {}
            node[key] = child
        node = child
    if value is DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = copy.deepcopy(value)
    return root


def _unique(value: Any, index: int) -> Any:
    """A key part made unique to its case (so two accepted Sandboxes never share a key) while
    keeping what makes it hostile: an index prefix, unless that would change its validity."""
    if isinstance(value, str) and value and len(value) <= 240:
        return f"{index:04d}-{value}"
    return value


UNIQUE_PATHS = {"sandboxes": {("agentDir",), ("callId",)}, "sandboxscopes": {("threadId",)}}


def compose(plural: str, draft: Draft, index: int, *, as_kept: bool = False) -> Any:
    """The spec of a draft: its base with the hostile values set in order, key parts made unique.
    ``as_kept``: the spec as the API server keeps it, as far as the test knows without asking
    (an unknown field pruned, a null dropped): what the models are asked about."""
    spec: Any = copy.deepcopy(draft.spec)
    for path in UNIQUE_PATHS[plural]:
        if spec.get(path[0]):
            spec[path[0]] = _unique(spec[path[0]], index)
    for m in draft.mutations:
        if as_kept and m.unknown:
            continue
        for path, value in m.sets:
            if as_kept and m.benign and value is None:
                value = DELETE
            elif path in UNIQUE_PATHS[plural]:
                value = _unique(value, index)
            spec = _apply(spec, path, value)
    return spec


def build_cases() -> list[Case]:
    drafts = [("sandboxscopes", "fz-scope", d) for d in draw_all(scope_draft(), N_SCOPES)]
    drafts += [("sandboxes", "fz-sbx", d) for d in draw_all(sandbox_draft(), N_SANDBOXES)]
    cases: list[Case] = []
    made: Counter[str] = Counter()
    for plural, prefix, draft in drafts:
        i = made[plural]
        made[plural] += 1
        case = Case(
            plural,
            f"{prefix}-{i:04d}",
            compose(plural, draft, i),
            draft.base,
            draft.mutations,
            strict=i % 2 == 1,
        )
        case.kept = compose(plural, draft, i, as_kept=True)
        cases.append(case)
    # Scopes and Sandboxes interleaved, deterministically: a Sandbox may name a scope that comes
    # later (ScopeNotFound first, then admitted).
    return sorted(cases, key=lambda c: (hash_index(c.name), c.name))


def hash_index(name: str) -> int:
    return sum((i + 1) * ord(ch) for i, ch in enumerate(name)) % 997


# ---- oracles ------------------------------------------------------------------------------------


#: Set by model_problem: specs the models raised on instead of refusing them (a validator that
#: lets something other than ValueError escape). The operator would fail its pass on such a
#: spec every time, so one the API server accepts counts as a disagreement.
MODEL_CRASHES: list[str] = []


def model_problem(plural: str, spec: Any) -> str | None:
    """Why the models refuse ``spec`` (None: they accept it)."""
    model = SandboxResourceSpec if plural == "sandboxes" else SandboxScopeResourceSpec
    try:
        model.model_validate(spec if isinstance(spec, dict) else {"": spec})
    except ValidationError as exc:
        first = exc.errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    except Exception as exc:
        crash = f"the models raised {type(exc).__name__} ({exc}) instead of refusing"
        MODEL_CRASHES.append(f"{plural} spec={short(spec, 300)}: {crash}")
        return crash
    return None


def _is_ipv4(host: str) -> bool:
    return re.fullmatch(r"(\*\.)?[0-9]+(\.[0-9]+){3}", host) is not None


def host_problems(spec: dict[str, Any]) -> list[str]:
    """The fields of a spec the models accept that break a rule of this host (issue 13 item 7):
    a work dir under a system path or a Windows path (the backends are POSIX), a glob in a
    declared output, an IP literal in egressAllow, resources above the host's ceilings."""
    problems = []
    work_dir = str(spec.get("workDir", "/workspace"))
    normal = posixpath.normpath(work_dir)
    if re.match(r"^[A-Za-z]:", work_dir) or any(
        normal == d or normal.startswith(d + "/") for d in SYSTEM_DIRS
    ):
        problems.append("workDir")
    for out in spec.get("declaredOutputs") or []:
        if "*" in str(out.get("path", "")) or "*" in str(out.get("name") or ""):
            problems.append("declaredOutputs")
    if any(_is_ipv4(str(h)) for h in spec.get("egressAllow") or []):
        problems.append("egressAllow")
    resources = spec.get("resources") or {}
    for part in ("requests", "limits"):
        for name, ceiling in MAX_LIMITS.items():
            value = (resources.get(part) or {}).get(name)
            with contextlib.suppress(Exception):  # accepted by the models, so it parses
                if value is not None and parse_quantity(str(value)) > parse_quantity(ceiling):
                    problems.append(f"{part}.{name}")
    return sorted(set(problems))


#: The spec fields a "refuse:<why>" base is refused for.
REFUSED_FOR: dict[str, frozenset[str]] = {
    "capability": frozenset({"requires"}),
    "floor": frozenset({"minIsolation"}),
    "os": frozenset({"requiresOsFamily"}),
    "egress": frozenset({"egress", "egressAllow"}),
    "transfer": frozenset({"filesIn"}),
    "ceiling": frozenset({"resources"}),
    "call-scope": frozenset({"scopeRef", "isolationScope", "callId"}),
    "scope-floor": frozenset({"scopeRef"}),
    "no-scope": frozenset({"scopeRef"}),
}


def undone(case: Case) -> bool:
    """Whether a mutation (a benign null the API server prunes or defaults) took away the very
    field its base is refused for: ``minIsolation: null`` on a raised floor is served, rightly."""
    why = case.base.removeprefix("refuse:")
    fields = REFUSED_FOR.get(why, frozenset())
    return any(m.field in fields for m in case.mutations)


def condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    return Kit.condition(obj, ctype) or {}


def outcome(case: Case) -> str:
    """One line of the outcome table for ``case``."""
    if case.code in (400, 422):
        return f"refused by the API server ({case.code})"
    if not case.accepted:
        return f"create failed: HTTP {case.code}"
    ready = condition(case.final, "Ready")
    reason = ready.get("reason") or "(no condition)"
    if case.plural == "sandboxscopes":
        if ready.get("status") == "True":
            return "accepted and Ready"
        return f"accepted, not Ready: {reason}"
    if ready.get("status") == "True":
        return "accepted and Ready"
    if reason in CONDITION_REFUSALS:
        return f"refused by condition: {reason}"
    if reason == ConditionReason.STARTUP_FAILED and "spec is invalid" in ready.get("message", ""):
        return "accepted, then StartupFailed 'spec is invalid'"
    if reason in TERMINAL:
        return f"served, then {reason}"
    return f"unsettled: {reason}"


def settled(case: Case) -> bool:
    if not case.accepted:
        return True
    ready = condition(case.final, "Ready")
    if case.plural == "sandboxscopes":
        return bool(ready)
    return ready.get("reason") in SETTLED


# ---- the cluster side ---------------------------------------------------------------------------


def _api(kubeconfig: str) -> client.CustomObjectsApi:
    """A client with a connection pool as large as the number of requests in flight."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    cfg.connection_pool_maxsize = IN_FLIGHT * 2
    return client.CustomObjectsApi(client.ApiClient(cfg))


def _body(case: Case) -> dict[str, Any]:
    kind = "Sandbox" if case.plural == "sandboxes" else "SandboxScope"
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": kind,
        "metadata": {"name": case.name, "labels": {"sandbox-operator.dev/fuzz": "true"}},
        "spec": case.spec,
    }


#: How long a request is retried while the API server does not answer (another test may be
#: restarting it: connection refused, 503 "not all paths installed", 429 "storage initializing").
OUTAGE_SECONDS = 90.0


class Outages:
    """Requests of this test that met an API server that did not answer, for the report."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def note(self) -> None:
        with self.lock:
            self.count += 1


OUTAGES = Outages()


def _transient(exc: Exception) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in (429, 500, 502, 503, 504) or not exc.status
    return True  # no answer at all: connection refused or reset, timeout


def create(api: client.CustomObjectsApi, ns: str, case: Case) -> None:
    deadline = time.monotonic() + OUTAGE_SECONDS
    retried = False
    while True:
        try:
            stored = api.create_namespaced_custom_object(
                GROUP,
                VERSION,
                ns,
                case.plural,
                _body(case),
                field_validation="Strict" if case.strict else None,
            )
        except Exception as exc:
            if _transient(exc) and time.monotonic() < deadline:
                OUTAGES.note()
                retried = True
                time.sleep(2)
                continue
            if isinstance(exc, ApiException) and exc.status == 409 and retried:
                # The create that got no answer went through.
                stored = api.get_namespaced_custom_object(
                    GROUP, VERSION, ns, case.plural, case.name
                )
            elif isinstance(exc, ApiException):
                case.code = int(exc.status or 0)
                try:
                    body = json.loads(exc.body or "{}")
                except ValueError:
                    body = {"message": str(exc.body)[:2000]}
                case.message = str(body.get("message", ""))
                causes = (body.get("details") or {}).get("causes") or []
                case.causes = [str(c.get("field") or "") for c in causes]
                return
            else:
                case.code = -1
                case.message = f"{type(exc).__name__}: {exc}"
                return
        case.code = 201
        case.stored = stored
        return


def names_field(case: Case) -> bool:
    """Whether an API refusal names a field the case's mutations touched (or, for a spec whose
    mutations only made it invalid in combination, any field of the spec)."""
    text = case.message + " " + " ".join(case.causes)
    if any(f in text for f in case.fields):
        return True
    return bool(re.search(r"\bspec(\.[A-Za-z]|\b)", text)) and not case.fields


def delete(api: client.CustomObjectsApi, ns: str, plural: str, name: str) -> str | None:
    """Delete one object; None when the request was taken (or it is gone), else why not."""
    deadline = time.monotonic() + OUTAGE_SECONDS
    while True:
        try:
            api.delete_namespaced_custom_object(GROUP, VERSION, ns, plural, name)
            return None
        except Exception as exc:
            if isinstance(exc, ApiException) and exc.status == 404:
                return None
            if not _transient(exc) or time.monotonic() >= deadline:
                detail = (
                    f"HTTP {exc.status} {str(exc.body)[:300]}"
                    if isinstance(exc, ApiException)
                    else f"{type(exc).__name__}: {exc}"
                )
                return f"{plural}/{name}: {detail}"
            OUTAGES.note()
        time.sleep(2)


def listing(api: client.CustomObjectsApi, ns: str, plural: str) -> dict[str, dict[str, Any]]:
    items = api.list_namespaced_custom_object(GROUP, VERSION, ns, plural)["items"]
    return {str(o["metadata"]["name"]): o for o in items}


def wait_until(check: Callable[[], bool], timeout: float, every: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            if check():
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)


#: The last line of a traceback for an API server that did not answer: the operator logs the
#: failed pass and retries it (``reconcile/workqueue.py``), which is what it should do.
TRANSIENT_ERROR = re.compile(
    r"(ConnectionRefusedError|ConnectionResetError|ServerDisconnectedError|ClientConnectorError"
    r"|ClientOSError|TimeoutError|CancelledError|ApiException: \((429|500|502|503|504)\))"
)


def log_errors(op: OperatorProcess) -> tuple[list[str], int]:
    """Tracebacks in the operator's log: (those of unexpected errors, the number of those of an
    API server that did not answer). A record starts with ``[date time]``; a traceback's last
    unindented line names the exception."""
    try:
        text = op.log_path.read_text(errors="replace")
    except OSError:
        return [], 0
    records: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("[") or not records:
            records.append([line])
        else:
            records[-1].append(line)
    unexpected, transient = [], 0
    for record in records:
        if not any(line.startswith("Traceback") for line in record):
            continue
        last = [line for line in record if line and not line.startswith((" ", "Traceback"))]
        final = last[-1] if last else ""
        if TRANSIENT_ERROR.search(final):
            transient += 1
        else:
            unexpected.append("\n".join(record[:1] + record[-12:]))
    return unexpected, transient


def table(rows: Iterable[tuple[str, ...]], header: tuple[str, ...]) -> str:
    data = [header, *rows]
    widths = [max(len(r[i]) for r in data) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in data]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def short(value: Any, n: int = 160) -> str:
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= n else text[:n] + f"...({len(text)} chars)"


# ---- the test -----------------------------------------------------------------------------------


def test_fuzzed_specs_are_refused_or_served_and_never_wedge_the_operator(
    kwok_nodes: list[str],
    kit: Kit,
    start_operator: Callable[..., OperatorProcess],
    kubeconfig: str,
) -> None:
    started = time.monotonic()
    assert kwok_nodes, "no kwok fake node is Ready"
    MODEL_CRASHES.clear()
    cases = build_cases()
    generated = time.monotonic() - started
    n_sandboxes = sum(c.plural == "sandboxes" for c in cases)
    assert (n_sandboxes, len(cases) - n_sandboxes) == (N_SANDBOXES, N_SCOPES)

    op = start_operator(fuzz_config())
    assert op.proc is not None
    pid = op.proc.pid
    api = _api(kubeconfig)
    ns = kit.ns
    for name, spec in HOST_SCOPES.items():
        kit.scope(
            name,
            **{k: v for k, v in spec.items() if k not in ("scope", "threadId")},
            scope=spec["scope"],
            thread_id=spec["threadId"],
        )

    # -- create, IN_FLIGHT at once
    t_create = time.monotonic()
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        list(pool.map(lambda c: create(api, ns, c), cases))
    create_seconds = time.monotonic() - t_create
    accepted = [c for c in cases if c.accepted]

    # -- settle: every accepted object carries a settled condition
    t_settle = time.monotonic()

    def all_settled() -> bool:
        objs = {p: listing(api, ns, p) for p in ("sandboxes", "sandboxscopes")}
        for case in accepted:
            case.final = objs[case.plural].get(case.name, case.final)
        return all(settled(c) for c in accepted)

    wait_until(all_settled, SETTLE_TIMEOUT)
    settle_seconds = time.monotonic() - t_settle
    alive_after_settle = op.running and op.proc.pid == pid

    # -- not wedged: a plain Sandbox created now is Ready at once
    t_canary = time.monotonic()
    kit.sandbox("fz-canary", scope_ref="host-a", agent_dir="agents/canary")
    try:
        kit.wait_condition("fz-canary", reasons=("Ready",), status="True", timeout=CANARY_TIMEOUT)
        canary = f"Ready after {time.monotonic() - t_canary:.1f}s"
    except AssertionError as exc:
        canary = f"not Ready: {exc}"

    # -- delete everything, then everything must be gone
    t_delete = time.monotonic()
    targets = [(p, n) for p in ("sandboxes", "sandboxscopes") for n in listing(api, ns, p)]
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        delete_errors = [e for e in pool.map(lambda t: delete(api, ns, *t), targets) if e]
    remaining: dict[str, list[str]] = {}
    redeleted: list[str] = []

    def all_gone() -> bool:
        remaining.clear()
        for plural in ("sandboxes", "sandboxscopes"):
            objs = listing(api, ns, plural)
            if objs:
                remaining[plural] = sorted(objs)
            for name, obj in objs.items():
                if not obj["metadata"].get("deletionTimestamp"):
                    # Its delete (or its scope's purge) met an API server that did not answer.
                    redeleted.append(f"{plural}/{name}")
                    delete(api, ns, plural, name)
        return not remaining

    gone = wait_until(all_gone, DELETE_TIMEOUT)
    delete_seconds = time.monotonic() - t_delete
    alive_at_end = op.running and op.proc.pid == pid
    problems_in_log, transient_in_log = log_errors(op)
    total = time.monotonic() - started

    # -- classify
    disagreements: list[str] = []  # accepted, but the models refuse the stored spec
    wrongly_served: list[str] = []  # invalid (models or host rules) yet admitted
    unnamed_refusals: list[str] = []  # API refusals that name no field the case touched
    unnamed_conditions: list[str] = []  # host-rule refusals by a condition that names no field
    valid_refused: list[str] = []  # valid and servable, yet refused or not Ready
    policy_missed: list[str] = []  # the policy should refuse it, and did not by a condition
    stricter: list[str] = []  # the models accept the spec, the API server refuses it
    unsettled: list[str] = []
    for case in cases:
        what = (
            f"{case.plural}/{case.name} {[m.label for m in case.mutations]} spec={short(case.spec)}"
        )
        view = case.kept
        raw_problem = model_problem(case.plural, view)
        if case.accepted:
            stored_spec = (case.final or case.stored or {}).get("spec")
            problem = model_problem(case.plural, stored_spec)
            if problem is not None:
                disagreements.append(
                    f"{what}\n      models: {problem}\n      stored: {short(stored_spec, 400)}"
                )
            if not settled(case):
                unsettled.append(f"{what} -> {condition(case.final, 'Ready')}")
        elif case.code in (400, 422):
            if not names_field(case):
                unnamed_refusals.append(f"{what}\n      {case.message[:300]} causes={case.causes}")
            if raw_problem is None and not any(m.unknown for m in case.mutations if case.strict):
                hp = (
                    host_problems(view)
                    if case.plural == "sandboxes" and isinstance(view, dict)
                    else []
                )
                if not hp:
                    stricter.append(f"{what}\n      {case.message[:300]}")
        if case.plural != "sandboxes":
            continue
        admitted = condition(case.final, "Admitted").get("status") == "True"
        host = host_problems(view) if raw_problem is None and isinstance(view, dict) else []
        invalid = raw_problem is not None or bool(host)
        if invalid and case.accepted and admitted:
            wrongly_served.append(f"{what}\n      why invalid: {raw_problem or host}")
        ready = condition(case.final, "Ready")
        if host and case.accepted and not admitted and ready.get("reason") in REFUSALS:
            message = ready.get("message", "")
            # The checks run in the contract's order (the floor first), so a spec with two
            # problems may be refused for the other one: a raised floor, named as such, raised
            # by the spec itself or by the scope it names (host-vm raises it to microvm, which
            # no backend here reaches).
            floor_named = (
                "IsolationBelowFloor" in message
                and isinstance(view, dict)
                and (
                    ("raised by: spec" in message and bool(view.get("minIsolation")))
                    or (
                        "raised by: scope" in message
                        and bool(HOST_SCOPES.get(str(view.get("scopeRef")), {}).get("minIsolation"))
                    )
                )
            )
            if not floor_named and not any(
                h.split(".")[0] in message or h in message for h in host
            ):
                unnamed_conditions.append(f"{what}\n      {ready.get('reason')}: {message[:300]}")
        plain = not case.mutations or all(
            m.benign and not (m.unknown and case.strict) for m in case.mutations
        )
        if plain and raw_problem is None and not host:
            if case.base == "serve" and not (case.accepted and ready.get("status") == "True"):
                valid_refused.append(
                    f"{what} -> HTTP {case.code} {case.message[:200]} {ready.get('reason')}: "
                    f"{ready.get('message', '')[:200]}"
                )
            if (
                case.base.startswith("refuse:")
                and not undone(case)
                and not (
                    case.accepted and not admitted and ready.get("reason") in CONDITION_REFUSALS
                )
            ):
                policy_missed.append(
                    f"{what} -> HTTP {case.code} {ready.get('reason')}: "
                    f"{ready.get('message', '')[:200]}"
                )

    # -- report
    failed_creates = [
        f"{c.plural}/{c.name} HTTP {c.code}: {c.message[:300]} spec={short(c.spec)}"
        for c in cases
        if not c.accepted and c.code not in (400, 422)
    ]
    # Hostile values the host served: accepted, admitted, Ready (the models accept them).
    served_hostile = [
        f"{c.name} {[(m.label, short(m.sets, 80)) for m in c.mutations if not m.benign]}"
        for c in cases
        if c.plural == "sandboxes"
        and any(not m.benign for m in c.mutations)
        and condition(c.final, "Ready").get("status") == "True"
    ]
    outcomes = Counter((c.plural, outcome(c)) for c in cases)
    rows = [(p, o, str(n)) for (p, o), n in sorted(outcomes.items())]
    named = sum(names_field(c) for c in cases if c.code in (400, 422))
    refused_api = sum(c.code in (400, 422) for c in cases)
    summary = [
        f"fuzz: {len(cases)} specs ({n_sandboxes} Sandboxes, {len(cases) - n_sandboxes} "
        f"SandboxScopes), {sum(bool(c.mutations) for c in cases)} with hostile values; "
        f"{len(accepted)} accepted",
        f"time: generate {generated:.0f}s, create {create_seconds:.0f}s "
        f"({len(cases) / max(create_seconds, 0.001):.0f}/s), settle {settle_seconds:.0f}s, "
        f"delete {delete_seconds:.0f}s, total {total:.0f}s",
        f"API refusals naming the field: {named}/{refused_api}",
        f"a plain Sandbox created after the fuzz: {canary}",
        f"operator restarts: {0 if alive_at_end else 1} (pid {pid}, alive after settling: "
        f"{alive_after_settle}, at the end: {alive_at_end}); tracebacks in its log: "
        f"{len(problems_in_log)} unexpected, {transient_in_log} of an API server that did "
        f"not answer (requests of this test retried for that: {OUTAGES.count})",
        f"deletable: {'all gone' if gone else f'left after {DELETE_TIMEOUT:.0f}s: {remaining}'}"
        f"; delete errors: {len(delete_errors)}; deleted again (not being deleted after the "
        f"first delete): {len(redeleted)}",
    ]
    print("\n" + table(rows, ("kind", "outcome", "specs")) + "\n" + "\n".join(summary))
    sections = [
        (
            "accepted, but the models refuse the stored spec (CRD admits what the models refuse)",
            disagreements,
        ),
        ("invalid (models or host rules) yet admitted", wrongly_served),
        ("API refusals that name no field the spec's hostile values touched", unnamed_refusals),
        ("host-rule refusals whose condition names no field", unnamed_conditions),
        ("valid and servable, yet not accepted and Ready", valid_refused),
        ("refused by the policy expected, not refused by a condition", policy_missed),
        ("unsettled after the bound", unsettled),
        ("creates that got neither 201 nor a refusal (400, 422)", failed_creates),
        (
            "models accept, API server refuses (CRD stricter than the models; not asserted)",
            stricter,
        ),
        ("unexpected errors in the operator log", problems_in_log),
        (
            "the models raised instead of refusing (not asserted unless the API server "
            "accepted the spec: then it is a disagreement above)",
            sorted(set(MODEL_CRASHES)),
        ),
        ("delete errors", delete_errors),
        (
            "hostile values the models accept, served (accepted and Ready; not asserted)",
            served_hostile,
        ),
    ]
    for title, items in sections:
        if items:
            print(f"\n== {title}: {len(items)}")
            for item in items[:40]:
                print(f"  - {item}")

    failures = [f"{title}: {len(items)}" for title, items in sections[:8] if items]
    if not canary.startswith("Ready"):
        failures.append(f"the operator is wedged: a plain Sandbox created after the fuzz {canary}")
    if not alive_at_end:
        failures.append(f"the operator died or restarted:\n{op.log()[-3000:]}")
    if problems_in_log:
        failures.append(f"unexpected errors in the operator log: {len(problems_in_log)}")
    if not gone:
        failures.append(f"not deletable within {DELETE_TIMEOUT:.0f}s: {remaining}")
    assert not failures, "\n".join(failures)
