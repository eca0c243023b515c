"""The control plane's command lines: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and the volume provisioner (hack/local_path_provisioner.py), each a `Proc` whose
flags are the whole of its configuration (docs/cluster.md, "Levels", says why each flag).

Pure: building a `Proc` starts nothing, so `restart` rebuilds exactly what `up` starts."""

from __future__ import annotations

import sys

from .binaries import Bins
from .layout import (
    APISERVER_PORT,
    ETCD_CLIENT_PORT,
    ETCD_PEER_PORT,
    KCM_PORT,
    KUBECONFIG,
    LOCAL_PATH,
    LOCAL_PATH_PORT,
    LOCAL_PATH_ROOT,
    NODE_NAME,
    PKI,
    REPO,
    SA_ISSUER,
    SCHEDULER_PORT,
    SERVICE_CIDR,
    STATE,
)
from .probes import (
    apiserver_ready,
    etcd_healthy,
    kcm_healthy,
    local_path_healthy,
    scheduler_healthy,
)
from .supervise import Proc

# Client-side API rate limits of the controller-manager and the scheduler (see kcm_proc and
# scheduler_proc): raised from the defaults (20/30 and 50/100), headroom for the scale benchmark.
KCM_API_QPS, KCM_API_BURST = 100, 200
SCHEDULER_API_QPS, SCHEDULER_API_BURST = 200, 400


def etcd_proc(bins: Bins) -> Proc:
    data = STATE / "etcd"
    return Proc(
        "etcd",
        [
            str(bins.etcd / "etcd"),
            "--name=sandbox-operator",
            f"--data-dir={data}",
            f"--listen-client-urls=http://127.0.0.1:{ETCD_CLIENT_PORT}",
            f"--advertise-client-urls=http://127.0.0.1:{ETCD_CLIENT_PORT}",
            f"--listen-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}",
            f"--initial-cluster=sandbox-operator=http://127.0.0.1:{ETCD_PEER_PORT}",
            "--listen-metrics-urls=",
            # A disposable test cluster: trade durability for speed on slow shared disks.
            "--unsafe-no-fsync",
            "--quota-backend-bytes=4294967296",
            "--log-level=warn",
        ],
        etcd_healthy,
    )


def apiserver_proc(bins: Bins, ip: str) -> Proc:
    return Proc(
        "kube-apiserver",
        [
            bins.kube("kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{ETCD_CLIENT_PORT}",
            "--bind-address=0.0.0.0",
            f"--secure-port={APISERVER_PORT}",
            f"--advertise-address={ip}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,"
            "DefaultTolerationSeconds,NodeRestriction,RuntimeClass,Priority,ResourceQuota,"
            "PodSecurity,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,"
            "ValidatingAdmissionPolicy",
            f"--client-ca-file={PKI / 'ca.crt'}",
            f"--tls-cert-file={PKI / 'apiserver.crt'}",
            f"--tls-private-key-file={PKI / 'apiserver.key'}",
            f"--kubelet-client-certificate={PKI / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={PKI / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={PKI / 'ca.crt'}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={PKI / 'sa.pub'}",
            f"--service-account-signing-key-file={PKI / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--profiling=false",
            "--event-ttl=1h",
            "--v=1",
        ],
        apiserver_ready,
        timeout=120,
    )


def kcm_proc(bins: Bins) -> Proc:
    kc = STATE / "kubeconfigs" / "controller-manager"
    return Proc(
        "kube-controller-manager",
        [
            bins.kube("kube-controller-manager"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={KCM_PORT}",
            "--leader-elect=false",
            # "*" = every default controller: garbage collector, namespace, service-account,
            # service-account-token, root-ca-cert-publisher, node lifecycle, ...
            "--controllers=*",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={PKI / 'sa.key'}",
            f"--root-ca-file={PKI / 'ca.crt'}",
            f"--cluster-signing-cert-file={PKI / 'ca.crt'}",
            f"--cluster-signing-key-file={PKI / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # Client-side rate limits (defaults 20/30) raised for the scale benchmark
            # (benchmarks/scale.py, thousands of pods on kwok nodes): headroom, so that the
            # garbage collector, namespace and pod-GC controllers never queue behind 20/s.
            f"--kube-api-qps={KCM_API_QPS}",
            f"--kube-api-burst={KCM_API_BURST}",
            "--profiling=false",
            "--v=1",
        ],
        kcm_healthy,
    )


def scheduler_proc(bins: Bins) -> Proc:
    kc = STATE / "kubeconfigs" / "scheduler"
    return Proc(
        "kube-scheduler",
        [
            bins.kube("kube-scheduler"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={SCHEDULER_PORT}",
            "--leader-elect=false",
            # The default 50 requests/s would cap binding at ~50 pods/s (one bind per pod).
            # Headroom for benchmarks/scale.py: measured on 2 cores, the API server is the limit
            # (2,000 kwok pods created at ~40/s, each bound 0.4 s p50 after creation).
            f"--kube-api-qps={SCHEDULER_API_QPS}",
            f"--kube-api-burst={SCHEDULER_API_BURST}",
            "--profiling=false",
            "--v=1",
        ],
        scheduler_healthy,
    )


def local_path_proc() -> Proc:
    # The project's venv (the `kubernetes` client); a fixed path, so that every caller of `up`
    # (make, pytest, a plain python3) starts the same command line.
    venv = REPO / ".venv" / "bin" / "python"
    return Proc(
        "local-path-provisioner",
        [
            str(venv) if venv.exists() else sys.executable,
            str(LOCAL_PATH),
            f"--kubeconfig={KUBECONFIG}",
            f"--root={LOCAL_PATH_ROOT}",
            f"--node={NODE_NAME}",
            f"--health-port={LOCAL_PATH_PORT}",
        ],
        local_path_healthy,
        timeout=60,
        # A changed provisioner restarts on the next `up`, like a changed flag.
        inputs=(LOCAL_PATH,),
    )
