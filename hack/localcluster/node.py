"""The node's agents: the kubelet and kube-proxy (each with a configuration file written under
the state directory, which restarts it when it changes) and kube-router's NetworkPolicy
controller (hack/build-netpol.sh prints its command line)."""

from __future__ import annotations

import json
from pathlib import Path

from .binaries import Bins
from .layout import (
    CLUSTER_CIDR,
    CONTAINERD_SOCK,
    IMAGES,
    KUBE_PROXY_HEALTHZ_PORT,
    KUBE_PROXY_METRICS_PORT,
    KUBECONFIG,
    KUBELET_HEALTHZ_PORT,
    KUBELET_PORT,
    NETPOL,
    NODE_NAME,
    PKI,
    STATE,
)
from .probes import kube_proxy_healthy, kube_router_healthy, kubelet_healthy
from .steps import run, write_file
from .supervise import Proc, pid_alive, read_pidfile, start, stop_record


def write_kubelet_config() -> Path:
    cfg = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(PKI / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCK}",
        "tlsCertFile": str(PKI / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(PKI / "kubelet-serving.key"),
        "port": KUBELET_PORT,
        "healthzPort": KUBELET_HEALTHZ_PORT,
        "healthzBindAddress": "127.0.0.1",
        "readOnlyPort": 0,
        "clusterDomain": "cluster.local",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        # The images exist only locally (no registry to pull them back): never GC them, and
        # do not evict for disk pressure on a shared development disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "maxPods": 110,
        "serializeImagePulls": False,
        "resolvConf": "/etc/resolv.conf",
        "podLogsDir": str(STATE / "pod-logs"),
    }
    path = STATE / "kubelet-config.json"
    write_file(path, json.dumps(cfg, indent=2) + "\n")
    return path


def kubelet_proc(bins: Bins, ip: str, config: Path) -> Proc:
    return Proc(
        "kubelet",
        [
            bins.kube("kubelet"),
            f"--config={config}",
            f"--kubeconfig={STATE / 'kubeconfigs' / 'kubelet'}",
            f"--root-dir={STATE / 'kubelet'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={ip}",
            f"--pod-infra-container-image={IMAGES['pause']}",
            "--v=1",
        ],
        kubelet_healthy,
        timeout=120,
        inputs=(config,),
        attempts=10,
    )


def write_kube_proxy_config() -> Path:
    cfg = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(STATE / "kubeconfigs" / "kube-proxy")},
        "mode": "iptables",
        "clusterCIDR": CLUSTER_CIDR,
        "hostnameOverride": NODE_NAME,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": f"127.0.0.1:{KUBE_PROXY_HEALTHZ_PORT}",
        "metricsBindAddress": f"127.0.0.1:{KUBE_PROXY_METRICS_PORT}",
        # No NodePorts on 127.0.0.1 (that would need route_localnet on the host's interfaces).
        "iptables": {"localhostNodePorts": False},
        # Leave the host's conntrack sysctls as they are.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }
    path = STATE / "kube-proxy-config.json"
    write_file(path, json.dumps(cfg, indent=2) + "\n")
    return path


def kube_proxy_proc(bins: Bins, config: Path) -> Proc:
    return Proc(
        "kube-proxy",
        [bins.kube("kube-proxy"), f"--config={config}", "--v=1"],
        kube_proxy_healthy,
        inputs=(config,),
        attempts=3,
    )


def kube_router_proc() -> Proc:
    argv = run(["bash", str(NETPOL), "print-command", NODE_NAME, str(KUBECONFIG)]).split()
    return Proc("kube-router", argv, kube_router_healthy, timeout=120)


def start_kube_router() -> None:
    """Start kube-router's policy controller (after the node is Ready). A recorded one with the
    same command line is left alone; otherwise it is stopped and its rules removed first (it
    does not remove rules it wrote with other flags)."""
    proc = kube_router_proc()
    record = read_pidfile(proc.pidfile)
    if record and pid_alive(record) and record.get("fingerprint") == proc.fingerprint:
        start(proc)
        return
    if record:
        stop_record("kube-router", record)
    run(["bash", str(NETPOL), "cleanup"], log=proc.log)
    start(proc)
