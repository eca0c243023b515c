"""Per-spec selection with both backends really serving: a `microvm`-floor Sandbox on the acas
stand-in and a `container`-floor Sandbox in a runc pod that runs on the node, from one operator."""

from __future__ import annotations

import pytest

from tests.fixtures.acas_operator import Acas

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_microvm_on_acas_and_container_on_runc_both_ready(acas: Acas) -> None:
    kit = acas.kit
    acas.start(acas.config(perspec_with_runc=True))
    kit.scope()
    kit.sandbox("remote-one", minIsolation="microvm")
    kit.sandbox("local-one", minIsolation="container")
    remote = acas.wait_ready("remote-one")
    local = acas.wait_ready("local-one", timeout=120)
    assert remote["status"]["backend"] == "acas"
    assert remote["status"]["servedBy"]["kind"] == "AcasSandbox"
    assert local["status"]["backend"] == "runc"
    assert local["status"]["servedBy"]["kind"] == "Pod"
    pod = kit.pod("local-one")
    assert pod is not None and pod.spec is not None and pod.status is not None
    assert pod.spec.runtime_class_name == "runc"
    assert pod.status.phase == "Running"
    assert len(acas.remote("remote-one")) == 1 and acas.remote("local-one") == []
