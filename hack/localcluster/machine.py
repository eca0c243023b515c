"""What this machine can virtualise: whether a microVM runtime (Kata, Firecracker) could run here.

The local cluster runs none (runc = container, gvisor = hardened_container); this says why not,
or that one could be added (docs/cluster.md, "A microVM RuntimeClass"). `status` prints the
verdict, and `up` ends with it. The judgement is a pure function of the machine's text, so it is
tested on made-up machines."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: CPU flags of hardware virtualisation in /proc/cpuinfo: Intel VT-x, AMD-V.
HW_VIRT_FLAGS = ("vmx", "svm")
#: Kernel modules that say which /dev/kvm this is: PVM (paravirtual: no hardware virtualisation,
#: guests need a PVM-enabled kernel) vs KVM on VT-x / AMD-V.
PVM_MODULE = "kvm_pvm"
HW_KVM_MODULES = ("kvm_intel", "kvm_amd")
#: What the local cluster offers instead of a microVM, said in every line.
LOCAL_RUNGS = "this cluster runs runc = container and gvisor = hardened_container, no microVM"


@dataclass(frozen=True)
class Virtualisation:
    """What this machine offers a microVM runtime. ``kind``: ``hardware`` (vmx/svm and
    /dev/kvm), ``paravirtual`` (/dev/kvm without vmx/svm, e.g. PVM, which stock guest kernels
    cannot boot on), ``no-kvm`` (vmx/svm but no /dev/kvm), ``none``, or ``unknown`` (not an x86
    CPU: its /proc/cpuinfo has no flags to tell). ``line``: that, said in one line."""

    kind: str
    line: str


def cpu_flags(cpuinfo: str) -> frozenset[str] | None:
    """The x86 CPU flags in /proc/cpuinfo text; None when there is no `flags` line (not x86)."""
    flags: set[str] = set()
    seen = False
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            seen = True
            flags.update(value.split())
    return frozenset(flags) if seen else None


def detect_virtualisation(
    cpuinfo: str, kvm_device: bool, modules: frozenset[str] = frozenset()
) -> Virtualisation:
    """Judge the machine from the text of /proc/cpuinfo, whether /dev/kvm exists and the loaded
    kernel modules (/sys/module). Pure, so it is tested on made-up machines: a /dev/kvm alone does
    not mean a microVM can boot (a PVM device has one and runs only PVM-built guest kernels)."""
    flags = cpu_flags(cpuinfo)
    hw = sorted(set(HW_VIRT_FLAGS) & (flags or frozenset()))
    if hw and kvm_device:
        return Virtualisation(
            "hardware",
            f"hardware virtualisation ({'/'.join(hw)} in /proc/cpuinfo) and /dev/kvm: a Kata or "
            f"Firecracker RuntimeClass could be added (docs/cluster.md); {LOCAL_RUNGS}",
        )
    if hw:
        return Virtualisation(
            "no-kvm",
            f"hardware virtualisation ({'/'.join(hw)}) but no /dev/kvm (kvm module not loaded "
            f"or the device not passed in), so no microVM can start; {LOCAL_RUNGS}",
        )
    if kvm_device and flags is None and PVM_MODULE not in modules:
        known = sorted(set(HW_KVM_MODULES) & modules)
        return Virtualisation(
            "unknown",
            "/dev/kvm present, but /proc/cpuinfo has no x86 flags to tell hardware from "
            f"paravirtual virtualisation (modules: {', '.join(known) or 'none known'}); "
            f"{LOCAL_RUNGS}",
        )
    if kvm_device:
        pvm = f"; {PVM_MODULE} loaded" if PVM_MODULE in modules else ""
        return Virtualisation(
            "paravirtual",
            f"only a paravirtual /dev/kvm (no vmx/svm in /proc/cpuinfo{pvm}): stock Kata or "
            f"Firecracker guest kernels cannot boot on it; {LOCAL_RUNGS}",
        )
    return Virtualisation(
        "none",
        f"no hardware virtualisation (no vmx/svm) and no /dev/kvm; {LOCAL_RUNGS}",
    )


def machine_virtualisation() -> Virtualisation:
    """:func:`detect_virtualisation` for this machine."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    try:
        modules = frozenset(os.listdir("/sys/module"))
    except OSError:
        modules = frozenset()
    return detect_virtualisation(cpuinfo, Path("/dev/kvm").is_char_device(), modules)
