"""Kernel-side views a container cannot fake: ``dmesg`` lines, ``lsmod`` and ``modprobe``.

Containers cannot write /dev/kmsg or /proc/modules, so the simulated driver package diverts
the distribution's ``dmesg``, ``lsmod`` and ``modprobe`` (dpkg-divert) to these wrappers:
``dmesg`` prints the real kernel log (when readable) followed by the simulated NVRM/mlx5 lines;
``lsmod`` prints /proc/modules plus the simulated NVIDIA/mlx5 modules; ``modprobe`` loads
simulated NVIDIA modules by recording them and hands anything else to the real one.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from . import lifecycle
from .faults import XID_MESSAGES
from .state import (
    KERNEL_PACKAGE,
    NodeView,
    installed_version,
    load_lab,
    loaded_module_path,
    loaded_module_version,
    run_dir,
)

SIM_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_peermem")
AUTOLOADED = ("nvidia", "nvidia_uvm", "nvidia_modeset")  # loaded by udev/nvidia-persistenced
RDMA_MODULES = (
    ("mlx5_ib", 487424, 0, ""),
    ("ib_uverbs", 184320, 2, "rdma_ucm,mlx5_ib"),
    ("ib_core", 491520, 8, "rdma_cm,ib_ipoib,iw_cm,ib_umad,rdma_ucm,ib_uverbs,mlx5_ib,ib_cm"),
    ("mlx5_core", 2555904, 1, "mlx5_ib"),
)
MODULE_SIZES = {
    "nvidia_peermem": 16384,
    "nvidia_uvm": 6635520,
    "nvidia_modeset": 1642496,
    "nvidia": 104071168,
}


def kernel_events(node: NodeView) -> list[str]:
    """The simulated kernel messages of this node in this boot, oldest first, no timestamps."""
    return [line for _t, line in dated_kernel_events(node)]


XID_KINDS = ("xid", "ecc_uncorrectable", "row_remap_pending", "row_remap_failure", "nvlink_down")


def _fault_lines(node: NodeView, f: dict[str, Any]) -> list[tuple[float, str]]:
    """``(seconds before the fault's moment, line)`` for one fault."""
    kind = f["kind"]
    gpu = int(f.get("gpu", 0))
    pci = f"PCI:0000:{node.bus_id(gpu):02x}:00"
    out: list[str] = []
    if kind == "gpu_missing":
        bus = f"0000:{node.bus_id(gpu):02x}:00.0"
        out += [
            f"NVRM: GPU at {pci}: {node.uuid(gpu)}",
            f"NVRM: GPU Board Serial Number: {node.serial(gpu)}",
            f"NVRM: Xid ({pci}): 79, pid='<unknown>', name=<unknown>, {XID_MESSAGES[79]}",
            f"NVRM: GPU {bus}: GPU has fallen off the bus.",
            f"NVRM: GPU {bus}: GPU serial number is {node.serial(gpu)}.",
        ]
    elif kind in XID_KINDS:
        code = {
            "ecc_uncorrectable": 48,
            "row_remap_pending": 63,
            "row_remap_failure": 64,
            "nvlink_down": 74,
        }.get(str(kind), f.get("code", 0))
        count = int(f.get("count", 1)) if kind == "xid" else 1
        pid = 2100 + gpu * 7
        for _ in range(count):
            who = "pid='<unknown>', name=<unknown>" if code == 79 else f"pid={pid}, name=python3"
            out.append(f"NVRM: Xid ({pci}): {code}, {who}, {XID_MESSAGES[int(code)]}")
    elif kind == "link_flap":
        # mlx5e's carrier messages (en_main.c), spread evenly over the `hours` hours before the
        # fault was injected; each outage lasts 40 s, longer than gpud's 25 s "persistent down".
        rail = node.rails[int(f["rail"])]
        prefix = f"mlx5_core {node.nic_pci(int(f['rail']))} {rail['netdev']}"
        cycles = int(f.get("count", 3))
        span = float(f.get("hours", 2)) * 3600.0
        dated: list[tuple[float, str]] = []
        for i in range(cycles):
            age = span * (cycles - i) / (cycles + 1)
            dated.append((age + 40.0, f"{prefix}: Link down"))
            dated.append((age, f"{prefix}: Link up"))
        return dated
    return [(0.0, line) for line in out]


def dated_kernel_events(node: NodeView) -> list[tuple[float, str]]:
    """``(epoch time, line)`` of this boot's simulated kernel messages, oldest first.

    A fault injected during this boot logs at its injection time; one still present from an
    earlier boot logs again early in this boot (the driver finds the fault at init). Lines
    that would fall before the boot are moved just after it, in order.
    """
    boot = lifecycle.boot_time()
    at = lifecycle.now()
    events: list[tuple[float, int, str]] = []
    seq = 0
    for f in node.logged_faults:
        moment = lifecycle.injected_at(f)
        if moment < boot:
            moment = boot + 2.0 + 0.5 * seq
        for back, line in _fault_lines(node, f):
            t = max(boot + 1.0 + 0.000009 * seq, moment - back)
            if t <= at:
                events.append((t, seq, line))
            seq += 1
    return [(t, line) for t, _s, line in sorted(events)]


def dmesg_main(argv: list[str]) -> int:
    real = os.environ.get("GPUFORGE_SIM_REAL_DMESG", "/bin/dmesg.distrib")
    text = ""
    if Path(real).exists():
        try:
            done = subprocess.run(
                [real, *argv], capture_output=True, text=True, timeout=30, check=False
            )
            text = done.stdout if done.returncode == 0 else ""
        except (OSError, subprocess.TimeoutExpired):
            text = ""
    if any(a in ("-h", "--help", "-V", "--version") for a in argv):
        print(text, end="")
        print("(dmesg wrapped by the gpuforge lab simulator, not NVIDIA software)")
        return 0
    print(text, end="")
    events = dated_kernel_events(load_lab().local())
    if not events:
        return 0
    decode = any(a in ("-x", "--decode") for a in argv)
    human = any(a in ("-T", "--ctime") for a in argv)
    iso = "iso" in argv or "--time-format=iso" in argv
    raw = any(a in ("-t", "--notime") for a in argv)
    boot = lifecycle.boot_time()
    for t, line in events:
        prefix = ""
        if decode:
            prefix = "kern  :warn  : " if "NVRM" in line else "kern  :info  : "
        if raw:
            stamp = ""
        elif iso:
            frac = int((t % 1) * 1e6)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f",{frac:06d}+00:00 "
        elif human:
            stamp = time.strftime("[%a %b %e %H:%M:%S %Y] ", time.localtime(t))
        else:
            stamp = f"[{t - boot:12.6f}] "
        print(f"{prefix}{stamp}{line}")
    return 0


def _configured_modules() -> set[str]:
    names: set[str] = set()
    files = [Path("/etc/modules"), *sorted(Path("/etc/modules-load.d").glob("*.conf"))]
    for p in files:
        try:
            for raw in p.read_text().splitlines():
                name = raw.split("#", 1)[0].strip()
                if name:
                    names.add(name.replace("-", "_"))
        except OSError:
            continue
    return names


def loaded_sim_modules(node: NodeView | None) -> list[str]:
    """Simulated modules loaded now: the driver's own plus what modprobe/modules-load asked."""
    if installed_version(KERNEL_PACKAGE) is None:
        return []
    marks = (
        {p.name for p in (run_dir() / "modules").glob("*")}
        if (run_dir() / "modules").exists()
        else set()
    )
    wanted = set(AUTOLOADED) | ({m for m in marks | _configured_modules() if m in SIM_MODULES})
    if node is not None and node.has("missing_peermem"):
        wanted.discard("nvidia_peermem")
    return [m for m in SIM_MODULES if m in wanted]


def lsmod_main(argv: list[str]) -> int:
    del argv
    lines = ["Module                  Size  Used by"]
    host: list[str] = []
    try:
        host = Path("/proc/modules").read_text().splitlines()
    except OSError:
        host = []
    present = set()
    for row in host:
        parts = row.split()
        if len(parts) < 4:
            continue
        name, size, refs, holders = parts[0], parts[1], parts[2], parts[3]
        present.add(name)
        holders = "" if holders == "-" else holders.rstrip(",")
        lines.append(f"{name:<19} {int(size):>8}  {refs} {holders}".rstrip())
    try:
        node: NodeView | None = load_lab().local()
    except Exception:
        node = None
    sim = loaded_sim_modules(node)
    extra: list[tuple[str, int, int, str]] = []
    if node is not None and node.rails:
        extra += [m for m in RDMA_MODULES if m[0] not in present]
    users = [m for m in ("nvidia_uvm", "nvidia_peermem", "nvidia_modeset") if m in sim]
    for m in ("nvidia_peermem", "nvidia_uvm", "nvidia_modeset"):
        if m in sim and m not in present:
            extra.insert(0, (m, MODULE_SIZES[m], 0, ""))
    if "nvidia" in sim and "nvidia" not in present:
        extra.append(("nvidia", MODULE_SIZES["nvidia"], len(users), ",".join(users)))
    for mod, msize, mrefs, mholders in extra:
        lines.append(f"{mod:<19} {msize:>8}  {mrefs} {mholders}".rstrip())
    print("\n".join(lines))
    return 0


def modprobe_main(argv: list[str]) -> int:
    names = [a for a in argv if not a.startswith("-")]
    remove = any(a in ("-r", "--remove") for a in argv)
    ours = [n for n in names if n.replace("-", "_") in SIM_MODULES]
    if names and len(ours) == len(names[:1]) and names[0].replace("-", "_") in SIM_MODULES:
        name = names[0].replace("-", "_")
        if installed_version(KERNEL_PACKAGE) is None:
            print(
                f"modprobe: FATAL: Module {names[0]} not found in directory /lib/modules/"
                f"{os.uname().release}"
            )
            return 1
        try:
            node: NodeView | None = load_lab().local()
        except Exception:
            node = None
        if (
            name == "nvidia_peermem"
            and node is not None
            and node.has("missing_peermem")
            and not remove
        ):
            print(f"modprobe: ERROR: could not insert '{name}': Invalid argument")
            return 1
        marks = run_dir() / "modules"
        marks.mkdir(parents=True, exist_ok=True)
        if remove:
            (marks / name).unlink(missing_ok=True)
            if name == "nvidia":
                # unloaded: the next load takes the installed version
                loaded_module_path().unlink(missing_ok=True)
        else:
            (marks / name).touch()
            loaded_module_version()
        return 0
    real = "/sbin/modprobe.distrib"
    if not Path(real).exists():
        real = "/usr/sbin/modprobe.distrib"
    return subprocess.run([real, *argv], check=False, timeout=120).returncode
