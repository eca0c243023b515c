#!/usr/bin/env python3
"""The local cluster's dynamic volume provisioner: directories on this machine as volumes.

    local_path_provisioner.py --kubeconfig PATH --root DIR --node NAME [--health-port N]

Started by `hack/cluster.py up` as one of the cluster's processes (docs/cluster.md, "Volumes").
It serves StorageClasses whose provisioner is `sandbox-operator.dev/local-path`:

* a Pending PersistentVolumeClaim of such a class gets a directory `DIR/pvc-<uid>_<ns>_<name>`
  (mode 0777: see `make_dir`) and a PersistentVolume `pvc-<uid>` pre-bound to it (`claimRef`):
  a `hostPath` volume of that directory, capacity = the request, the claim's access modes,
  reclaim policy Delete, node affinity to the one node. kube-controller-manager's PV controller
  then binds the claim to it;
* a PersistentVolume it provisioned that is Released (its claim deleted) with reclaim policy
  Delete loses its directory, then the object.

Every pass reads the claims, volumes and classes from the API server and acts on what it finds
(nothing is kept in memory between passes), so a restart picks up where the last one stopped.
A pass runs on every change the watches see and every RESYNC seconds. Not for production: one
node, no capacity enforcement (the size is a label), data in the cluster's state directory.
"""

from __future__ import annotations

import argparse
import http.server
import logging
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

PROVISIONER = "sandbox-operator.dev/local-path"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
# Set on a claim by the scheduler when its class binds on first consumer.
SELECTED_NODE = "volume.kubernetes.io/selected-node"
# Seconds between full passes when nothing changes (a missed event is caught by the next one).
RESYNC = 30.0
# /healthz answers ok while the last successful pass is at most this old.
HEALTHY_WITHIN = 3 * RESYNC
DIR_PATTERN = re.compile(r"^pvc-[0-9a-f-]{36}_")

log = logging.getLogger("local-path-provisioner")


# --------------------------------------------------------------------------------------------
# Pure parts: what to do, given the objects (plain dicts, as the API server returns them)


def pv_name(pvc: dict[str, Any]) -> str:
    return f"pvc-{pvc['metadata']['uid']}"


def volume_dir(root: Path, pvc: dict[str, Any]) -> Path:
    """The claim's directory: unique by uid, readable by namespace and name (cut to 200
    characters: a claim's name alone may have 253, a file name at most 255 bytes)."""
    meta = pvc["metadata"]
    return root / f"{pv_name(pvc)}_{meta['namespace']}_{meta['name']}"[:200]


def wants_volume(pvc: dict[str, Any], classes: dict[str, dict[str, Any]]) -> str | None:
    """Why this claim gets no volume from us now (None: provision it). `classes` are the
    StorageClasses of this provisioner, by name."""
    meta, spec = pvc["metadata"], pvc.get("spec") or {}
    if meta.get("deletionTimestamp"):
        return "being deleted"
    if spec.get("volumeName") or (pvc.get("status") or {}).get("phase", "Pending") != "Pending":
        return "bound or binding"
    storage_class = classes.get(spec.get("storageClassName") or "")
    if storage_class is None:
        return "not a class of this provisioner"
    on_first_consumer = storage_class.get("volumeBindingMode") == "WaitForFirstConsumer"
    if on_first_consumer and SELECTED_NODE not in (meta.get("annotations") or {}):
        return "waiting for a consumer"
    if spec.get("volumeMode", "Filesystem") != "Filesystem":
        return "volumeMode Block is not served (directories only)"
    if spec.get("dataSource") or spec.get("dataSourceRef"):
        return "a data source is not served (empty volumes only)"
    return None


