"""gpuforge.lab.faults: the simulator's view of a cluster and per-node states."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuforge.errors import InputError
from gpuforge.lab import faults
from gpuforge.topology import load_cluster

LAB_SPEC = Path(__file__).resolve().parents[3] / "examples" / "topologies" / "lab.yaml"


@pytest.fixture(scope="module")
def info() -> dict:
    return faults.cluster_info(load_cluster(LAB_SPEC))


def test_cluster_info_describes_every_node(info: dict) -> None:
    assert info["name"] == "lab"
    assert info["fabric"] == {"kind": "infiniband", "rate_gbps": 400}
    gpu = next(n for n in info["nodes"] if n["hostname"] == "gpu01")
    assert (gpu["gpus"], gpu["gpu_model"], gpu["nvswitch"]) == (8, "H100-SXM-80GB", True)
    assert [r["device"] for r in gpu["rails"]] == [f"mlx5_{i}" for i in range(8)]
    assert all(r["leaf"] and r["rate_gbps"] == 400 for r in gpu["rails"])


def test_every_node_gets_its_own_state(info: dict) -> None:
    states = faults.node_states(faults.NO_FAULTS, info)
    assert sorted(states) == sorted(n["hostname"] for n in info["nodes"])
    assert all(state["hostname"] == host for host, state in states.items())


def test_a_fault_lands_on_its_node(info: dict, tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_text("version: 1\nfaults:\n  - {node: gpu02, kind: gpu_missing, gpu: 3}\n")
    states = faults.node_states(faults.load_fault_file(path), info)
    assert [f["kind"] for f in states["gpu01"]["nodes"]["gpu02"]["faults"]] == ["gpu_missing"]


def test_a_fault_on_an_unknown_node_is_bad_input(info: dict, tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_text("version: 1\nfaults:\n  - {node: gpu99, kind: gpu_missing, gpu: 3}\n")
    with pytest.raises(InputError, match="gpu99"):
        faults.node_states(faults.load_fault_file(path), info)


def test_a_malformed_fault_file_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_text("faults: [{node: gpu01, kind: no_such_kind}]\n")
    with pytest.raises(InputError):
        faults.load_fault_file(path)
