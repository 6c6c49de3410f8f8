"""Pinned versions, kernel modules and services, as the inventory says they must be."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gpuforge.validate import checks
from gpuforge.validate.conformance import parse_or_inconclusive, probe
from gpuforge.validate.parsers import nvidia_smi_csv

QUERY = f"nvidia-smi --query-gpu={checks.GPU_QUERY} --format=csv"


def _pkg_version(node: Any, package: str) -> tuple[str, str]:
    cmd = (
        f"dpkg-query -W -f='${{Version}}' {package} 2>/dev/null"
        f" || rpm -q --qf '%{{VERSION}}-%{{RELEASE}}' {package}"
    )
    res = probe(node.host, cmd, timeout=node.timeout, label=node.name)
    version = res.stdout.strip() if res.ok and "not installed" not in res.stdout else ""
    return version, res.evidence()


def _pin(node: Any, name: str) -> str:
    value = node.vars.get(name)
    if not value:
        pytest.skip(f"{name} is not pinned in the inventory")
    return str(value)


def test_driver(node: Any, record: Any) -> None:
    want = _pin(node, "nvidia_driver_version")
    res = node.output(QUERY)
    csv = parse_or_inconclusive(nvidia_smi_csv.parse, res)
    versions = sorted({str(r.values.get("driver_version")) for r in csv.rows})
    got = versions[0] if len(versions) == 1 else ",".join(versions)
    record.check("software.driver", checks.exact_version(got, want), res.evidence())


def test_cuda_toolkit(node: Any, record: Any) -> None:
    want = _pin(node, "cuda_toolkit_version")
    package = "cuda-toolkit-" + "-".join(want.split(".")[:2])
    got, ev = _pkg_version(node, package)
    record.check("software.cuda_toolkit", checks.exact_version(got, want), ev)


def test_nccl(node: Any, record: Any) -> None:
    want = _pin(node, "nccl_version")
    got, ev = _pkg_version(node, "libnccl2")
    record.check("software.nccl", checks.exact_version(got, want), ev)


def test_dcgm(node: Any, record: Any) -> None:
    want = _pin(node, "dcgm_version")
    got, ev = _pkg_version(node, f"datacenter-gpu-manager-{want.split('.')[0]}-core")
    record.check("software.dcgm", checks.exact_version(got, want), ev)


def test_fabric_manager(node: Any, record: Any) -> None:
    if not node.node_type.get("nvswitch"):
        pytest.skip("no NVSwitch: no Fabric Manager")
    want = _pin(node, "nvidia_driver_version")
    got, ev = _pkg_version(node, f"nvidia-fabricmanager-{want.split('.')[0]}")
    record.check("software.fabric_manager", checks.exact_version(got, want), ev)


def test_slurm(node: Any, record: Any) -> None:
    want = _pin(node, "slurm_version")
    res = node.output("slurmd -V")
    # "slurm 22.05.8" upstream, "slurm-wlm 22.05.8" in Debian's build
    version = re.search(r"\b(\d+\.\d+\.\d+)\b", res.stdout)
    got = version.group(1) if version else res.stdout.strip()
    record.check("software.slurm", checks.exact_version(got, want), res.evidence())


MODULES = ["nvidia", "nvidia_uvm", "nvidia_peermem"]


@pytest.mark.parametrize("module", MODULES)
def test_module(node: Any, record: Any, module: str) -> None:
    res = node.output("lsmod")
    loaded = {line.split()[0] for line in res.stdout.splitlines()[1:] if line.strip()}
    outcome = checks.Outcome(module in loaded, "loaded" if module in loaded else "absent", "loaded")
    record.check(f"software.module[{module}]", outcome, f"lsmod: {len(loaded)} modules")


SERVICES = ["nvidia-dcgm", "nvidia-fabricmanager", "nvidia-persistenced", "slurmd", "munge"]


@pytest.mark.parametrize("service", SERVICES)
def test_service(node: Any, record: Any, service: str) -> None:
    if service == "nvidia-fabricmanager" and not node.node_type.get("nvswitch"):
        pytest.skip("no NVSwitch: no Fabric Manager")
    res = probe(node.host, f"systemctl is-active {service}", timeout=node.timeout, label=node.name)
    state = res.stdout.strip() or ("hung" if res.timed_out else f"rc={res.rc}")
    outcome = checks.Outcome(state == "active", state, "active")
    record.check(f"software.service[{service}]", outcome, res.evidence())
