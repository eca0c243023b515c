"""Labels and names derived from a sandbox key: label-safe, deterministic, distinct per part."""

from __future__ import annotations

import re
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from sandbox_operator import labels, naming

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Key:
    scope: str
    thread_id: str
    agent_dir: str
    call_id: str = ""


any_text = st.text(min_size=0, max_size=300)


@given(any_text, any_text, any_text, any_text)
def test_label_values_fit_and_names_are_dns1123(scope: str, thread: str, adir: str, call: str):
    key = Key(scope, thread, adir, call)
    for value in labels.object_labels(key, naming.sandbox_name(key), "gvisor").values():
        assert len(value) <= 63
        assert LABEL_VALUE.match(value), value
    name = naming.sandbox_name(key)
    assert naming.is_dns1123_label(name)
    assert naming.is_dns1123_label(naming.scope_name(scope, thread))


def test_originals_live_in_annotations():
    key = Key("tenant/a b", "thread:1", "agents/Research Bot", "c-1")
    ann = labels.key_annotations(key)
    assert ann[labels.SCOPE_ANNOTATION] == "tenant/a b"
    assert ann[labels.THREAD_ANNOTATION] == "thread:1"
    assert ann[labels.AGENT_DIR_ANNOTATION] == "agents/Research Bot"
    assert ann[labels.CALL_ANNOTATION] == "c-1"


def test_parts_are_domain_separated_and_length_prefixed():
    a = labels.key_labels(Key("x", "x", "x"))
    assert a[labels.SCOPE_LABEL] != a[labels.THREAD_LABEL]
    assert labels.conversation_value("ab", "c") != labels.conversation_value("a", "bc")
    assert labels.key_value(Key("a", "b", "c", "")) != labels.key_value(Key("a", "b", "", "c"))


def test_names_are_deterministic_and_key_sensitive():
    k1 = Key("s", "t", "agents/coder")
    assert naming.sandbox_name(k1) == naming.sandbox_name(Key("s", "t", "agents/coder"))
    assert naming.sandbox_name(k1).startswith("sbx-agents-coder-")
    others = {
        naming.sandbox_name(Key("s2", "t", "agents/coder")),
        naming.sandbox_name(Key("s", "t2", "agents/coder")),
        naming.sandbox_name(Key("s", "t", "agents/coder", "call-1")),
        naming.sandbox_name(k1),
    }
    assert len(others) == 4


def test_scope_selector_matches_key_labels_of_that_conversation_only():
    mine = labels.key_labels(Key("s", "t", "a"))
    mine_other_agent = labels.key_labels(Key("s", "t", "b", "c"))
    other = labels.key_labels(Key("s", "t2", "a"))
    selector = dict(p.split("=", 1) for p in labels.scope_selector("s", "t").split(","))
    for lab in (mine, mine_other_agent):
        assert all(lab[k] == v for k, v in selector.items())
    assert not all(other.get(k) == v for k, v in selector.items())


def test_key_selector_and_sandbox_selector():
    key = Key("s", "t", "a")
    name = naming.sandbox_name(key)
    lab = labels.object_labels(key, name)
    for sel in (labels.key_selector(key), labels.sandbox_selector(name)):
        for part in sel.split(","):
            k, v = part.split("=", 1)
            assert lab[k] == v


def test_long_or_dotted_sandbox_names_get_a_short_object_name():
    long = "a" * 100
    assert naming.is_dns1123_label(naming.object_name(long))
    assert naming.is_dns1123_label(naming.object_name("my.sandbox"))
    assert naming.object_name("short-one") == "short-one"
    assert naming.object_name(long) == naming.object_name(long)
