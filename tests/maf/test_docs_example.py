"""docs/maf.md's "Wiring a router" example, run as a new user runs it: against the installs the
page names, never an operator the test started for itself.

* **A plain `helm install`** of the chart: its defaults (every namespace served, peering on),
  with the configuration of examples/config-local.yaml (the floor lowered to gVisor, as on any
  cluster without microVMs), as docs/maf.md says.
* **`make up`** (hack/up.sh, run as the Makefile runs it): every namespace but the test suite's
  ``t-*``.

Each time the user creates the namespace the example names (``agents``) and runs the page's
first ```python block unchanged as its own process, with only ``$KUBECONFIG`` set: the operator
serving that namespace and the backends document it publishes there are the install's own. With
`make up`'s install, a Sandbox in a namespace it does not serve is refused at admission, naming
what is served. The module restores what it found: `make up`'s release stays if it was there
(``KEEP_CLUSTER=1 make down`` otherwise).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from tests.fixtures.chart import helm_binary
from tests.fixtures.cluster import REPO, TEST_LABEL

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.exclusive]

#: The namespace the example's client names.
NAMESPACE = "agents"
RELEASE = "sandbox-operator"
RELEASE_NAMESPACE = "sandbox-operator-system"


def example_block() -> str:
    text = (REPO / "docs" / "maf.md").read_text()
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match, "docs/maf.md has no python block"
    return match.group(1)


def _run(args: list[str], *, timeout: float = 900, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env, check=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(args[:3])} failed ({proc.returncode}):\n{out[-6000:]}"
    return out


class Installs:
    """The two installs, one at a time, in the one release name and namespace they share."""

    def __init__(self, kubeconfig: str, core: client.CoreV1Api, tmp: Path) -> None:
        self.kubeconfig = kubeconfig
        self.core = core
        self.tmp = tmp
        self.env = dict(os.environ, KUBECONFIG=kubeconfig)
        self.helm = [helm_binary(), "--kubeconfig", kubeconfig]

    def installed(self) -> bool:
        status = subprocess.run(
            [*self.helm, "status", RELEASE, "-n", RELEASE_NAMESPACE],
            capture_output=True,
            check=False,
        )
        return status.returncode == 0

    def uninstall(self) -> None:
        self.drop_namespace(NAMESPACE)  # while its operator runs: finalizers are honoured
        if self.installed():
            _run([*self.helm, "uninstall", RELEASE, "-n", RELEASE_NAMESPACE, "--wait"])

    def plain_helm_install(self) -> None:
        """`helm install` with the chart's defaults and the local configuration (the image
        imported as docs/install.md says for a cluster without a registry)."""
        _run(["bash", "operator/build-image.sh", "import"], env=self.env)
        values = self.tmp / "values-local.yaml"
        config = yaml.safe_load((REPO / "examples" / "config-local.yaml").read_text())
        values.write_text(yaml.safe_dump({"config": config}))
        _run(
            [*self.helm, "install", RELEASE, "charts/sandbox-operator", "-n", RELEASE_NAMESPACE,
             "--create-namespace", "--values", str(values), "--set", "config.egressProxy.image="
             "sandbox-operator.dev/operator:0.1.0", "--wait", "--timeout", "5m",
             # The test cluster's CRDs were applied by the suite, not by a release: adopt them
             # (on a fresh cluster a plain install creates them).
             "--take-ownership"],
        )  # fmt: skip

    def make_up(self) -> str:
        """What `make up` runs once its virtualenv is there (the Makefile's `up` target)."""
        return _run(["bash", "hack/up.sh"], env=self.env)

    def make_down(self) -> None:
        _run(["bash", "hack/down.sh"], env=dict(self.env, KEEP_CLUSTER="1"))

    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        self.drop_namespace(name)
        self.core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))
        )

    def drop_namespace(self, name: str, timeout: float = 180) -> None:
        try:
            self.core.delete_namespace(name)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.core.read_namespace(name)
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise
            time.sleep(0.5)
        pytest.fail(f"namespace {name} still terminating after {timeout}s", pytrace=False)

    def run_example(self) -> subprocess.CompletedProcess[str]:
        script = self.tmp / "example.py"
        script.write_text(example_block())
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        env["KUBECONFIG"] = self.kubeconfig
        return subprocess.run(
            [sys.executable, "-W", "ignore", str(script)],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=self.tmp,
            env=env,
            check=False,
        )

    def operator_log(self) -> str:
        """The last lines of the installed operator's log, for a failure's message."""
        pods = self.core.list_namespaced_pod(
            RELEASE_NAMESPACE, label_selector="app.kubernetes.io/name=sandbox-operator"
        ).items
        return "\n".join(
            self.core.read_namespaced_pod_log(p.metadata.name, RELEASE_NAMESPACE, tail_lines=60)
            for p in pods
        )


@pytest.fixture(scope="module")
def installs(
    kubeconfig: str, crds: None, core_v1: client.CoreV1Api, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installs]:
    it = Installs(kubeconfig, core_v1, tmp_path_factory.mktemp("installs"))
    had_make_up = it.installed()
    try:
        yield it
    finally:
        it.drop_namespace(NAMESPACE)
        if had_make_up:
            if not it.installed():
                it.make_up()
        else:
            it.make_down()


def _assert_example_ran(it: Installs) -> None:
    proc = it.run_example()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:] + "\n--- operator:\n" + it.operator_log()
    assert proc.stdout == "hello from __main__\n", out[-4000:]


def test_after_a_plain_helm_install(installs: Installs) -> None:
    installs.uninstall()
    installs.plain_helm_install()
    installs.create_namespace(NAMESPACE)
    _assert_example_ran(installs)
    installs.uninstall()


def test_after_make_up(installs: Installs, core_v1: client.CoreV1Api) -> None:
    installs.make_up()
    installs.create_namespace(NAMESPACE)
    _assert_example_ran(installs)


def test_a_sandbox_where_make_up_serves_nothing_is_refused_at_once(
    installs: Installs, custom_objects: client.CustomObjectsApi
) -> None:
    """`make up` leaves the test suite's t-* namespaces to the tests' own operators: one of them
    without the served-by label is served by no operator, and a Sandbox there is refused at its
    create, with a message naming what the release serves."""
    if not installs.installed():
        installs.make_up()
    name = f"t-unserved-{uuid.uuid4().hex[:6]}"
    installs.create_namespace(name, labels={TEST_LABEL: "true"})
    try:
        sandbox = yaml.safe_load((REPO / "examples" / "sandbox.yaml").read_text())
        started = time.monotonic()
        with pytest.raises(ApiException) as refused:
            custom_objects.create_namespaced_custom_object(
                "sandbox-operator.dev", "v1alpha1", name, "sandboxes", sandbox
            )
        print(f"refused in {time.monotonic() - started:.3f}s")
        assert refused.value.status == 422 or refused.value.status == 403, refused.value.body
        body = str(refused.value.body)
        assert f"namespace {name} is not served by any sandbox-operator" in body, body
        assert "every namespace except those matching t-*" in body, body
    finally:
        installs.drop_namespace(name)
