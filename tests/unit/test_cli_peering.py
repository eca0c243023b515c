"""The peering identity is the pod's: a restarted container does not pause on its own record.

kopf pauses an operator that sees a live peering record with its own priority. A container
restarted after SIGKILL derives the same priority from the same pod name, and finds its dead
predecessor's record still within its lifetime. These tests feed kopf's own peering logic such a
record (no cluster) and show that it pauses with a per-process identity and does not with the
pod's.
"""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path
from typing import Any

import kopf
import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._core.engines import peering

from sandbox_operator import cli, config


def test_identity_is_the_pods_when_in_a_pod(
    monkeypatch: pytest.MonkeyPatch, outside_a_pod: Path
) -> None:
    monkeypatch.setenv("POD_NAME", "sandbox-operator-7d4b9c-x2x4q")
    monkeypatch.setenv("POD_NAMESPACE", "sandbox-system")
    assert cli._peering_identity() == "sandbox-system/sandbox-operator-7d4b9c-x2x4q"
    # The same for every process of the pod, as the priority derived from the pod name is.
    assert cli._peering_identity() == cli._peering_identity()
    # A process of a pod without POD_NAMESPACE: its service account's namespace.
    monkeypatch.delenv("POD_NAMESPACE")
    outside_a_pod.write_text("from-the-token\n")
    config.operator_namespace.cache_clear()
    assert cli._peering_identity() == "from-the-token/sandbox-operator-7d4b9c-x2x4q"
    # Neither (POD_NAME set by hand): the pod name alone.
    outside_a_pod.unlink()
    config.operator_namespace.cache_clear()
    assert cli._peering_identity() == "sandbox-operator-7d4b9c-x2x4q"


def test_outside_a_pod_kopf_keeps_its_per_process_identity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("POD_NAME", raising=False)
    assert cli._peering_identity() is None


async def _pauses(own_identity: str, predecessor: str, priority: int) -> bool:
    """Whether kopf's peering pauses an operator that finds ``predecessor``'s record (same
    priority, last seen a second ago: SIGKILLed, its 60 s not run out)."""
    settings = kopf.OperatorSettings()
    settings.peering.name = "sandbox-operator"
    settings.peering.priority = priority
    lastseen = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=1)
    status: dict[str, Any] = {
        predecessor: {"priority": priority, "lifetime": 60, "lastseen": lastseen.isoformat()}
    }
    event: Any = {
        "type": "MODIFIED",
        "object": {"metadata": {"name": "sandbox-operator"}, "status": status},
    }
    conflicts = aiotoggles.Toggle()
    woken = asyncio.Event()
    woken.set()  # never sleep out the record's lifetime here
    await peering.process_peering_event(
        raw_event=event,
        namespace=None,
        resource=None,  # type: ignore[arg-type]  # used only to clean dead records: none here
        identity=peering.Identity(own_identity),
        settings=settings,
        autoclean=False,
        stream_pressure=woken,
        conflicts_found=conflicts,
    )
    return conflicts.is_on()


async def test_a_restarted_process_does_not_pause_on_its_dead_predecessor(
    monkeypatch: pytest.MonkeyPatch, outside_a_pod: Path
) -> None:
    monkeypatch.setenv("POD_NAME", "sandbox-operator-7d4b9c-x2x4q")
    monkeypatch.setenv("POD_NAMESPACE", "sandbox-system")
    priority = cli._default_priority()
    identity = cli._peering_identity()
    assert identity is not None
    # The predecessor wrote its record under the same (pod) identity: the record is our own.
    assert not await _pauses(identity, identity, priority)
    # What kopf's per-process identity did: two identities, one priority -> paused.
    old, new = peering.detect_own_id(manual=False), peering.detect_own_id(manual=False)
    assert old != new
    assert await _pauses(new, old, priority)