def pv_manifest(pvc: dict[str, Any], root: Path, node: str) -> dict[str, Any]:
    """The PersistentVolume that serves `pvc`: its directory under `root`, on `node`."""
    meta, spec = pvc["metadata"], pvc["spec"]
    size = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
    if not size:
        raise ValueError(f"claim {meta['namespace']}/{meta['name']} requests no storage size")
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": pv_name(pvc),
            "annotations": {PROVISIONED_BY: PROVISIONER},
            "labels": {"sandbox-operator.dev/cluster": "local"},
        },
        "spec": {
            "capacity": {"storage": size},
            "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": spec["storageClassName"],
            "volumeMode": "Filesystem",
            # Pre-bound: the PV controller binds this claim (and only it) to the volume.
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            # `Directory`, not `DirectoryOrCreate`: a directory gone from under the volume fails
            # the pod's mount loudly instead of being recreated root-owned (unwritable).
            "hostPath": {"path": str(volume_dir(root, pvc)), "type": "Directory"},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [node],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }


def ours(pv: dict[str, Any]) -> bool:
    return (pv["metadata"].get("annotations") or {}).get(PROVISIONED_BY) == PROVISIONER


def to_reclaim(pv: dict[str, Any]) -> bool:
    """A volume of ours whose claim is gone and whose data goes with it."""
    return (
        ours(pv)
        and not pv["metadata"].get("deletionTimestamp")
        and (pv.get("status") or {}).get("phase") in ("Released", "Failed")
        and (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") == "Delete"
    )


def owned_path(pv: dict[str, Any], root: Path) -> Path | None:
    """The volume's directory when it is one of ours under `root` (never anything else)."""
    raw = ((pv.get("spec") or {}).get("hostPath") or {}).get("path")
    if not raw:
        return None
    path = Path(raw)
    if path.parent != root or not DIR_PATTERN.match(path.name):
        return None
    return path


# --------------------------------------------------------------------------------------------
# Effects


def make_dir(path: Path) -> None:
    """Mode 0777 (set after mkdir, past the umask): the provisioner cannot know the uid or gid of
    every pod that will mount the volume (a claim outlives its first pod), and the kubelet
    applies no fsGroup to hostPath volumes, so any uid must be able to write."""
    path.mkdir(parents=False, exist_ok=True)
    path.chmod(0o777)


class Provisioner:
    def __init__(self, api: client.ApiClient, root: Path, node: str) -> None:
        self.core = client.CoreV1Api(api)
        self.storage = client.StorageV1Api(api)
        self.api = api
        self.root = root
        self.node = node
        self.last_ok = 0.0
        self.warned: set[tuple[str, str]] = (
            set()
        )  # only so that a warning is not repeated every pass

    def warn(self, what: str, uid: str) -> None:
        if (uid, what) not in self.warned:
            self.warned.add((uid, what))
            log.warning("%s", what)

    def _list(self, call: Callable[..., Any]) -> list[dict[str, Any]]:
        items = self.api.sanitize_for_serialization(call().items)  # type: ignore[no-untyped-call]
        return list(items)

    def sync(self) -> None:
        """One pass: provision what is pending, reclaim what is released, sweep orphans."""
        classes = {
            sc["metadata"]["name"]: sc
            for sc in self._list(self.storage.list_storage_class)
            if sc.get("provisioner") == PROVISIONER
        }
        pvs = {pv["metadata"]["name"]: pv for pv in self._list(self.core.list_persistent_volume)}
        claims = self._list(self.core.list_persistent_volume_claim_for_all_namespaces)
        keep = {p for pv in pvs.values() if ours(pv) and (p := owned_path(pv, self.root))}
        for pvc in claims:
            meta = pvc["metadata"]
            claim = f"claim {meta['namespace']}/{meta['name']}"
            why = wants_volume(pvc, classes)
            if why is not None:
                if why.startswith("volumeMode") or why.startswith("a data source"):
                    self.warn(f"{claim}: {why}", meta["uid"])
                continue
            keep.add(volume_dir(self.root, pvc))
            if pv_name(pvc) not in pvs:
                try:
                    self.provision(pvc)
                except (ApiException, OSError, ValueError) as exc:  # the others still go on
                    self.warn(f"{claim}: not provisioned: {type(exc).__name__}: {exc}", meta["uid"])
        for pv in pvs.values():
            if to_reclaim(pv):
                try:
                    self.reclaim(pv)
                except ApiException as exc:
                    self.warn(f"volume {pv['metadata']['name']}: not deleted: {exc}", "")
        self.sweep(keep)
        self.last_ok = time.monotonic()

    def provision(self, pvc: dict[str, Any]) -> None:
        meta = pvc["metadata"]
        started = time.monotonic()
        body: Any = pv_manifest(pvc, self.root, self.node)  # the client takes plain dicts too
        make_dir(volume_dir(self.root, pvc))
        try:
            self.core.create_persistent_volume(body)
        except ApiException as exc:
            if exc.status != 409:  # 409: made by an earlier pass
                raise
        log.info(
            "provisioned %s for claim %s/%s (%s) in %.0f ms",
            body["metadata"]["name"],
            meta["namespace"],
            meta["name"],
            body["spec"]["capacity"]["storage"],
            (time.monotonic() - started) * 1000,
        )

    def reclaim(self, pv: dict[str, Any]) -> None:
        name = pv["metadata"]["name"]
        path = owned_path(pv, self.root)
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
            if path.exists():
                log.warning(
                    "volume %s: could not remove %s; deleting the volume anyway", name, path
                )
        try:
            self.core.delete_persistent_volume(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
        log.info("reclaimed %s (released): directory %s", name, path or "not ours, left")

    def sweep(self, keep: set[Path]) -> None:
        """Directories of ours that no volume or pending claim names: left by a pass that stopped
        between making the directory and creating the volume, for a claim deleted since."""
        for path in self.root.iterdir():
            if path.is_dir() and DIR_PATTERN.match(path.name) and path not in keep:
                log.info("removing orphan directory %s (no volume, no pending claim)", path)
                shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Loop: watches trigger passes; /healthz for hack/cluster.py


def watch_forever(name: str, list_call: Callable[..., Any], changed: threading.Event) -> None:
    while True:
        try:
            stream: Callable[..., Any] = watch.Watch().stream  # type: ignore[no-untyped-call]
            # The server ends a watch after 300 s; the client gives up on a silent one at 330 s.
            for _event in stream(list_call, timeout_seconds=300, _request_timeout=330):
                changed.set()
        except Exception as exc:  # the API server away (a restart): watch again shortly
            log.warning("watch %s: %s: %s", name, type(exc).__name__, exc)
            time.sleep(2)
        changed.set()


def serve_health(port: int, prov: Provisioner) -> None:
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = prov.last_ok and time.monotonic() - prov.last_ok < HEALTHY_WITHIN
            self.send_response(200 if ok else 503)
            self.end_headers()
            self.wfile.write(b"ok" if ok else b"no successful pass lately")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--root", required=True, type=Path, help="directory of the volumes")
    parser.add_argument("--node", required=True, help="the node the volumes are on")
    parser.add_argument("--health-port", type=int, default=0, help="127.0.0.1 port of /healthz")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", force=True
    )
    args.root.mkdir(parents=True, exist_ok=True)
    api = config.new_client_from_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    prov = Provisioner(api, args.root.resolve(), args.node)
    if args.health_port:
        serve_health(args.health_port, prov)
    changed = threading.Event()
    changed.set()  # a first pass at once
    core, storage = client.CoreV1Api(api), client.StorageV1Api(api)
    for name, call in (
        ("persistentvolumeclaims", core.list_persistent_volume_claim_for_all_namespaces),
        ("persistentvolumes", core.list_persistent_volume),
        ("storageclasses", storage.list_storage_class),
    ):
        threading.Thread(target=watch_forever, args=(name, call, changed), daemon=True).start()
    log.info("serving %s: volumes under %s on node %s", PROVISIONER, prov.root, prov.node)
    while True:
        changed.wait(RESYNC)
        changed.clear()
        try:
            prov.sync()
        except Exception as exc:  # logged; the next event or resync tries again
            log.warning("pass failed: %s: %s", type(exc).__name__, exc)
            time.sleep(2)
            changed.set()


if __name__ == "__main__":
    raise SystemExit(main())
