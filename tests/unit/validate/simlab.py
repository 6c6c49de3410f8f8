"""Run the lab simulator's tools as one node with a fault list, for unit tests of the checks.

Each call is a subprocess (``python3 -S -m gpuforge_sim TOOL ...``) with its own state file, as
the tools run on a lab node; nothing is installed.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuforge.command import CommandResult

ROOT = Path(__file__).resolve().parents[3]
SIM = ROOT / "lab" / "sim"
VERSIONS = {
    "nvidia-driver-cuda": "570.133.20-1",
    "nvidia-kernel-open-dkms": "570.133.20-1",
    "libnccl2": "2.26.2-1+cuda12.8",
    "datacenter-gpu-manager-4-core": "1:4.2.3-1",
}


def cluster_info() -> dict[str, Any]:
    """The 8-node H100 lab of lab/sim/examples."""
    data: dict[str, Any] = json.loads((SIM / "examples" / "cluster-info.json").read_text())
    return data


def state(faults: Sequence[Mapping[str, Any]], host: str, tmp: Path) -> Path:
    """Write ``host``'s state file for ``faults`` (fault file entries) and return its path."""
    from gpuforge_sim.faults import node_state, validate_fault_doc  # noqa: PLC0415

    doc = validate_fault_doc({"version": 1, "time_scale": 0, "faults": list(faults)})
    path = tmp / f"{host}.state.json"
    path.write_text(json.dumps(node_state(doc, cluster_info(), host)))
    return path


def run_tool(
    state_file: Path,
    tool: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    versions: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run simulated ``tool`` with ``args`` as the node of ``state_file``."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NCCL_"))}
    full.update(
        PYTHONPATH=str(SIM),
        GPUFORGE_SIM_STATE=str(state_file),
        GPUFORGE_SIM_RUN=str(state_file.parent / "run"),
        GPUFORGE_SIM_REAL_DMESG="/nonexistent",
        GPUFORGE_SIM_VERSIONS=json.dumps(dict(versions or VERSIONS)),
    )
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-S", "-m", "gpuforge_sim", tool, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=full,
        check=False,
    )


class SimRunner:
    """A CommandRunner whose nodes are simulated: ``{host: state file}``.

    It understands the command lines burn-in sends (``dcgmi ...``, the ``cd ... && gpu_burn N``
    wrapper, plain ``nvidia-smi ...``).
    """

    def __init__(self, states: Mapping[str, Path]) -> None:
        self.states = dict(states)

    def run(self, host: str, command: str, *, timeout: float) -> CommandResult:
        argv = shlex.split(command.rsplit("&&", maxsplit=1)[-1])
        start = time.monotonic()
        proc = run_tool(self.states[host], argv[0], *argv[1:])
        return CommandResult(
            host, command, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start
        )


def run_gpu_suite(tmp: Path, faults: Sequence[Mapping[str, Any]], select: str = "") -> Path:
    """The conformance suite's GPU checks (validators/test_gpu.py) on the simulated node
    ``gpu001``: testinfra's local backend with the simulator's nvidia-smi and dmesg first on
    PATH. Returns the suite's results file; ``select``: a pytest ``-k`` expression."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name in ("nvidia-smi", "dmesg"):
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\nexec {sys.executable} -S -m gpuforge_sim {name} "$@"\n')
        tool.chmod(0o755)
    env = dict(os.environ)
    env.update(
        PATH=f"{bin_dir}:{env.get('PATH', '')}",
        # This tree's gpuforge, not whichever the virtualenv installed.
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(SIM)]),
        GPUFORGE_SIM_STATE=str(state(faults, "gpu001", tmp)),
        GPUFORGE_SIM_RUN=str(tmp / "run"),
        GPUFORGE_SIM_REAL_DMESG="/nonexistent",
        GPUFORGE_SIM_VERSIONS=json.dumps({"nvidia-driver-cuda": "570.133.20-1"}),
    )
    out = tmp / "results.json"
    validators = ROOT / "validators"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(validators / "test_gpu.py"), "-p",
         "no:cacheprovider", f"--rootdir={validators}", "-c", str(validators / "pytest.ini"),
         "--hosts=local://", f"--gpuforge-results={out}", "-q",
         *(["-k", select] if select else [])],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert out.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return out
