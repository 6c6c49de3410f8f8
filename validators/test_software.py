"""Pinned versions, kernel modules and services, as the inventory says they must be."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from gpuforge.validate import catalogue, checks
from gpuforge.validate.acceptance import parse_or_inconclusive, probe
from gpuforge.validate.parsers import nvidia_smi_csv
from gpuforge.validate.result import excerpt

QUERY = f"nvidia-smi --query-gpu={checks.GPU_QUERY} --format=csv"
#: The one package listing (checks.DPKG_QUERY), rpm's where there is no dpkg.
PACKAGES = (
    f"{shlex.join(checks.DPKG_QUERY)} 2>/dev/null"
    " || rpm -qa --qf '%{NAME}\\t%{VERSION}-%{RELEASE}\\n'"
)


@pytest.mark.parametrize("component", catalogue.VERSION_KEYS)
def test_versions(node: Any, record: Any, component: str) -> None:
    """``software.versions[<component>]``: what the node's software.versions judges, per pin."""
    if component == "fabricmanager" and not node.node_type.get("nvswitch"):
        pytest.skip("no NVSwitch: no Fabric Manager")
    want = node.vars.get(catalogue.VERSION_PINS[component])
    if not want:
        pytest.skip(f"{catalogue.VERSION_PINS[component]} is not pinned in the inventory")
    if component == "driver":
        res = node.output(QUERY)
        csv = parse_or_inconclusive(nvidia_smi_csv.parse, res)
        got = ",".join(sorted({str(r.values.get("driver_version")) for r in csv.rows})) or None
        evidence = res.evidence()
    else:
        res = node.output(PACKAGES)
        installed = checks.parse_installed(res.stdout)
        names = catalogue.VERSION_PACKAGES[component]
        got = checks.package_version(installed, names, str(want))
        evidence = excerpt(res.evidence(), [n.rstrip("-") for n in names], before=0, after=0)
    outcome = checks.pinned_versions({component: got}, {component: str(want)})
    record.check(f"software.versions[{component}]", outcome, evidence)


MODULES = ["nvidia", "nvidia_uvm", "nvidia_peermem"]


@pytest.mark.parametrize("module", MODULES)
def test_module(node: Any, record: Any, module: str) -> None:
    res = node.output("lsmod")
    loaded = {line.split()[0] for line in res.stdout.splitlines()[1:] if line.strip()}
    outcome = checks.JudgeOutcome(
        module in loaded, "loaded" if module in loaded else "absent", "loaded"
    )
    record.check(f"software.module[{module}]", outcome, f"lsmod: {len(loaded)} modules")


SERVICES = ["nvidia-dcgm", "nvidia-fabricmanager", "nvidia-persistenced", "slurmd", "munge"]


@pytest.mark.parametrize("service", SERVICES)
def test_services(node: Any, record: Any, service: str) -> None:
    if service == "nvidia-fabricmanager" and not node.node_type.get("nvswitch"):
        pytest.skip("no NVSwitch: no Fabric Manager")
    res = probe(node.host, f"systemctl is-active {service}", timeout=node.timeout, label=node.name)
    state = res.stdout.strip() or ("hung" if res.timed_out else f"rc={res.rc}")
    outcome = checks.services_active({service: state})
    record.check(f"software.services[{service}]", outcome, res.evidence())
