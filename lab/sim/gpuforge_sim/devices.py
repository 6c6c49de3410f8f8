"""nvidia-modprobe's device files: /dev/nvidia<N> and /dev/nvidiactl (gpuforge lab simulator).

On a real node nvidia-modprobe creates the character devices (major 195) that CUDA opens and that
Slurm's gres.conf ``File=`` names; Slurm 22.05 drops a GPU whose ``File=`` does not exist. A lab
node gets the same device files, one per GPU of its state. Nothing can open them (the container's
device cgroup refuses), and nothing in the lab needs to.

``-c N`` creates ``/dev/nvidiaN`` as the real tool does. Without ``-c`` the simulator creates the
files of every GPU of the node: that is what its boot unit runs.
"""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

from .state import SimError, load_lab, loaded_module_version

#: Major number of NVIDIA's character devices; /dev/nvidiactl is minor 255.
NVIDIA_MAJOR = 195
CTL_MINOR = 255
#: Test-only override of /dev, read by the simulator alone.
ENV_DEV_DIR = "GPUFORGE_SIM_DEV_DIR"


def dev_dir() -> Path:
    return Path(os.environ.get(ENV_DEV_DIR) or "/dev")


def _mknod(path: Path, minor: int) -> None:
    if path.exists():
        return
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))
        path.chmod(0o666)
    except OSError as exc:
        raise SimError(f"nvidia-modprobe: cannot create {path}: {exc.strerror}") from exc


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-modprobe")
    parser.add_argument("-c", "--create-nvidia-device-file", type=int, action="append", default=[])
    parser.add_argument("-u", "--unified-memory", action="store_true")
    parser.add_argument("-m", "--modeset", action="store_true")
    args = parser.parse_args(argv)
    # nvidia-modprobe loads the module first: at boot, this boot's module is the installed one
    loaded_module_version()
    minors = args.create_nvidia_device_file or list(range(load_lab().local().gpu_count))
    if not minors:
        return 0
    root = dev_dir()
    _mknod(root / "nvidiactl", CTL_MINOR)
    for minor in minors:
        _mknod(root / f"nvidia{minor}", minor)
    return 0
