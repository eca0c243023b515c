"""The host's side of the node's network: the kernel modules and sysctls pods need (bridged
traffic through iptables, forwarding), and a guard chain so that a Service IP kube-proxy has not
translated fails on this machine instead of leaving it by the default route.

`up` installs both; `down --wipe` removes the guard (teardown.py)."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from .layout import SERVICE_CIDR
from .steps import run

#: The filter-table chain (in OUTPUT and FORWARD) that rejects untranslated Service IPs.
GUARD_CHAIN = "SBXOP-SERVICE-GUARD"


def prepare_host() -> None:
    for module in ("overlay", "br_netfilter"):
        subprocess.run(["modprobe", module], capture_output=True)
    for key, value in (
        ("net/ipv4/ip_forward", "1"),
        ("net/bridge/bridge-nf-call-iptables", "1"),
        ("net/bridge/bridge-nf-call-ip6tables", "1"),
    ):
        with contextlib.suppress(OSError):
            Path("/proc/sys", key).write_text(value)
    service_guard(install=True)


def service_guard(install: bool) -> None:
    """A Service IP that kube-proxy did not translate (no such Service, or kube-proxy not up yet)
    must fail on this machine instead of following the default route out of it. The filter
    table sees destinations after kube-proxy's DNAT, so only untranslated ones match."""
    ipt = ["iptables", "-w", "5"]
    reject = ["-j", "REJECT", "--reject-with", "icmp-net-unreachable"]
    checks = [
        [*ipt, "-C", GUARD_CHAIN, "-d", SERVICE_CIDR, *reject],
        [*ipt, "-C", "OUTPUT", "-j", GUARD_CHAIN],
        [*ipt, "-C", "FORWARD", "-j", GUARD_CHAIN],
    ]
    if install and all(subprocess.run(c, capture_output=True).returncode == 0 for c in checks):
        return
    subprocess.run(["ip", "route", "delete", "blackhole", SERVICE_CIDR], capture_output=True)
    for chain in ("OUTPUT", "FORWARD"):
        while (
            subprocess.run([*ipt, "-D", chain, "-j", GUARD_CHAIN], capture_output=True).returncode
            == 0
        ):
            pass
    subprocess.run([*ipt, "-F", GUARD_CHAIN], capture_output=True)
    if not install:
        subprocess.run([*ipt, "-X", GUARD_CHAIN], capture_output=True)
        return
    subprocess.run([*ipt, "-N", GUARD_CHAIN], capture_output=True)
    run([*ipt, "-A", GUARD_CHAIN, "-d", SERVICE_CIDR, *reject])
    for chain in ("OUTPUT", "FORWARD"):
        run([*ipt, "-I", chain, "1", "-j", GUARD_CHAIN])
