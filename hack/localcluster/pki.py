"""The cluster's identities: a throwaway CA, a certificate for each component (the API server's
names the node's address, so a new address regenerates the leaf certificates), the service-account
signing key, and a kubeconfig for each client of the API server (the admin's is $KUBECONFIG).

openssl does the cryptography; nothing here is meant to outlive the state directory."""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from pathlib import Path

from .layout import APISERVER_PORT, KUBECONFIG, LOGS, NODE_NAME, PKI, SERVICE_IP, STATE
from .steps import StepFailed, run, step, write_file


def node_ip() -> str:
    """The IPv4 address of the interface that holds the default route (else the first global)."""
    out = run(["ip", "-4", "-o", "route", "show", "default"], check=False)
    dev = ""
    for tok_line in out.splitlines():
        toks = tok_line.split()
        if "dev" in toks:
            dev = toks[toks.index("dev") + 1]
            break
    addrs = run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"] + (["dev", dev] if dev else [])
    )
    for line in addrs.splitlines():
        toks = line.split()
        if "inet" in toks:
            return toks[toks.index("inet") + 1].split("/")[0]
    raise StepFailed("node ip", "no global IPv4 address on this machine")


@dataclass(frozen=True)
class Cert:
    name: str
    cn: str
    org: str = ""
    server: bool = False
    client: bool = False
    sans: tuple[str, ...] = ()


def leaf_certs(ip: str) -> list[Cert]:
    api_sans = (
        "DNS:kubernetes",
        "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local",
        "DNS:localhost",
        "IP:127.0.0.1",
        f"IP:{ip}",
        f"IP:{SERVICE_IP}",
    )
    return [
        Cert("apiserver", "kube-apiserver", server=True, sans=api_sans),
        Cert(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            "system:masters",
            client=True,
        ),
        Cert("admin", "sandbox-operator-admin", "system:masters", client=True),
        Cert("controller-manager", "system:kube-controller-manager", client=True),
        Cert("scheduler", "system:kube-scheduler", client=True),
        Cert("kube-proxy", "system:kube-proxy", client=True),
        Cert("kubelet-client", f"system:node:{NODE_NAME}", "system:nodes", client=True),
        Cert(
            "kubelet-serving",
            NODE_NAME,
            server=True,
            sans=(f"DNS:{NODE_NAME}", "DNS:localhost", "IP:127.0.0.1", f"IP:{ip}"),
        ),
    ]


def _ec_key(path: Path, log: Path) -> None:
    """A P-256 private key at ``path`` (the CA's and every leaf's)."""
    run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(path)],
        log=log)  # fmt: skip


def ensure_pki(ip: str) -> None:
    marker = PKI / "node-ip"
    same_ip = marker.exists() and marker.read_text() == ip
    certs = [c for c in leaf_certs(ip) if not same_ip or not (PKI / f"{c.name}.crt").exists()]
    if same_ip and not certs:
        return
    log = LOGS / "pki.log"
    with step(f"generate certificates (throwaway CA, node ip {ip})", log):
        PKI.mkdir(parents=True, exist_ok=True)
        os.chmod(PKI, 0o700)
        ca_key, ca_crt = PKI / "ca.key", PKI / "ca.crt"
        if not ca_crt.exists():
            _ec_key(ca_key, log)
            run(
                ["openssl", "req", "-x509", "-new", "-key", str(ca_key), "-sha256", "-days", "3650",
                 "-subj", "/CN=sandbox-operator-ca", "-out", str(ca_crt),
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"],
                log=log,
            )  # fmt: skip
        if not (PKI / "sa.key").exists():
            run(["openssl", "genrsa", "-out", str(PKI / "sa.key"), "2048"], log=log)
            run(
                [
                    "openssl",
                    "rsa",
                    "-in",
                    str(PKI / "sa.key"),
                    "-pubout",
                    "-out",
                    str(PKI / "sa.pub"),
                ],
                log=log,
            )
        for cert in certs:
            key, csr, crt = (PKI / f"{cert.name}.{ext}" for ext in ("key", "csr", "crt"))
            ext = PKI / f"{cert.name}.ext"
            usages = [
                u for u, on in (("serverAuth", cert.server), ("clientAuth", cert.client)) if on
            ]
            lines = [
                "basicConstraints=critical,CA:FALSE",
                "keyUsage=critical,digitalSignature,keyEncipherment",
                f"extendedKeyUsage={','.join(usages)}",
            ]
            if cert.sans:
                lines.append(f"subjectAltName={','.join(cert.sans)}")
            ext.write_text("\n".join(lines) + "\n")
            subj = f"/CN={cert.cn}" + (f"/O={cert.org}" if cert.org else "")
            _ec_key(key, log)
            run(
                ["openssl", "req", "-new", "-key", str(key), "-subj", subj, "-out", str(csr)],
                log=log,
            )
            run(
                ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca_crt),
                 "-CAkey", str(ca_key), "-CAcreateserial", "-days", "3650", "-sha256",
                 "-extfile", str(ext), "-out", str(crt)],
                log=log,
            )  # fmt: skip
            csr.unlink()
            ext.unlink()
        for f in PKI.glob("*.key"):
            os.chmod(f, 0o600)
        marker.write_text(ip)


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, user: str, cert: str, server: str) -> None:
    text = f"""apiVersion: v1
kind: Config
clusters:
- name: sandbox-operator
  cluster:
    server: {server}
    certificate-authority-data: {b64(PKI / "ca.crt")}
users:
- name: {user}
  user:
    client-certificate-data: {b64(PKI / f"{cert}.crt")}
    client-key-data: {b64(PKI / f"{cert}.key")}
contexts:
- name: sandbox-operator
  context:
    cluster: sandbox-operator
    user: {user}
    namespace: default
current-context: sandbox-operator
"""
    write_file(path, text, 0o600)


def ensure_kubeconfigs() -> None:
    server = f"https://127.0.0.1:{APISERVER_PORT}"
    KUBECONFIG.parent.mkdir(parents=True, exist_ok=True)
    write_kubeconfig(KUBECONFIG, "admin", "admin", server)
    kc = STATE / "kubeconfigs"
    kc.mkdir(parents=True, exist_ok=True)
    write_kubeconfig(kc / "controller-manager", "controller-manager", "controller-manager", server)
    write_kubeconfig(kc / "scheduler", "scheduler", "scheduler", server)
    write_kubeconfig(kc / "kubelet", "kubelet", "kubelet-client", server)
    write_kubeconfig(kc / "kube-proxy", "kube-proxy", "kube-proxy", server)
