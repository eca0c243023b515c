"""The client installs alone: an agent process that only acquires sandboxes gets the client and
the contract from the base install, without the operator's dependencies (kopf, the sync
`kubernetes` client, prometheus_client) or the ACA backend's credentials (azure-identity).

One fresh venv for the module: the base install of this repository, then only the test runner,
and the client's own unit tests run there against the installed package (not src/).
"""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OPERATOR_ONLY = ("kopf", "kubernetes", "azure-identity", "prometheus_client")
CLIENT_TESTS = sorted(
    str(p.relative_to(REPO))
    for pattern in ("test_client_*.py", "test_hosttools_*.py")
    for p in (REPO / "tests" / "unit").glob(pattern)
    if p.name != Path(__file__).name
)

pytestmark = pytest.mark.slow


def _run(*argv: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    # Without the caller's PYTHONPATH: a run with the checkout's src/ on it would import that
    # instead of the package installed in the venv, which is what is being tested.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=600, env=env
    )


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("base-install")
    venv.EnvBuilder(with_pip=True).create(root / "venv")
    python = root / "venv" / "bin" / "python"
    pip = (python, "-m", "pip", "install", "-q", "--disable-pip-version-check")
    done = _run(*pip, REPO, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    return python


def test_the_base_install_has_none_of_the_operators_dependencies(base_venv: Path) -> None:
    for dist in OPERATOR_ONLY:
        shown = _run(base_venv, "-m", "pip", "show", dist)
        assert shown.returncode != 0, f"{dist} is installed by the base install"
    shown = _run(base_venv, "-m", "pip", "show", "sandbox-operator")
    assert shown.returncode == 0 and "Name: sandbox-operator" in shown.stdout


def test_the_client_imports_without_them(base_venv: Path) -> None:
    probe = (
        "import sys, sandbox_operator.client, sandbox_operator.client.sync;"
        "import sandbox_operator.testing;"
        "banned = {'kopf', 'kubernetes', 'azure', 'prometheus_client'};"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & banned);"
        "print(sandbox_operator.client.__file__);"
        "assert not loaded, loaded"
    )
    done = _run(base_venv, "-c", probe, cwd=REPO.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "site-packages" in done.stdout  # the installed package, not the checkout's src/


def test_the_clients_unit_tests_pass_on_the_base_install(base_venv: Path) -> None:
    tools = _run(
        base_venv, "-m", "pip", "install", "-q", "--disable-pip-version-check",
        "pytest>=8", "pytest-asyncio>=0.23", "hypothesis>=6",
    )  # fmt: skip
    assert tools.returncode == 0, tools.stderr[-2000:]
    assert CLIENT_TESTS, "no client unit tests found"
    done = _run(base_venv, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CLIENT_TESTS)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-2000:])
    assert " passed" in done.stdout and " failed" not in done.stdout


def test_the_operator_extra_carries_what_kopfs_login_needs() -> None:
    """kopf.login_via_client (the operator's login, metrics/kopf_session.py) reads credentials
    through the sync ``kubernetes`` client: an image built from the operator extra without it
    crash-loops with kopf's "Ran out of valid credentials" (seen 2026-12-07)."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0].split("[")[0].strip() for d in
             project["optional-dependencies"]["operator"]}  # fmt: skip
    assert {"kopf", "kubernetes"} <= names, names
