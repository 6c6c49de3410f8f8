"""The loaded nvidia kernel module: one version per boot, whatever dpkg installs since.

A real node that upgrades the driver packages without a reboot keeps the old module loaded, and
NVML fails with "Driver/library version mismatch" until the node reboots or the module is
reloaded. The lab's reboot restarts the container, which empties /run (GPUFORGE_SIM_RUN here).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .conftest import VERSIONS, Runner

OLD = dict(
    VERSIONS, **{"nvidia-driver-cuda": "570.124.06-1", "nvidia-kernel-open-dkms": "570.124.06-1"}
)
NEW = VERSIONS  # 570.133.20


def _smi_version(sim: Runner, versions: dict[str, str], **env: str) -> tuple[int, str]:
    out = sim(
        "gpu001",
        "nvidia-smi",
        "--query-gpu=driver_version",
        "--format=csv,noheader",
        versions=versions,
        env=env,
    )
    return out.returncode, out.stdout


def test_upgrade_without_reboot_is_a_version_mismatch_until_the_reboot(
    sim: Runner, tmp_path: Path
) -> None:
    rc, out = _smi_version(sim, OLD)
    assert rc == 0 and out.splitlines()[0] == "570.124.06"
    # both packages moved to 570.133.20 (apt upgrade), the kernel still runs 570.124.06
    rc, out = _smi_version(sim, NEW)
    assert rc == 18
    assert "Failed to initialize NVML: Driver/library version mismatch" in out
    assert (tmp_path / "run/sys/module/nvidia/version").read_text() == "570.124.06\n"
    # the reboot: a new /run (the container's tmpfs)
    shutil.rmtree(tmp_path / "run")
    rc, out = _smi_version(sim, NEW)
    assert rc == 0 and out.splitlines()[0] == "570.133.20"


def test_boot_unit_loads_the_installed_module(sim: Runner, tmp_path: Path) -> None:
    """nvidia-modprobe (the boot unit) loads the module before any tool asks."""
    dev = tmp_path / "dev"
    dev.mkdir()
    done = sim(
        "gpu001", "nvidia-modprobe", "-c", "0", versions=OLD, env={"GPUFORGE_SIM_DEV_DIR": str(dev)}
    )
    if done.returncode != 0 and os.geteuid() != 0:
        # mknod needs CAP_MKNOD; the module is loaded before the device files are made
        assert "cannot create" in done.stdout + done.stderr
    assert (tmp_path / "run/sys/module/nvidia/version").read_text() == "570.124.06\n"
    rc, out = _smi_version(sim, NEW)
    assert rc == 18, out


def test_unloading_the_module_loads_the_installed_one_next(sim: Runner) -> None:
    assert _smi_version(sim, OLD)[0] == 0
    assert _smi_version(sim, NEW)[0] == 18
    assert sim("gpu001", "modprobe", "-r", "nvidia", versions=NEW).returncode == 0
    assert sim("gpu001", "modprobe", "nvidia", versions=NEW).returncode == 0
    rc, out = _smi_version(sim, NEW)
    assert rc == 0 and out.splitlines()[0] == "570.133.20"


def test_packages_that_disagree_are_a_mismatch_from_the_first_load(sim: Runner) -> None:
    split = dict(NEW, **{"nvidia-kernel-open-dkms": "570.124.06-1"})
    rc, out = _smi_version(sim, split)
    assert rc == 18 and "version mismatch" in out


def test_sysfs_tree_shows_this_boots_module(sim: Runner, tmp_path: Path) -> None:
    """The role reads <sysfs>/module/nvidia/version; the lab's tree links it to this boot's."""
    top = tmp_path / "sys"
    env = {"GPUFORGE_SIM_SYSFS": str(top)}
    assert sim("gpu001", "gpuforge-sim-sysfs", versions=OLD, env=env).returncode == 0
    version = top / "module/nvidia/version"
    assert not version.exists()  # not loaded yet in this boot
    assert _smi_version(sim, OLD)[0] == 0
    assert version.read_text() == "570.124.06\n"
    assert _smi_version(sim, NEW)[0] == 18
    assert version.read_text() == "570.124.06\n"
    assert not (top / "module").is_symlink()
    real = [e.name for e in Path("/sys/module").iterdir() if e.name != "nvidia"][:3]
    assert all((top / "module" / name).is_symlink() for name in real)
    shutil.rmtree(tmp_path / "run")  # reboot
    assert not version.exists()
    assert _smi_version(sim, NEW)[0] == 0
    assert version.read_text() == "570.133.20\n"
