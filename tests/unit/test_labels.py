"""Labels and names derived from a sandbox key and kind: label-safe, deterministic, distinct per
part."""

from __future__ import annotations

import re
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from sandbox_operator import labels, naming
from sandbox_operator.contract.models import KIND_PATTERN

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Key:
    scope: str
    thread_id: str
    agent_dir: str
    call_id: str = ""


any_text = st.text(min_size=0, max_size=300)
kinds = st.from_regex(KIND_PATTERN, fullmatch=True)


@given(any_text, any_text, any_text, any_text, kinds)
def test_label_values_fit_and_names_are_dns1123(
    scope: str, thread: str, adir: str, call: str, kind: str
):
    key = Key(scope, thread, adir, call)
    name = naming.sandbox_name(key, kind)
    for value in labels.object_labels(key, name, "gvisor", kind=kind).values():
        assert len(value) <= 63
        assert LABEL_VALUE.match(value), value
    assert naming.is_dns1123_label(name)
    # room for the objects named after it (pod, NetworkPolicy, work volume)
    assert naming.work_volume_name(name) == f"{name}-work"
    assert len(naming.work_volume_name(name)) <= 63
    assert naming.is_dns1123_label(naming.scope_name(scope, thread))


def test_originals_live_in_annotations():
    key = Key("tenant/a b", "thread:1", "agents/Research Bot", "c-1")
    ann = labels.key_annotations(key)
    assert ann[labels.SCOPE_ANNOTATION] == "tenant/a b"
    assert ann[labels.THREAD_ANNOTATION] == "thread:1"
    assert ann[labels.AGENT_DIR_ANNOTATION] == "agents/Research Bot"
    assert ann[labels.CALL_ANNOTATION] == "c-1"


def test_parts_are_domain_separated_and_length_prefixed():
    a = labels.key_labels(Key("x", "x", "x"), "x")
    assert a[labels.SCOPE_LABEL] != a[labels.THREAD_LABEL]
    assert labels.conversation_value("ab", "c") != labels.conversation_value("a", "bc")
    assert labels.key_value(Key("a", "b", "c", "")) != labels.key_value(Key("a", "b", "", "c"))


def test_names_are_deterministic_and_key_and_kind_sensitive():
    k1 = Key("s", "t", "agents/coder")
    assert naming.sandbox_name(k1, "py") == naming.sandbox_name(Key("s", "t", "agents/coder"), "py")
    assert naming.sandbox_name(k1, "py").startswith("sbx-agents-coder-py-")
    others = {
        naming.sandbox_name(Key("s2", "t", "agents/coder"), "py"),
        naming.sandbox_name(Key("s", "t2", "agents/coder"), "py"),
        naming.sandbox_name(Key("s", "t", "agents/coder", "call-1"), "py"),
        naming.sandbox_name(k1, "py"),
        naming.sandbox_name(k1, "shell"),
        # a kind's readable slug is cut short: the hash still tells kinds apart
        naming.sandbox_name(k1, "python-data-a"),
        naming.sandbox_name(k1, "python-data-b"),
    }
    assert len(others) == 7


def test_two_kinds_under_one_key_are_two_sandboxes_with_one_key_label():
    """maf-sandbox's identity is (key, kind): each kind gets its own Sandbox (and so its own pod,
    NetworkPolicy and work volume), while the key label still selects every kind of the key."""
    key = Key("tenant", "thread", "agents/coder")
    py, sh = naming.sandbox_name(key, "python"), naming.sandbox_name(key, "shell")
    assert py != sh
    assert naming.pod_name(py) != naming.pod_name(sh)
    assert naming.work_volume_name(py) != naming.work_volume_name(sh)
    lp = labels.object_labels(key, py, "gvisor", kind="python")
    ls = labels.object_labels(key, sh, "gvisor", kind="shell")
    assert lp[labels.KEY_LABEL] == ls[labels.KEY_LABEL]
    assert (lp[labels.KIND_LABEL], ls[labels.KIND_LABEL]) == ("python", "shell")
    whole_key = selector_of(labels.key_selector(key))
    assert matches(whole_key, lp) and matches(whole_key, ls)
    just_python = selector_of(labels.identity_selector(key, "python"))
    assert matches(just_python, lp) and not matches(just_python, ls)


def selector_of(selector: str) -> dict[str, str]:
    return dict(p.split("=", 1) for p in selector.split(","))


def matches(selector: dict[str, str], labelled: dict[str, str]) -> bool:
    return all(labelled.get(k) == v for k, v in selector.items())


def test_scope_selector_matches_key_labels_of_that_conversation_only():
    mine = labels.key_labels(Key("s", "t", "a"), "k")
    mine_other_agent = labels.key_labels(Key("s", "t", "b", "c"), "other-kind")
    other = labels.key_labels(Key("s", "t2", "a"), "k")
    selector = dict(p.split("=", 1) for p in labels.scope_selector("s", "t").split(","))
    for lab in (mine, mine_other_agent):
        assert all(lab[k] == v for k, v in selector.items())
    assert not all(other.get(k) == v for k, v in selector.items())


def test_key_selector_and_sandbox_selector():
    key = Key("s", "t", "a")
    name = naming.sandbox_name(key, "k")
    lab = labels.object_labels(key, name, kind="k")
    for sel in (
        labels.key_selector(key),
        labels.identity_selector(key, "k"),
        labels.sandbox_selector(name),
    ):
        for part in sel.split(","):
            k, v = part.split("=", 1)
            assert lab[k] == v


def test_long_or_dotted_sandbox_names_get_a_short_object_name():
    long = "a" * 100
    assert naming.is_dns1123_label(naming.object_name(long))
    assert naming.is_dns1123_label(naming.object_name("my.sandbox"))
    assert naming.object_name("short-one") == "short-one"
    assert naming.object_name(long) == naming.object_name(long)
