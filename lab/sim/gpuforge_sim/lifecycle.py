"""When a fault is there: injection time, this boot, GPU resets and what they cleared.

A fault in the state file carries ``injected_at`` (epoch seconds, stamped by the lab when it
loaded the fault file) and ``clears_on`` (``reset``, ``reboot`` or ``never``). It is *active*
unless a GPU reset cleared it (``nvidia-smi -r`` records its id in ``cleared.json`` beside the
state file) or the node booted after it was injected and it clears on a reboot (a reboot resets
every GPU too, so ``reset`` faults go as well).

The boot is the start of the container's PID 1: a lab node rebooted with ``systemctl reboot``
is a restarted container (the lab runs them with ``--restart=always``), and the host kernel's
``/proc/uptime`` and boot_id do not change with it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .paths import state_path

#: Test-only overrides, read by the simulator alone.
ENV_BOOT_TIME = "GPUFORGE_SIM_BOOT_TIME"  # epoch seconds of this boot
ENV_NOW = "GPUFORGE_SIM_NOW"  # epoch seconds the simulator takes as now


def now() -> float:
    """The current time (epoch seconds)."""
    override = os.environ.get(ENV_NOW)
    return float(override) if override else time.time()


def boot_time() -> float:
    """Epoch seconds at which this node (container) booted: the start of its PID 1."""
    override = os.environ.get(ENV_BOOT_TIME)
    if override:
        return float(override)
    try:
        fields = Path("/proc/1/stat").read_text().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat(5); 2 fields precede the ")" split
        btime = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return btime + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return now() - 3600.0


def uptime() -> float:
    """Seconds since this node booted."""
    return max(0.0, now() - boot_time())


def cleared_path() -> Path:
    """``cleared.json`` beside the state file: fault ids a GPU reset cleared, per node."""
    return state_path().with_name("cleared.json")


def load_cleared() -> dict[str, dict[str, Any]]:
    """``{hostname: {fault_id: {"at": epoch, "by": "reset"}}}``; empty when none was cleared."""
    try:
        doc = json.loads(cleared_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def record_cleared(hostname: str, ids: Iterable[str], by: str) -> None:
    """Add ``ids`` to the cleared faults of ``hostname`` (atomic rewrite)."""
    doc = load_cleared()
    mine = doc.setdefault(hostname, {})
    at = now()
    for fid in ids:
        mine.setdefault(fid, {"at": at, "by": by})
    path = cleared_path()
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


def injected_at(fault: Mapping[str, Any]) -> float:
    """When the fault was injected; faults of an old state file count from this boot."""
    value = fault.get("injected_at")
    return float(value) if value is not None else boot_time()


def is_active(fault: Mapping[str, Any], cleared: Mapping[str, Any], boot: float, at: float) -> bool:
    """Whether ``fault`` is present at time ``at`` on a node booted at ``boot``."""
    if injected_at(fault) > at:
        return False
    if fault.get("id") in cleared:
        return False
    clears = fault.get("clears_on", "never")
    return not (clears in ("reset", "reboot") and injected_at(fault) < boot)


def split_faults(
    hostname: str, faults: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(active, logged)``: the faults present now, and those whose kernel messages this boot's
    log holds (active ones, and ones injected during this boot that a reset cleared since)."""
    cleared = load_cleared().get(hostname, {})
    boot, at = boot_time(), now()
    active = [f for f in faults if is_active(f, cleared, boot, at)]
    ids = {id(f) for f in active}
    logged = [f for f in faults if id(f) in ids or (boot <= injected_at(f) <= at and f.get("id"))]
    return active, logged


def elapsed(fault: Mapping[str, Any], boot: float, at: float) -> float:
    """Seconds the fault has been growing at ``at``: since its injection or this boot."""
    return max(0.0, at - max(injected_at(fault), boot))
