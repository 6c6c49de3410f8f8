"""The acceptance suite's per-rail checks run over the rails the inventory gives each node type."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuforge.generate import write_inventory
from gpuforge.topology import load_cluster

REPO = Path(__file__).resolve().parents[3]
LAB = REPO / "examples" / "topologies" / "lab.yaml"


def _collect(inventory: Path, tmp: Path) -> list[str]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(REPO / "validators" / "test_fabric.py"),
            "-c",
            str(REPO / "validators" / "pytest.ini"),
            "--collect-only",
            "-q",
            "--hosts=ansible://gpu_nodes",
            f"--ansible-inventory={inventory}",
        ],
        cwd=tmp,
        env={
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp"),
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return [line for line in out.stdout.splitlines() if "::" in line]


@pytest.mark.slow
def test_rails_come_from_the_inventory(tmp_path: Path) -> None:
    spec = yaml.safe_load(LAB.read_text())
    # Four rails instead of eight: the suite must collect rails 0-3 only (it used to run 0-15
    # and skip what a node lacks, a skip row per missing rail and node in the report).
    for node_type in spec["node_types"].values():
        if node_type.get("rails"):
            node_type["rails"] = node_type["rails"][:4]
    spec["fabric"]["rails"] = 4
    spec["addressing"]["rails"] = spec["addressing"]["rails"][:4]
    path = tmp_path / "lab4.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    inventory = tmp_path / "inventory"
    write_inventory(load_cluster(path), inventory)

    items = _collect(inventory / "hosts.yml", tmp_path)
    ports = [i for i in items if "::test_port[" in i]
    params = [m.groups() for i in ports if (m := re.search(r"\[(\d+)-ansible://([^\]]+)\]", i))]
    assert len(params) == len(ports)
    rails = {int(rail) for rail, _ in params}
    hosts = {host for _, host in params}
    assert rails == {0, 1, 2, 3}
    assert len(hosts) == len(load_cluster(path).gpu_nodes)
    assert len(ports) == 4 * len(hosts)
