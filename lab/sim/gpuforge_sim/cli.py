"""One entry point for every simulated tool; the installed scripts call ``run(tool, argv)``."""

from __future__ import annotations

import sys
from collections.abc import Callable

from .state import SimError


def _tools() -> dict[str, Callable[[list[str]], int]]:
    from . import (  # noqa: PLC0415
        dcgm_exporter,
        dcgmi,
        devices,
        fabricmanager,
        gpuburn,
        ib,
        kmsg,
        nccl,
        netdevs,
        nvsmi,
        sysfs,
    )

    table: dict[str, Callable[[list[str]], int]] = {
        "nvidia-smi": nvsmi.main,
        "dcgmi": dcgmi.main,
        "nv-hostengine": dcgmi.hostengine_main,
        "ibstat": ib.ibstat_main,
        "perfquery": ib.perfquery_main,
        "ibv_devinfo": ib.ibv_devinfo_main,
        "ib_write_bw": ib.ib_write_bw_main,
        "gpu_burn": gpuburn.main,
        "dmesg": kmsg.dmesg_main,
        "lsmod": kmsg.lsmod_main,
        "modprobe": kmsg.modprobe_main,
        "nv-fabricmanager": fabricmanager.main,
        "nvidia-modprobe": devices.main,
        "gpuforge-sim-netdevs": netdevs.main,
        "gpuforge-sim-sysfs": sysfs.main,
        "dcgm-exporter": dcgm_exporter.main,
    }
    for coll in nccl.COLLECTIVES:
        table[f"{coll}_perf"] = nccl.make_main(coll)
    return table


TOOLS = (
    "nvidia-smi",
    "dcgmi",
    "nv-hostengine",
    "ibstat",
    "perfquery",
    "ibv_devinfo",
    "ib_write_bw",
    "gpu_burn",
    "dmesg",
    "lsmod",
    "modprobe",
    "nv-fabricmanager",
    "nvidia-modprobe",
    "gpuforge-sim-netdevs",
    "gpuforge-sim-sysfs",
    "dcgm-exporter",
    "all_reduce_perf",
    "all_gather_perf",
    "alltoall_perf",
    "sendrecv_perf",
)


def run(tool: str, argv: list[str]) -> int:
    """Run simulated ``tool`` with ``argv``; returns its exit status."""
    table = _tools()
    if tool not in table:
        print(
            f"gpuforge-sim: unknown tool {tool!r}; known: {', '.join(sorted(table))}",
            file=sys.stderr,
        )
        return 2
    try:
        return table[tool](argv)
    except SimError as err:
        print(err.message)
        return err.rc
    except BrokenPipeError:
        return 141


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: python3 -m gpuforge_sim TOOL [ARGS...]", file=sys.stderr)
        return 2
    return run(sys.argv[1], sys.argv[2:])
