"""The published backends document (reconcile/publish.py): derived from the validated
configuration only, written only when it differs, retried with backoff and never raised."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from sandbox_operator import labels as lbl
from sandbox_operator.config import parse_config, profiles
from sandbox_operator.contract.published import PUBLISHED_KEY, PublishedBackends
from sandbox_operator.reconcile.namespaces import ServedNamespaces
from sandbox_operator.reconcile.publish import (
    RETRY_FIRST_SECONDS,
    RETRY_MAX_SECONDS,
    Pending,
    config_map,
    document_text,
    follow_namespaces,
    is_current,
    publish_until_done,
    published_backends,
)
from sandbox_operator.views import ConfigMapView, NamespaceView
from tests.fixtures.operator import local_config


def _config(**kw: Any) -> Any:
    return parse_config(local_config(**kw))[0]


def test_document_is_the_configs_policy_and_backends_in_order() -> None:
    config = _config(floor="container", selection="perSpec")
    raw = json.loads(document_text(published_backends(config)))
    # The wire spelling is camelCase, as in the operator's own configuration file.
    assert raw["hostPolicy"]["minIsolation"] == "container"
    assert raw["hostPolicy"]["selection"] == "perSpec"
    assert [(b["name"], b["type"], b["isolation"]) for b in raw["backends"]] == [
        ("gvisor", "runtimeClass", "hardened_container"),
        ("runc", "runtimeClass", "container"),
    ]
    assert set(raw["backends"][0]["declarations"]) >= {"capabilities", "egressModes"}
    # A reader gets back exactly the configuration's models.
    doc = PublishedBackends.model_validate_json(document_text(published_backends(config)))
    assert doc.host_policy == config.host_policy
    assert [b.declarations for b in doc.backends] == [b.declarations for b in config.backends]


def test_document_is_what_admission_holds_backends_to() -> None:
    """Each backend as published is the profile admission judges it by (name, rung,
    declarations, in the order perSpec selection walks), under the same host policy: a reader
    never learns more, or other, than the operator enforces."""
    for config in (_config(), _config(floor="container", selection="perSpec")):
        doc = PublishedBackends.model_validate_json(document_text(published_backends(config)))
        judged = profiles(config)
        assert [(b.name, b.isolation, b.declarations) for b in doc.backends] == [
            (p.name, p.isolation, p.declarations) for p in judged
        ]
        assert doc.host_policy == config.host_policy


def test_document_follows_the_configuration() -> None:
    pinned = _config(floor="hardened_container", selection="fixed", pinned="gvisor")
    doc = published_backends(pinned)
    assert doc.host_policy.pinned_backend == "gvisor"
    assert document_text(doc) != document_text(published_backends(_config()))
    # Deterministic: the same configuration gives the same text (a restart writes nothing).
    assert document_text(doc) == document_text(published_backends(pinned))


@pytest.mark.parametrize(
    ("namespaces", "all_namespaces", "exact", "served", "not_served"),
    [
        (["a", "b", "a"], False, ("a", "b"), ["a", "b"], ["c", "ab"]),
        ([], True, None, ["a", "kube-system", "t-x"], []),
        (["!t-*"], False, None, ["agents", "default", "tx"], ["t-x", "t-"]),
        (["!t-*,!kube-*"], False, None, ["agents"], ["t-x", "kube-system"]),
        (["team-*", "ops"], False, None, ["team-a", "ops"], ["opsx", "team"]),
        (["team-?"], False, None, ["team-a"], ["team-ab"]),
    ],
)
def test_served_namespaces_are_kopfs(
    namespaces: list[str],
    all_namespaces: bool,
    exact: tuple[str, ...] | None,
    served: list[str],
    not_served: list[str],
) -> None:
    """What the operator publishes into is what kopf serves: plain names exactly, patterns (and
    all namespaces) by kopf's matching, namespace by namespace."""
    scope = ServedNamespaces.of(namespaces, all_namespaces)
    assert scope.exact == exact
    assert [n for n in served if scope.serves(n)] == served
    assert [n for n in not_served if scope.serves(n)] == []


def _namespace(name: str, phase: str = "Active") -> NamespaceView:
    return NamespaceView({"metadata": {"name": name}, "status": {"phase": phase}})


async def test_the_namespace_watch_wants_each_served_live_namespace() -> None:
    """Serving all but ``t-*``: a list wants every served namespace that is not terminating and
    forgets one no longer there; a new namespace is wanted, a deleted or terminating one is
    forgotten, an ignored one never wanted; the worker publishes what is wanted, once each."""
    written: list[str] = []

    async def publish(namespace: str, text: str) -> bool:
        written.append(namespace)
        return True

    pending = Pending(publish, "{}")
    pending.current.add("stale")  # published before; gone from the next list
    listed, changed = follow_namespaces(pending, ServedNamespaces.of(["!t-*"], False))
    listed([_namespace("default"), _namespace("t-1"), _namespace("old", "Terminating")])
    assert pending.known() == {"default"}
    changed("ADDED", _namespace("agents"))
    changed("ADDED", _namespace("t-2"))
    changed("ADDED", _namespace("gone"))
    changed("DELETED", _namespace("gone"))
    changed("MODIFIED", _namespace("dying"))
    changed("MODIFIED", _namespace("dying", "Terminating"))
    await pending.work(until_empty=True)
    assert written == ["default", "agents"]
    assert pending.current == {"default", "agents"}
    changed("MODIFIED", _namespace("agents"))  # a label changed: already current
    assert pending.known() == {"default", "agents"}
    await pending.work(until_empty=True)
    assert written == ["default", "agents"]


async def test_a_namespace_forgotten_while_it_is_written_is_not_current() -> None:
    pending: Pending

    async def publish(namespace: str, text: str) -> bool:
        pending.forget(namespace)  # deleted while the apply was in flight
        return True

    pending = Pending(publish, "{}")
    pending.want("a")
    await pending.work(until_empty=True)
    assert pending.known() == set()


def test_is_current_needs_the_text_and_the_label() -> None:
    body = config_map("ns", "{}")
    assert body["metadata"]["labels"] == {lbl.MANAGED_BY_LABEL: lbl.MANAGED_BY_VALUE}
    assert is_current(ConfigMapView(body), "{}")
    assert not is_current(None, "{}")
    assert not is_current(ConfigMapView(body), '{"x":1}')
    unlabelled = ConfigMapView({"metadata": {"labels": {}}, "data": {PUBLISHED_KEY: "{}"}})
    assert not is_current(unlabelled, "{}")


async def test_failures_are_retried_with_backoff_and_never_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []
    sleeps: list[float] = []
    failures = {"b": 7}

    async def publish(namespace: str, text: str) -> bool:
        calls.append(namespace)
        if failures.get(namespace, 0) > 0:
            failures[namespace] -= 1
            raise RuntimeError("api server unreachable")
        return True

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    with caplog.at_level(logging.ERROR):
        await publish_until_done(publish, ["a", "b"], "{}", sleep=sleep)
    # "a" succeeds once and is not written again; "b" is retried until it succeeds.
    assert calls.count("a") == 1 and calls.count("b") == 8
    assert sleeps[0] == RETRY_FIRST_SECONDS
    assert sleeps == sorted(sleeps) and max(sleeps) == RETRY_MAX_SECONDS
    assert "namespace b failed (RuntimeError)" in caplog.text
    assert "unreachable" not in caplog.text  # the error's message is not logged
