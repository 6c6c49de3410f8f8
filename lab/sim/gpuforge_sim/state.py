"""Runtime view of /var/lib/gpuforge-sim/state.json for the simulated tools on a node."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .lifecycle import split_faults
from .paths import state_path
from .skus import CUDA_BY_BRANCH, Sku, resolve_sku

# Test-only overrides, read by the simulator alone (never by gpuforge's production code).
ENV_VERSIONS = "GPUFORGE_SIM_VERSIONS"  # JSON {"package": "version"} instead of dpkg-query
RUN_DIR_ENV = "GPUFORGE_SIM_RUN"  # test override of RUN_DIR
RUN_DIR = Path("/run/gpuforge-sim")
#: this boot's nvidia module version under RUN_DIR, shaped like /sys/module/nvidia/version
LOADED_MODULE = Path("sys/module/nvidia/version")

DRIVER_PACKAGE = "nvidia-driver-cuda"
KERNEL_PACKAGE = "nvidia-kernel-open-dkms"
NCCL_PACKAGE = "libnccl2"
DCGM_PACKAGE = "datacenter-gpu-manager-4-core"


class SimError(Exception):
    """A condition under which the real tool fails; ``message`` is what it prints."""

    def __init__(self, message: str, rc: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.rc = rc


def load_state() -> dict[str, Any]:
    """The state document, or SimError like a driver that is not loaded."""
    path = state_path()
    try:
        doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SimError(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n"
            f"(gpuforge lab simulator: no readable state at {path}: {exc})",
            rc=9,
        ) from exc
    return doc


def installed_version(package: str) -> str | None:
    """Installed version of a Debian package (``dpkg-query -W``), None when not installed."""
    override = os.environ.get(ENV_VERSIONS)
    if override:
        value = json.loads(override).get(package)
        return str(value) if value else None
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}\t${Version}", package],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 or "\t" not in out.stdout:
        return None
    status, version = out.stdout.split("\t", 1)
    if not status.endswith(" installed"):
        return None
    return version.strip() or None


def upstream_version(debian_version: str) -> str:
    """``1:4.2.3-1`` → ``4.2.3``; ``2.26.2-1+cuda12.8`` → ``2.26.2``."""
    v = debian_version.split(":", 1)[-1]
    return v.rsplit("-", 1)[0] if "-" in v else v


def run_dir() -> Path:
    """``/run/gpuforge-sim``: a tmpfs in a lab node, so what is there lasts one boot."""
    return Path(os.environ.get(RUN_DIR_ENV) or RUN_DIR)


def loaded_module_path() -> Path:
    """Where the version of this boot's nvidia kernel module is kept, shaped like sysfs's
    ``/sys/module/nvidia/version`` (the lab's sysfs tree links its ``module/nvidia`` here)."""
    return run_dir() / LOADED_MODULE


def loaded_module_version() -> str | None:
    """Version of the nvidia kernel module loaded in this boot, loading it when none is.

    A kernel keeps the module it loaded until a reboot (or an unload), whatever dpkg installs
    since: the first use in a boot (the boot unit's ``nvidia-modprobe``, ``modprobe nvidia``,
    a driver query) loads the installed ``nvidia-kernel-open-dkms``, and that version stays
    for the boot. None when no module is installed and none was loaded.
    """
    path = loaded_module_path()
    try:
        loaded = path.read_text(encoding="utf-8").strip()
    except OSError:
        loaded = ""
    if loaded:
        return loaded
    kernel = installed_version(KERNEL_PACKAGE)
    if kernel is None:
        return None
    version = upstream_version(kernel)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".version.{os.getpid()}")
        tmp.write_text(version + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # a user who may not write /run: the module is loaded all the same
    return version


def driver_version() -> str:
    """Driver version from the installed simulated driver, or SimError as NVML would fail.

    User space (``nvidia-driver-cuda``) must match the kernel module loaded in this boot:
    after a driver change without a reboot the old module is still loaded, and NVML fails
    with "Driver/library version mismatch" (rc 18) until the node reboots.
    """
    user = installed_version(DRIVER_PACKAGE)
    if user is None:
        raise SimError(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.",
            rc=9,
        )
    loaded = loaded_module_version()
    if loaded is not None and loaded != upstream_version(user):
        raise SimError("Failed to initialize NVML: Driver/library version mismatch", rc=18)
    return upstream_version(user)


def cuda_version(driver: str) -> str:
    return CUDA_BY_BRANCH.get(driver.split(".", 1)[0], "12.8")


def nccl_version() -> str:
    """NCCL version from libnccl2 (``2.26.2``); nccl-tests cannot start without it."""
    v = installed_version(NCCL_PACKAGE)
    if v is None:
        raise SimError(
            "error while loading shared libraries: libnccl.so.2: cannot open shared object "
            "file: No such file or directory",
            rc=127,
        )
    return upstream_version(v)


def nccl_cuda_suffix() -> str:
    v = installed_version(NCCL_PACKAGE) or ""
    m = re.search(r"\+cuda(\d+\.\d+)", v)
    return m.group(1) if m else "12.8"


@dataclass
class NodeView:
    """One node of the lab as the simulated tools see it."""

    hostname: str
    raw: dict[str, Any]
    seed: int
    #: Faults whose kernel messages this boot's log holds (None: the same as ``faults``).
    logged: list[dict[str, Any]] | None = None

    @property
    def sku(self) -> Sku | None:
        model = self.raw.get("gpu_model")
        return resolve_sku(model) if model else None

    @property
    def gpu_count(self) -> int:
        return int(self.raw.get("gpus", 0))

    @property
    def rails(self) -> list[dict[str, Any]]:
        return list(self.raw.get("rails", []))

    @property
    def faults(self) -> list[dict[str, Any]]:
        return list(self.raw.get("faults", []))

    @property
    def logged_faults(self) -> list[dict[str, Any]]:
        return list(self.faults if self.logged is None else self.logged)

    def has(self, kind: str) -> bool:
        return any(f["kind"] == kind for f in self.faults)

    def gpu_faults(self, gpu: int, kind: str | None = None) -> list[dict[str, Any]]:
        return [
            f for f in self.faults if f.get("gpu") == gpu and (kind is None or f["kind"] == kind)
        ]

    def rail_faults(self, rail: int, kind: str | None = None) -> list[dict[str, Any]]:
        return [
            f for f in self.faults if f.get("rail") == rail and (kind is None or f["kind"] == kind)
        ]

    def missing_gpus(self) -> set[int]:
        return {f["gpu"] for f in self.faults if f["kind"] == "gpu_missing"}

    def visible_gpus(self) -> list[int]:
        """Physical indices of the GPUs still on the bus, in PCI order."""
        gone = self.missing_gpus()
        return [i for i in range(self.gpu_count) if i not in gone]

    def bus_id(self, gpu: int) -> int:
        sku = self.sku
        ids = sku.bus_ids if sku else (0x18,)
        return ids[gpu] if gpu < len(ids) else 0x18 + 0x10 * gpu

    def uuid(self, gpu: int) -> str:
        h = hashlib.sha256(f"{self.hostname}/gpu/{gpu}".encode()).hexdigest()
        return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

    def serial(self, gpu: int) -> str:
        h = int(hashlib.sha256(f"{self.hostname}/serial/{gpu}".encode()).hexdigest()[:12], 16)
        return f"1650{h % 10**9:09d}"

    def guid(self, rail: int) -> str:
        h = hashlib.sha256(f"{self.hostname}/guid/{rail}".encode()).hexdigest()
        return "0xa088c20300" + h[:6]

    def lid(self, rail: int) -> int:
        h = int(hashlib.sha256(f"{self.hostname}/lid/{rail}".encode()).hexdigest()[:6], 16)
        return 2 + h % 4000

    def nic_pci(self, rail: int) -> str:
        nic_bus = (0x19, 0x2B, 0x3B, 0x5E, 0x9B, 0xAC, 0xBB, 0xDC)
        bus = nic_bus[rail] if rail < len(nic_bus) else 0x40 + rail
        return f"0000:{bus:02x}:00.0"

    def nvlinks_down(self, gpu: int) -> set[int]:
        sku = self.sku
        total = sku.nvlinks if sku else 0
        down: set[int] = set()
        for f in self.gpu_faults(gpu, "nvlink_down"):
            links = f.get("links", "all")
            down |= set(range(total)) if links == "all" else {int(x) for x in links}
        return {x for x in down if x < total}

    def rng(self, *salt: object) -> random.Random:
        key = "/".join(str(s) for s in (self.seed, self.hostname, *salt))
        # Deterministic noise for simulated measurements, not cryptography.
        return random.Random(int(hashlib.sha256(key.encode()).hexdigest()[:16], 16))  # noqa: S311


class Lab:
    """The whole lab as recorded in the state file, seen from the local node."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.seed = int(doc.get("seed", 0))
        self.hostname = str(doc.get("hostname") or socket.gethostname().split(".")[0])
        self.fabric: dict[str, Any] = dict(doc.get("fabric", {}))
        self.time_scale = float(doc.get("time_scale", 0.1))

    def node(self, hostname: str | None = None) -> NodeView:
        name = hostname or self.hostname
        raw = self.doc.get("nodes", {}).get(name)
        if raw is None:
            short = name.split(".")[0]
            raw = self.doc.get("nodes", {}).get(short)
        if raw is None:
            raise SimError(f"gpuforge lab simulator: node {name!r} is not in the state file", 1)
        return NodeView(hostname=str(raw.get("hostname", name)), raw=raw, seed=self.seed)

    def local(self) -> NodeView:
        """This node with only its active faults (not cleared by a GPU reset or a reboot)."""
        view = self.node(self.hostname)
        active, logged = split_faults(view.hostname, list(view.raw.get("faults", [])))
        return NodeView(
            hostname=view.hostname,
            raw={**view.raw, "faults": active},
            seed=view.seed,
            logged=logged,
        )

    def uplink_factor(self, leaf: str) -> float:
        f = 1.0
        for s in self.fabric.get("slow_uplinks", []):
            if s.get("leaf") == leaf:
                f = min(f, float(s.get("factor", 1.0)))
        return f

    def sleep(self, seconds: float) -> None:
        """Sleep a scaled share of a real tool's run time (``time_scale`` in the fault file)."""
        if seconds * self.time_scale > 0:
            time.sleep(seconds * self.time_scale)


def load_lab() -> Lab:
    return Lab(load_state())


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist (``gpu[001-003,007],ctl01``) without python-hostlist."""
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", expr):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            out.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for rng in ranges.split(","):
            if "-" in rng:
                lo, hi = rng.split("-", 1)
                width = len(lo)
                for i in range(int(lo), int(hi) + 1):
                    out.extend(expand_hostlist(f"{prefix}{i:0{width}d}{suffix}"))
            else:
                out.extend(expand_hostlist(f"{prefix}{rng}{suffix}"))
    return out


def noise(rng: random.Random, pct: float = 1.0) -> float:
    """A multiplicative factor within ±pct %."""
    return 1.0 + rng.uniform(-pct, pct) / 100.0


def boot_uptime() -> float:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 1000.0
