"""The chart, the Dockerfile and the engine-less image build agree on what the image is."""

from __future__ import annotations

import re
import subprocess
import tomllib

import yaml

from tests.fixtures.chart import CHART, ROOT, one, template

DOCKERFILE = (ROOT / "operator" / "Dockerfile").read_text()
BUILD_SCRIPT = ROOT / "operator" / "build-image.sh"


def test_versions_agree() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == version
    ref = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "ref"], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert ref == f"sandbox-operator.dev/operator:{version}"
    container = one(template(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == ref


def test_both_builds_make_the_same_non_root_image() -> None:
    script = BUILD_SCRIPT.read_text()
    assert re.search(r"^USER 65532:65532$", DOCKERFILE, re.M)
    assert 'ENTRYPOINT ["sandbox-operator"]' in DOCKERFILE and 'CMD ["run"]' in DOCKERFILE
    assert "UID_GID=65532" in script and '--config.user "$UID_GID:$UID_GID"' in script
    assert "--config.entrypoint /usr/local/bin/sandbox-operator --config.cmd run" in script
    # The chart runs the image's user and passes the `run` subcommand as args.
    pod = one(template(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["containers"][0]["args"][0] == "run"
    assert "command" not in pod["containers"][0]
