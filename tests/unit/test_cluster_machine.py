"""`hack/cluster.py` tells hardware virtualisation from a paravirtual /dev/kvm, on made-up
machines: a /dev/kvm alone does not mean a Kata or Firecracker guest can boot (this machine has a
PVM /dev/kvm and no vmx/svm), and the tooling must not suggest a microVM rung it cannot give."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster() -> ModuleType:
    name = "hack_cluster_for_machine_tests"
    spec = importlib.util.spec_from_file_location(name, ROOT / "hack" / "cluster.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def cpuinfo(*flags: str, cpus: int = 2) -> str:
    """/proc/cpuinfo of an x86 machine with ``cpus`` processors having ``flags``."""
    one = (
        "processor\t: {n}\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n"
        "flags\t\t: fpu vme de pse tsc msr pae hypervisor {flags}\nbogomips\t: 4890.81\n\n"
    )
    return "".join(one.format(n=n, flags=" ".join(flags)) for n in range(cpus))


ARM = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1\n\n"


@pytest.mark.parametrize(
    ("text", "kvm", "modules", "kind", "says"),
    [
        (cpuinfo("svm"), True, {"kvm", "kvm_amd"}, "hardware", "svm"),
        (cpuinfo("vmx"), True, {"kvm", "kvm_intel"}, "hardware", "vmx"),
        (cpuinfo("svm"), False, set(), "no-kvm", "no /dev/kvm"),
        # This machine: /dev/kvm from the PVM module, no vmx/svm.
        (cpuinfo(), True, {"kvm", "kvm_pvm"}, "paravirtual", "kvm_pvm loaded"),
        # Without the module list the flags alone still tell.
        (cpuinfo(), True, set(), "paravirtual", "no vmx/svm"),
        (cpuinfo(), False, set(), "none", "no /dev/kvm"),
        (ARM, True, {"kvm"}, "unknown", "no x86 flags"),
        (ARM, True, {"kvm_pvm"}, "paravirtual", "kvm_pvm loaded"),
        ("", False, set(), "none", "no /dev/kvm"),
    ],
)
def test_the_machine_is_judged_from_cpuinfo_the_device_and_the_modules(
    cluster: ModuleType, text: str, kvm: bool, modules: set[str], kind: str, says: str
) -> None:
    verdict = cluster.detect_virtualisation(text, kvm, frozenset(modules))
    assert verdict.kind == kind
    assert says in verdict.line
    # One line, and it always says what the local cluster runs instead of a microVM.
    assert "\n" not in verdict.line
    assert "runc = container" in verdict.line and "gvisor = hardened_container" in verdict.line
    assert "no microVM" in verdict.line


def test_flags_are_read_as_whole_words(cluster: ModuleType) -> None:
    """A flag that merely contains the letters (`svm_lock`, `vmx_ept`-like names) is not one."""
    assert cluster.cpu_flags(cpuinfo("svm_lock", "nrip_save")) >= {"svm_lock"}
    assert cluster.detect_virtualisation(cpuinfo("svm_lock"), True).kind == "paravirtual"
    assert cluster.cpu_flags(ARM) is None


def test_this_machine_gets_a_verdict(cluster: ModuleType) -> None:
    verdict = cluster.machine_virtualisation()
    assert verdict.kind in {"hardware", "no-kvm", "paravirtual", "none", "unknown"}
