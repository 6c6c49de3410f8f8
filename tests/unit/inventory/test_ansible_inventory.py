"""The real ``ansible-inventory`` accepts the generated inventories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuforge.generate import write_cluster_inventory, write_inventory
from gpuforge.topology import load_cluster

from ..conftest import EXAMPLES, LAB

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_INVENTORY = Path(sys.executable).with_name("ansible-inventory")

pytestmark = pytest.mark.slow


def _list(source: Path) -> dict[str, Any]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run(
        [str(ANSIBLE_INVENTORY), "-i", str(source), "--list"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,  # the 10k inventory takes minutes on a loaded 2-core machine
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


@pytest.mark.parametrize("source", ["dir", "hosts.yml"])
def test_lab_inventory_loads(tmp_path: Path, source: str) -> None:
    out = tmp_path / "inv"
    write_inventory(load_cluster(LAB), out)
    data = _list(out if source == "dir" else out / "hosts.yml")
    assert data["gpu_nodes"]["hosts"] == [f"gpu{i:02d}" for i in range(1, 9)]
    assert data["slurm_controllers"]["hosts"] == ["ctl01"]
    assert sorted(data["phase_02"]["hosts"]) == ["gpu05", "gpu06", "gpu07", "gpu08"]
    hostvars = data["_meta"]["hostvars"]
    assert sorted(hostvars) == ["ctl01"] + [f"gpu{i:02d}" for i in range(1, 9)]
    gpu01 = hostvars["gpu01"]
    assert gpu01["nvidia_driver_version"] == "570.133.20"
    assert gpu01["gpu_node_type"]["gpus"] == 8
    assert gpu01["gpuforge_phase"] == 1
    assert gpu01["gpuforge_rail_addresses"][1] == "10.100.1.11/24"


def test_10k_inventory_loads(tmp_path: Path) -> None:
    out = tmp_path / "inv"
    write_inventory(load_cluster(EXAMPLES / "cluster-10k.yaml"), out)
    data = _list(out)
    assert len(data["gpu_nodes"]["hosts"]) == 1250
    assert len(data["_meta"]["hostvars"]) == 1264
    assert len(data["su_63"]["hosts"]) == 10


def test_the_reader_works_on_a_non_blocking_stdin(tmp_path: Path) -> None:
    # A client killed mid-run (SSH, podman) can leave the stdin it shared non-blocking, and every
    # Ansible tool started on that stdin refuses to run: gpuforge's own runs must not inherit it.
    write_cluster_inventory(load_cluster(LAB), tmp_path / "inv")
    read, write = os.pipe()
    os.set_blocking(read, False)
    script = (
        "import sys\n"
        "from gpuforge.inventory.reader import list_inventory\n"
        "print(len(list_inventory(sys.argv[1])['_meta']['hostvars']))\n"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "inv")],
            stdin=read,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        os.close(read)
        os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) == 9  # ctl01 and gpu01-08
