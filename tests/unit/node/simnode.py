"""A simulated GPU node for the node checker: the lab simulator's tools on a PATH of wrappers.

``SimNode`` writes, under a temporary directory, what a node has: a ``bin/`` of tool wrappers
(``nvidia-smi``, ``dmesg``, ``ibstat``, ``dcgmi`` run the lab simulator as that node, with its
fault list; ``systemctl`` and ``dpkg-query`` answer from files), a ``proc/`` (boot id, uptime), a
``sys/`` tree with the IB port counters and netdev MTUs in the kernel's formats, and a
health.yaml pointing the checker's state and textfile directories inside it. Tools not written
are absent from PATH (the checker's ERROR path).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from gpuforge_sim.faults import node_state, validate_fault_doc

from gpuforge.node import config as cfg
from gpuforge.node.engine import RunOutcome, run_tier

ROOT = Path(__file__).resolve().parents[3]
SIM = ROOT / "lab" / "sim"
HOST = "gpu001"
SIM_TOOLS = ("nvidia-smi", "dmesg", "ibstat", "dcgmi")
#: What dpkg reports on a lab node (lab/sim's mirror packages), and the pins matching them.
PACKAGES = {
    "nvidia-driver-cuda": "570.133.20-1",
    "libnccl2": "2.26.2-1+cuda12.8",
    "datacenter-gpu-manager-4-core": "1:4.2.3-1",
    "nvidia-fabricmanager-570": "570.133.20-1",
    "slurmd": "22.05.8-4",
    "cuda-toolkit-12-8": "12.8.1-1",
}
PINS = {
    "driver": "570.133.20",
    "nccl": "2.26.2",
    "dcgm": "4.2.3",
    "fabricmanager": "570.133.20",
    "slurm": "22.05",
    "cuda": "12.8",
}
SERVICES = ["nvidia-persistenced", "nvidia-fabricmanager", "nvidia-dcgm", "slurmd"]
COUNTERS = ("symbol_error", "link_downed", "port_rcv_errors", "port_xmit_discards")


def cluster_info() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SIM / "examples" / "cluster-info.json").read_text())
    return data


class SimNode:
    """One simulated node under ``root``."""

    def __init__(self, root: Path, faults: Sequence[Mapping[str, Any]] = ()) -> None:
        self.root = root
        self.bin = root / "bin"
        self.proc = root / "proc"
        self.sys = root / "sys"
        self.state_file = root / "sim-state.json"
        self.bin.mkdir(parents=True, exist_ok=True)
        self.rails = cluster_info()["nodes"][0]["rails"][:2]
        self.set_faults(faults)
        self.set_boot("boot-1", uptime=7200.0)
        for rail in self.rails:
            for name in COUNTERS:
                self.set_counter(rail["device"], name, 0)
            self.set_mtu(rail["netdev"], 4096)
        for tool in SIM_TOOLS:
            self.sim_tool(tool)
        self.services = dict.fromkeys(SERVICES, "active")
        self.packages = dict(PACKAGES)
        self._write_fakes()
        self.extra: dict[str, Any] = {}

    # --- the node's facts -------------------------------------------------------------------

    def set_faults(self, faults: Sequence[Mapping[str, Any]]) -> None:
        entries = [{"node": HOST, **f} for f in faults]
        doc = validate_fault_doc({"version": 1, "time_scale": 0, "faults": entries})
        self.state_file.write_text(json.dumps(node_state(doc, cluster_info(), HOST)))

    def set_boot(self, boot_id: str, *, uptime: float) -> None:
        (self.proc / "sys/kernel/random").mkdir(parents=True, exist_ok=True)
        (self.proc / "sys/kernel/random/boot_id").write_text(boot_id + "\n")
        (self.proc / "uptime").write_text(f"{uptime:.2f} {uptime * 7:.2f}\n")

    def counter_path(self, device: str, name: str) -> Path:
        return self.sys / "class/infiniband" / device / "ports/1/counters" / name

    def set_counter(self, device: str, name: str, value: int) -> None:
        path = self.counter_path(device, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")

    def set_mtu(self, netdev: str, mtu: int) -> None:
        path = self.sys / "class/net" / netdev / "mtu"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{mtu}\n")

    def _script(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text(body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    def sim_tool(self, tool: str) -> None:
        """``tool`` runs the lab simulator as this node."""
        self._script(
            tool,
            f'#!/bin/sh\nexec "{sys.executable}" -S -m gpuforge_sim {tool} "$@"\n',
        )

    def remove_tool(self, tool: str) -> None:
        (self.bin / tool).unlink()

    def hang_tool(self, tool: str) -> None:
        self._script(tool, "#!/bin/sh\nexec /bin/sleep 30\n")

    def _write_fakes(self) -> None:
        services = self.root / "services.json"
        packages = self.root / "packages.json"
        services.write_text(json.dumps(self.services))
        packages.write_text(json.dumps(self.packages))
        py = sys.executable
        self._script(
            "systemctl",
            f"#!{py} -S\nimport json, sys\n"
            f"states = json.load(open({str(services)!r}))\n"
            "units = [a for a in sys.argv[2:] if not a.startswith('-')]\n"
            "for u in units:\n    print(states.get(u, 'inactive'))\n"
            "sys.exit(0 if all(states.get(u) == 'active' for u in units) else 3)\n",
        )
        self._script(
            "dpkg-query",
            f"#!{py} -S\nimport json\n"
            f"for name, version in sorted(json.load(open({str(packages)!r})).items()):\n"
            "    print(f'{name}\\t{version}\\tinstalled')\n",
        )

    def write(self) -> None:
        """Rewrite the fakes after ``services``/``packages`` changed."""
        self._write_fakes()

    # --- config and running --------------------------------------------------------------------

    def config_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "version": 1,
            "node": HOST,
            "collector": None,
            "sysfs_root": str(self.sys),
            "state_dir": str(self.root / "state"),
            "textfile_dir": str(self.root / "textfile"),
            "expect": {
                "gpus": 8,
                "gpu_model": "H100-SXM-80GB",
                "nvlink_links_per_gpu": 18,
                "pcie": {"gen": 5, "width": 16},
                "rails": [
                    {
                        "device": r["device"],
                        "port": 1,
                        "netdev": r["netdev"],
                        "rate_gbps": 400,
                        "mtu": 4096,
                    }
                    for r in self.rails
                ],
                "versions": dict(PINS),
                "services": list(SERVICES),
            },
            "tiers": {
                "passive": {"timeout_s": 60},
                "prolog": {"timeout_s": 30},
                "epilog": {"timeout_s": 120},
            },
        }
        for key, value in self.extra.items():
            data[key] = value
        return data

    def only(self, *checks: str) -> None:
        """Disable every check but ``checks`` (a test of one check need not run every tool)."""
        self.extra["checks"] = {
            name: {"enabled": False} for name in cfg.CHECKS if name not in checks
        }

    def config(self) -> cfg.HealthConfig:
        path = self.root / "health.yaml"
        path.write_text(yaml.safe_dump(self.config_data(), sort_keys=False))
        return cfg.load(path)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NCCL_"))}
        env.update(
            PATH=str(self.bin),
            PYTHONPATH=str(SIM),
            GPUFORGE_SIM_STATE=str(self.state_file),
            GPUFORGE_SIM_RUN=str(self.root / "run"),
            GPUFORGE_SIM_REAL_DMESG="/nonexistent",
            GPUFORGE_SIM_VERSIONS=json.dumps(self.packages),
        )
        return env

    def run(self, tier: str = "passive", **kw: Any) -> RunOutcome:
        return run_tier(self.config(), tier, env=self.env(), proc_root=self.proc, **kw)
