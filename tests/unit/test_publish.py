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
from sandbox_operator.reconcile.publish import (
    RETRY_FIRST_SECONDS,
    RETRY_MAX_SECONDS,
    config_map,
    document_text,
    is_current,
    publication_namespaces,
    publish_until_done,
    published_backends,
)
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


def test_publication_namespaces() -> None:
    assert publication_namespaces(["a", "b", "a"], False, "ops") == ("a", "b")
    assert publication_namespaces([], True, "ops") == ("ops",)
    assert publication_namespaces([], True, None) == ()


def test_is_current_needs_the_text_and_the_label() -> None:
    body = config_map("ns", "{}")
    assert body["metadata"]["labels"] == {lbl.MANAGED_BY_LABEL: lbl.MANAGED_BY_VALUE}
    assert is_current(body, "{}")
    assert not is_current(None, "{}")
    assert not is_current(body, '{"x":1}')
    unlabelled = {"metadata": {"labels": {}}, "data": {PUBLISHED_KEY: "{}"}}
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
