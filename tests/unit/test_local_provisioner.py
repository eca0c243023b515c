"""hack/local_path_provisioner.py without a cluster: the PersistentVolume built from a claim,
which claims it serves, and passes over a stand-in API (what it creates and deletes, that a
pass after a restart finds its work done or finishes it, that it never touches what is not its
own)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parents[2]
UID = "0f3c9a52-7d4e-4b1a-9c1e-2a6b5d8e9f01"
CLASS = {
    "metadata": {"name": "sandbox-local"},
    "provisioner": "sandbox-operator.dev/local-path",
    "volumeBindingMode": "Immediate",
}


@pytest.fixture(scope="module")
def lpp() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "hack_local_path_provisioner", ROOT / "hack/local_path_provisioner.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def claim(uid: str = UID, name: str = "work", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns1", "uid": uid, "resourceVersion": "42"},
        "spec": {
            "accessModes": ["ReadWriteOncePod"],
            "resources": {"requests": {"storage": "2Gi"}},
            "storageClassName": "sandbox-local",
            "volumeMode": "Filesystem",
            **spec,
        },
        "status": {"phase": "Pending"},
    }


def test_the_volume_serves_exactly_its_claim(lpp: ModuleType, tmp_path: Path) -> None:
    pv = lpp.pv_manifest(claim(), tmp_path, "node-a")
    assert pv["metadata"]["name"] == f"pvc-{UID}"
    assert pv["metadata"]["annotations"] == {
        "pv.kubernetes.io/provisioned-by": "sandbox-operator.dev/local-path"
    }
    spec = pv["spec"]
    assert spec["capacity"] == {"storage": "2Gi"}
    assert spec["accessModes"] == ["ReadWriteOncePod"]
    assert spec["persistentVolumeReclaimPolicy"] == "Delete"
    assert spec["storageClassName"] == "sandbox-local"
    assert spec["volumeMode"] == "Filesystem"
    assert spec["claimRef"] == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": "ns1",
        "name": "work",
        "uid": UID,
        "resourceVersion": "42",
    }
    assert spec["hostPath"] == {"path": str(tmp_path / f"pvc-{UID}_ns1_work"), "type": "Directory"}
    (term,) = spec["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}
    ]
    assert lpp.owned_path(pv, tmp_path) == tmp_path / f"pvc-{UID}_ns1_work"


def test_a_long_name_still_makes_a_valid_directory_name(lpp: ModuleType, tmp_path: Path) -> None:
    pvc = claim(name="n" * 253)
    pvc["metadata"]["namespace"] = "s" * 63
    path = lpp.volume_dir(tmp_path, pvc)
    assert len(path.name) == 200
    assert path.name.startswith(f"pvc-{UID}_{'s' * 63}_n")
    lpp.make_dir(path)
    assert lpp.owned_path(lpp.pv_manifest(pvc, tmp_path, "n"), tmp_path) == path


def test_a_claim_without_a_size_is_refused(lpp: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no storage size"):
        lpp.pv_manifest(claim(resources={}), tmp_path, "node-a")


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({}, None),
        ({"spec": {"storageClassName": "other"}}, "not a class of this provisioner"),
        ({"spec": {"storageClassName": None}}, "not a class of this provisioner"),
        ({"spec": {"volumeName": "pv-x"}}, "bound or binding"),
        ({"status": {"phase": "Bound"}}, "bound or binding"),
        ({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}, "being deleted"),
        ({"spec": {"volumeMode": "Block"}}, "volumeMode Block is not served (directories only)"),
        ({"spec": {"dataSource": {"kind": "VolumeSnapshot"}}}, "a data source is not served"),
    ],
)
def test_which_claims_are_served(
    lpp: ModuleType, change: dict[str, dict[str, Any]], why: str | None
) -> None:
    pvc = claim()
    for part, fields in change.items():
        pvc[part] = {**pvc[part], **fields}
    got = lpp.wants_volume(pvc, {"sandbox-local": CLASS})
    assert got == why or (why is not None and got.startswith(why))


def test_wait_for_first_consumer_waits_for_the_selected_node(lpp: ModuleType) -> None:
    classes = {"sandbox-local": {**CLASS, "volumeBindingMode": "WaitForFirstConsumer"}}
    pvc = claim()
    assert lpp.wants_volume(pvc, classes) == "waiting for a consumer"
    pvc["metadata"]["annotations"] = {"volume.kubernetes.io/selected-node": "node-a"}
    assert lpp.wants_volume(pvc, classes) is None


# --------------------------------------------------------------------------------------------
# Passes over a stand-in API


class FakeAPI:
    """The three lists and the two writes the provisioner makes, over plain dicts."""

    def __init__(self) -> None:
        self.claims: list[dict[str, Any]] = []
        self.pvs: dict[str, dict[str, Any]] = {}
        self.classes: list[dict[str, Any]] = [CLASS]
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.refuse: set[str] = set()  # names whose creation fails (422)

    def sanitize_for_serialization(self, items: Any) -> Any:
        return items

    def list_storage_class(self) -> Any:
        return SimpleNamespace(items=self.classes)

    def list_persistent_volume(self) -> Any:
        return SimpleNamespace(items=list(self.pvs.values()))

    def list_persistent_volume_claim_for_all_namespaces(self) -> Any:
        return SimpleNamespace(items=self.claims)

    def create_persistent_volume(self, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        if name in self.pvs:
            raise ApiException(status=409)
        if name in self.refuse:
            raise ApiException(status=422, reason="Invalid")
        self.created.append(name)
        self.pvs[name] = {**body, "status": {"phase": "Available"}}

    def delete_persistent_volume(self, name: str) -> None:
        if name not in self.pvs:
            raise ApiException(status=404)
        self.deleted.append(name)
        del self.pvs[name]


def provisioner(lpp: ModuleType, fake: FakeAPI, root: Path) -> Any:
    """A fresh provisioner (as after a restart) on the stand-in API."""
    prov = lpp.Provisioner.__new__(lpp.Provisioner)
    prov.core = prov.storage = prov.api = fake
    prov.root, prov.node, prov.last_ok, prov.warned = root, "node-a", 0.0, set()
    return prov


def test_a_pending_claim_gets_one_volume_and_a_writable_directory(
    lpp: ModuleType, tmp_path: Path
) -> None:
    fake = FakeAPI()
    fake.claims.append(claim())
    provisioner(lpp, fake, tmp_path).sync()
    assert fake.created == [f"pvc-{UID}"]
    directory = tmp_path / f"pvc-{UID}_ns1_work"
    assert directory.is_dir()
    assert directory.stat().st_mode & 0o777 == 0o777
    (directory / "file").write_text("kept")
    # Again, and again after a restart: nothing new, nothing lost.
    provisioner(lpp, fake, tmp_path).sync()
    provisioner(lpp, fake, tmp_path).sync()
    assert fake.created == [f"pvc-{UID}"]
    assert (directory / "file").read_text() == "kept"


def test_a_restart_between_directory_and_volume_finishes_the_work(
    lpp: ModuleType, tmp_path: Path
) -> None:
    fake = FakeAPI()
    fake.claims.append(claim())
    (tmp_path / f"pvc-{UID}_ns1_work").mkdir()  # made, then the process stopped
    provisioner(lpp, fake, tmp_path).sync()
    assert fake.created == [f"pvc-{UID}"]
    assert (tmp_path / f"pvc-{UID}_ns1_work").stat().st_mode & 0o777 == 0o777


def test_a_released_volume_loses_its_directory_then_its_object(
    lpp: ModuleType, tmp_path: Path
) -> None:
    fake = FakeAPI()
    fake.claims.append(claim())
    provisioner(lpp, fake, tmp_path).sync()
    directory = tmp_path / f"pvc-{UID}_ns1_work"
    (directory / "data").write_bytes(b"x")
    fake.claims.clear()  # the claim deleted: the PV controller marks the volume Released
    fake.pvs[f"pvc-{UID}"]["status"] = {"phase": "Released"}
    provisioner(lpp, fake, tmp_path).sync()
    assert fake.deleted == [f"pvc-{UID}"]
    assert not directory.exists()
    provisioner(lpp, fake, tmp_path).sync()  # nothing left to do
    assert fake.deleted == [f"pvc-{UID}"]


def test_what_is_not_its_own_is_left_alone(lpp: ModuleType, tmp_path: Path) -> None:
    fake = FakeAPI()
    other = tmp_path / "elsewhere"
    other.mkdir()
    # A Released volume of another provisioner, and one of ours whose path is not under root.
    fake.pvs["pv-other"] = {
        "metadata": {"name": "pv-other", "annotations": {"pv.kubernetes.io/provisioned-by": "x"}},
        "spec": {"persistentVolumeReclaimPolicy": "Delete", "hostPath": {"path": str(other)}},
        "status": {"phase": "Released"},
    }
    ours = lpp.pv_manifest(claim(uid="1" * 8 + "-1111-1111-1111-" + "1" * 12), tmp_path, "n")
    ours["spec"]["hostPath"]["path"] = str(other)
    fake.pvs[ours["metadata"]["name"]] = {**ours, "status": {"phase": "Released"}}
    (tmp_path / "notes").mkdir()  # not a volume directory
    provisioner(lpp, fake, tmp_path).sync()
    assert fake.deleted == [ours["metadata"]["name"]]  # the object; never the foreign path
    assert other.is_dir()
    assert (tmp_path / "notes").is_dir()


def test_an_orphan_directory_is_swept_but_not_a_pending_claims(
    lpp: ModuleType, tmp_path: Path
) -> None:
    fake = FakeAPI()
    orphan = tmp_path / "pvc-00000000-0000-0000-0000-000000000000_ns1_gone"
    orphan.mkdir()
    fake.claims.append(claim())
    provisioner(lpp, fake, tmp_path).sync()
    assert not orphan.exists()
    assert (tmp_path / f"pvc-{UID}_ns1_work").is_dir()


def test_a_claim_that_fails_does_not_hold_up_the_others(
    lpp: ModuleType, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeAPI()
    bad = "2" * 8 + "-2222-2222-2222-" + "2" * 12
    fake.claims += [claim(uid=bad, name="bad"), claim()]
    fake.refuse.add(f"pvc-{bad}")
    prov = provisioner(lpp, fake, tmp_path)
    prov.sync()
    prov.sync()
    assert fake.created == [f"pvc-{UID}"]
    assert prov.last_ok > 0  # the pass itself went through
    assert len([r for r in caplog.records if "claim ns1/bad: not provisioned" in r.message]) == 1
