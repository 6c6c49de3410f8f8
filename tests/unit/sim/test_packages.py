"""build_packages.py: package trees under NVIDIA's and Debian's names, clearly simulated."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import SIM_DIR


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    out = tmp_path_factory.mktemp("pkgs")
    subprocess.run(
        [sys.executable, "-S", str(SIM_DIR / "build_packages.py"), "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    found: dict[str, dict[str, str]] = {}
    for control in out.glob("*/DEBIAN/control"):
        fields: dict[str, str] = {}
        for line in control.read_text().splitlines():
            if line and not line.startswith(" "):
                key, _, value = line.partition(": ")
                fields[key] = value
        fields["_root"] = str(control.parent.parent)
        found[f"{fields['Package']}={fields['Version']}"] = fields
    return found


@pytest.mark.parametrize(
    "pin",
    [
        "nvidia-driver-cuda=570.133.20-1",
        "nvidia-driver-cuda=570.124.06-1",
        "cuda-drivers-570=570.133.20-1",
        "nvidia-kernel-open-dkms=570.124.06-1",
        "nvidia-fabricmanager-570=570.133.20-1",
        "libnccl2=2.26.2-1+cuda12.8",
        "libnccl2=2.25.1-1+cuda12.8",
        "libnccl-dev=2.26.2-1+cuda12.8",
        "cuda-toolkit-12-8=12.8.1-1",
        "cuda-toolkit-12-8=12.8.0-1",
        "datacenter-gpu-manager-4-core=1:4.2.3-1",
        "datacenter-gpu-manager-4-core=1:4.1.1-1",
        "datacenter-gpu-manager-4-cuda12=1:4.1.1-1",
        "nvidia-fabricmanager-570=570.124.06-1",
        "nccl-tests=2.13.13-1",
        "gpu-burn=0.0~git20240221-1",
        "infiniband-diags=44.0-2+gpuforgesim1",
        "ibverbs-utils=44.0-2+gpuforgesim1",
        "perftest=4.5+0.17-1+gpuforgesim1",
    ],
)
def test_package_exists_at_pinned_version(trees: dict[str, dict[str, str]], pin: str) -> None:
    assert pin in trees


def test_two_versions_of_every_upgradable_component(trees: dict[str, dict[str, str]]) -> None:
    """An upgrade and its rollback (issue 19): each component the spec pins comes twice."""
    for name in (
        "nvidia-driver-cuda",
        "nvidia-fabricmanager-570",
        "libnccl2",
        "cuda-toolkit-12-8",
        "datacenter-gpu-manager-4-core",
        "datacenter-gpu-manager-4-cuda12",
    ):
        assert len([p for p in trees if p.startswith(f"{name}=")]) == 2, name
    # DCGM's diagnostics package follows its own core release exactly.
    deps = trees["datacenter-gpu-manager-4-cuda12=1:4.1.1-1"]["Depends"]
    assert "datacenter-gpu-manager-4-core (= 1:4.1.1-1)" in deps


def test_older_cuda_reports_its_own_release(trees: dict[str, dict[str, str]]) -> None:
    root = Path(trees["cuda-toolkit-12-8=12.8.0-1"]["_root"])
    assert '"version" : "12.8.0"' in (root / "usr/local/cuda-12.8/version.json").read_text()
    assert "V12.8.61" in (root / "usr/local/cuda-12.8/bin/nvcc").read_text()


def test_every_package_says_it_is_simulated(trees: dict[str, dict[str, str]]) -> None:
    for fields in trees.values():
        assert fields["Description"].startswith("gpuforge lab simulator")


def test_driver_depends_on_matching_kernel_module(trees: dict[str, dict[str, str]]) -> None:
    deps = trees["nvidia-driver-cuda=570.124.06-1"]["Depends"]
    assert "nvidia-kernel-open-dkms (= 570.124.06-1)" in deps
    assert "nvidia-persistenced (= 570.124.06-1)" in deps


def test_persistenced_ships_a_unit_the_driver_role_starts(trees: dict[str, dict[str, str]]) -> None:
    root = Path(trees["nvidia-persistenced=570.133.20-1"]["_root"])
    unit = (root / "lib/systemd/system/nvidia-persistenced.service").read_text()
    assert "ExecStart=/usr/bin/nvidia-persistenced" in unit
    assert (root / "usr/bin/nvidia-persistenced").stat().st_mode & 0o111


def test_entry_scripts_are_executable(trees: dict[str, dict[str, str]]) -> None:
    smi = Path(trees["nvidia-driver-cuda=570.133.20-1"]["_root"]) / "usr/bin/nvidia-smi"
    assert smi.stat().st_mode & 0o111
    assert 'run("nvidia-smi"' in smi.read_text()
    fm = Path(trees["nvidia-fabricmanager-570=570.133.20-1"]["_root"])
    unit = fm / "lib/systemd/system/nvidia-fabricmanager.service"
    assert "ExecStart=/usr/bin/nv-fabricmanager" in unit.read_text()


def test_common_package_ships_the_simulator(trees: dict[str, dict[str, str]]) -> None:
    root = Path(next(v["_root"] for k, v in trees.items() if k.startswith("gpuforge-sim-common=")))
    assert (root / "usr/lib/gpuforge-sim/gpuforge_sim/nvsmi.py").is_file()
    assert (root / "usr/lib/gpuforge-sim/wrappers/dmesg").stat().st_mode & 0o111
