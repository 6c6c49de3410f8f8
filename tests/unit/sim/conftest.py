"""Fixtures for the simulator tests: per-node state files and a subprocess runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gpuforge_sim.faults import load_fault_file, node_state

from tests.unit.conftest import real_fixture

ROOT = Path(__file__).resolve().parents[3]
SIM_DIR = ROOT / "lab" / "sim"
EXAMPLES = SIM_DIR / "examples"

VERSIONS = {
    "nvidia-driver-cuda": "570.133.20-1",
    "nvidia-kernel-open-dkms": "570.133.20-1",
    "libnccl2": "2.26.2-1+cuda12.8",
    "datacenter-gpu-manager-4-core": "1:4.2.3-1",
}

BOOTED = time.time() - 86400.0

Runner = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def cluster_info() -> dict[str, Any]:
    return dict(json.loads((EXAMPLES / "cluster-info.json").read_text()))


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory: pytest.TempPathFactory, cluster_info: dict[str, Any]) -> Path:
    doc = load_fault_file(EXAMPLES / "faults-all.yaml")
    doc["time_scale"] = 0.0
    out = tmp_path_factory.mktemp("simstate")
    for node in cluster_info["nodes"]:
        host = node["hostname"]
        (out / f"{host}.json").write_text(json.dumps(node_state(doc, cluster_info, host)))
    return out


def sim_env(state: Path, run_dir: Path, versions: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NCCL_"))}
    env.update(
        {
            "PYTHONPATH": str(SIM_DIR),
            "GPUFORGE_SIM_STATE": str(state),
            "GPUFORGE_SIM_VERSIONS": json.dumps(versions or VERSIONS),
            "GPUFORGE_SIM_RUN": str(run_dir),
            "GPUFORGE_SIM_REAL_DMESG": "/nonexistent",
            # the node booted a day ago, before every fault of the session's state files
            "GPUFORGE_SIM_BOOT_TIME": str(BOOTED),
        }
    )
    return env


@pytest.fixture
def sim(state_dir: Path, tmp_path: Path) -> Runner:
    """``sim("gpu001", "nvidia-smi", "-q")`` runs a simulated tool as that node."""

    def _run(
        host: str,
        tool: str,
        *args: str,
        versions: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        full = sim_env(state_dir / f"{host}.json", tmp_path / "run", versions)
        full.update(env or {})
        return subprocess.run(
            [sys.executable, "-S", "-m", "gpuforge_sim", tool, *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=full,
            check=False,
        )

    return _run


real = real_fixture
