"""docs/maf.md's "Wiring a router" example runs as written against the local cluster.

The block is taken from the page itself (the first ```python block), so the page cannot drift
from what works: it is run as a separate Python process with only ``$KUBECONFIG`` set, against an
operator serving the namespace the example names (``agents``) with the local cluster's
configuration (gVisor then runc, per-spec selection, floor hardened_container).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from tests.fixtures.cluster import REPO, TEST_LABEL
from tests.fixtures.operator import Kit, OperatorProcess, local_config

pytestmark = [pytest.mark.e2e]

#: The namespace the example's client names.
NAMESPACE = "agents"


def example_block() -> str:
    text = (REPO / "docs" / "maf.md").read_text()
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match, "docs/maf.md has no python block"
    return match.group(1)


def _gone(core: client.CoreV1Api, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            core.read_namespace(name)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        time.sleep(0.5)
    pytest.fail(f"namespace {name} still terminating after {timeout}s", pytrace=False)


@pytest.fixture
def agents_namespace(
    kubeconfig: str,
    crds: None,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
    tmp_path: Path,
) -> Iterator[OperatorProcess]:
    """The ``agents`` namespace, served by an operator with the local configuration."""
    try:
        core_v1.delete_namespace(NAMESPACE)
    except ApiException as exc:
        if exc.status != 404:
            raise
    _gone(core_v1, NAMESPACE, 120)
    core_v1.create_namespace(
        client.V1Namespace(
            metadata=client.V1ObjectMeta(name=NAMESPACE, labels={TEST_LABEL: "true"})
        )
    )
    config_path = tmp_path / "operator-config.yaml"
    config_path.write_text(yaml.safe_dump(local_config()))
    operator = OperatorProcess(config_path, NAMESPACE, tmp_path / "operator.log", kubeconfig)
    kit = Kit(custom_objects, core_v1, NAMESPACE)
    try:
        operator.start()
        yield operator
    finally:
        try:
            kit.delete_all_while_served()
        finally:
            operator.stop()
            core_v1.delete_namespace(NAMESPACE, propagation_policy="Background")


def test_the_docs_example_runs_as_written(
    agents_namespace: OperatorProcess, kubeconfig: str, tmp_path: Path
) -> None:
    script = tmp_path / "example.py"
    script.write_text(example_block())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["KUBECONFIG"] = kubeconfig
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:] + "\n" + agents_namespace.log()[-4000:]
    assert proc.stdout == "hello from __main__\n", out[-4000:]
