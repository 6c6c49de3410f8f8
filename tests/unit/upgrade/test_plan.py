"""The upgrade plan: changes per node, waves within the limits, capacity, the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from gpuforge.cli import main
from gpuforge.history.store import HistoryStore, history_path
from gpuforge.topology import load_cluster
from gpuforge.topology.cluster import Cluster
from gpuforge.upgrade.plan import (
    Installed,
    Limits,
    installed_from_records,
    node_versions,
    plan_upgrade,
    render_text,
)

from ..conftest import EXAMPLES, LAB
from ..history.records import T0, record

OLD = {
    "nvidia_driver": "570.124.06",
    "fabricmanager": "570.124.06-1",
    "cuda": "12.8.1-1",
    "nccl": "2.25.1-1+cuda12.8",
    "dcgm": "1:4.2.3-1",
    "slurm": "22.05.8-4",
}
NEW = OLD | {
    "nvidia_driver": "570.133.20",
    "fabricmanager": "570.133.20-1",
    "nccl": "2.26.2-1+cuda12.8",
}


@pytest.fixture(scope="module")
def lab() -> Cluster:
    return load_cluster(LAB)


def _all(cluster: Cluster, versions: dict[str, str]) -> dict[str, Installed]:
    return {n.hostname: Installed(dict(versions), "test") for n in cluster.gpu_nodes}


def test_node_versions_parses_the_checks_measured_text() -> None:
    measured = "cuda=12.8.1-1, dcgm=1:4.2.3-1, driver=570.133.20,570.124.06, nccl=absent"
    assert node_versions(measured) == {
        "cuda": "12.8.1-1",
        "dcgm": "1:4.2.3-1",
        "nvidia_driver": "570.133.20,570.124.06",
        "nccl": None,
    }


def test_up_to_date_fleet_has_no_wave(lab: Cluster) -> None:
    plan = plan_upgrade(lab, _all(lab, NEW))
    assert plan.waves == ()
    assert len(plan.up_to_date) == 8


def test_driver_and_nccl_change_with_reboot(lab: Cluster) -> None:
    plan = plan_upgrade(lab, _all(lab, OLD))
    step = plan.steps[0]
    assert [(c.component, c.current, c.target) for c in step.changes] == [
        ("nvidia_driver", "570.124.06", "570.133.20"),
        ("fabricmanager", "570.124.06-1", "570.133.20"),
        ("nccl", "2.25.1-1+cuda12.8", "2.26.2"),
    ]
    assert step.reboot
    assert {s.node for s in plan.steps} == {f"gpu{i:02d}" for i in range(1, 9)}


def test_library_only_change_needs_no_reboot(lab: Cluster) -> None:
    plan = plan_upgrade(lab, _all(lab, NEW | {"nccl": "2.25.1-1+cuda12.8"}))
    assert plan.steps and not any(s.reboot for s in plan.steps)


def test_lab_default_limits_one_node_at_a_time(lab: Cluster) -> None:
    """Lab: 10% of 64 GPUs is 6, less than a node: one node per wave, canary phase first."""
    plan = plan_upgrade(lab, _all(lab, OLD))
    assert [len(w.steps) for w in plan.waves] == [1] * 8
    assert [w.phase for w in plan.waves] == ["canary"] * 4 + ["wave1"] * 4
    assert plan.waves[0].nodes == ("gpu01",)
    assert plan.min_in_service_fraction == pytest.approx(56 / 64)
    assert any("fewer than one unit" in n for n in plan.notes)


def test_waves_never_mix_phases_and_respect_per_leaf(lab: Cluster) -> None:
    plan = plan_upgrade(lab, _all(lab, OLD), Limits(max_per_leaf=3, max_fraction=0.5))
    assert [w.nodes for w in plan.waves] == [
        ("gpu01", "gpu02", "gpu03"),
        ("gpu04",),
        ("gpu05", "gpu06", "gpu07"),
        ("gpu08",),
    ]
    assert all(w.in_service_fraction >= 0.5 for w in plan.waves)


def test_partition_share_caps_a_wave(lab: Cluster) -> None:
    plan = plan_upgrade(lab, _all(lab, OLD), Limits(max_per_leaf=8, max_fraction=0.25))
    assert [len(w.steps) for w in plan.waves] == [2, 2, 2, 2]
    assert all(w.gpus_in_service == 48 for w in plan.waves)
    assert not any("fewer than one unit" in n for n in plan.notes)


@pytest.fixture(scope="module")
def c10k() -> Cluster:
    return load_cluster(EXAMPLES / "cluster-10k.yaml")


def test_large_fleet_default_takes_whole_leaves_and_keeps_90_percent(c10k: Cluster) -> None:
    plan = plan_upgrade(c10k, _all(c10k, OLD))
    assert len(plan.steps) == len(c10k.gpu_nodes)
    assert plan.min_in_service_fraction >= 0.90
    leaf_size: dict[str, int] = {}
    for step in plan.steps:
        leaf_size[step.leaf] = leaf_size.get(step.leaf, 0) + 1
    phase_of = {n.hostname: n.phase for n in c10k.gpu_nodes}
    for wave in plan.waves:
        per_leaf: dict[str, int] = {}
        for step in wave.steps:
            per_leaf[step.leaf] = per_leaf.get(step.leaf, 0) + 1
        # At most one leaf of a wave is partly out (the phase or the cap cuts it).
        partial = [leaf for leaf, n in per_leaf.items() if n < leaf_size[leaf]]
        assert len(partial) <= 2, (wave.number, partial)
        assert len({phase_of[s.node] for s in wave.steps}) == 1
    # Whole leaves: about 1 / max_fraction waves, not one per node of a leaf.
    assert len(plan.waves) <= 10 + 2 * len(c10k.phases)


def test_one_per_leaf_spreads_the_wave(c10k: Cluster) -> None:
    plan = plan_upgrade(c10k, _all(c10k, OLD), Limits(max_per_leaf=1, max_fraction=0.1))
    for wave in plan.waves:
        leaves = [s.leaf for s in wave.steps]
        assert len(leaves) == len(set(leaves))
    assert plan.min_in_service_fraction >= 0.90
    assert len(plan.waves) > 20


def test_nvlink_domain_moves_as_one_unit() -> None:
    cluster = load_cluster(EXAMPLES / "nvl72.yaml")
    plan = plan_upgrade(cluster, _all(cluster, OLD))  # 10%: 115 GPUs, 28 nodes, 1.6 domains
    block = {n.hostname: n.nvlink_block for n in cluster.gpu_nodes}
    assert [len(w.steps) for w in plan.waves] == [18] * 16
    for wave in plan.waves:
        blocks = {block[s.node] for s in wave.steps}
        for b in blocks:
            members = {n for n, nb in block.items() if nb == b}
            assert members <= set(wave.nodes), f"domain {b} split across waves"


def test_unknown_node_planned_conservatively(lab: Cluster) -> None:
    installed = _all(lab, NEW)
    del installed["gpu03"]
    plan = plan_upgrade(lab, installed)
    assert plan.unknown == ("gpu03",)
    (step,) = plan.steps
    assert step.node == "gpu03" and step.reboot and not step.known
    assert any("no version record for gpu03" in n for n in plan.notes)


def test_installed_from_records_takes_the_newest_measurement() -> None:
    def rec(measured: str, status: str = "pass") -> dict[str, Any]:
        return {"checks": [{"check": "software.versions", "status": status, "measured": measured}]}

    got = installed_from_records(
        [
            ("gpu01", "passive", T0, rec("driver=570.124.06")),
            ("gpu01", "conformance", T0 + 60, rec("driver=570.133.20")),
            ("gpu02", "passive", T0, rec("driver=570.124.06")),
            ("gpu02", "passive", T0 + 90, rec("", status="error")),
        ]
    )
    assert got["gpu01"].versions == {"nvidia_driver": "570.133.20"}
    assert got["gpu02"].versions == {"nvidia_driver": "570.124.06"}


def _versions_record(node: str, versions: dict[str, str]) -> dict[str, Any]:
    rec = record(node)
    keyed = {("driver" if k == "nvidia_driver" else k): v for k, v in versions.items()}
    rec["checks"].append(
        {"check": "software.versions", "status": "fail", "action": "quarantine",
         "measured": ", ".join(f"{k}={v}" for k, v in sorted(keyed.items())),
         "expected": "", "detail": "", "evidence": "", "shadow": False, "streak": 1}
    )  # fmt: skip
    return rec


def test_cli_plan_from_the_history_store(tmp_path: Path, lab: Cluster) -> None:
    state = tmp_path / "state"
    path = history_path(state, lab.name)
    path.parent.mkdir(parents=True)
    with HistoryStore.open(path) as store:
        store.ingest(
            [_versions_record(n.hostname, OLD if n.hostname <= "gpu02" else NEW)
             for n in lab.gpu_nodes]
        )  # fmt: skip
    result = CliRunner().invoke(
        main, ["upgrade", "plan", str(LAB), "--state-dir", str(state), "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [w["nodes"] for w in data["waves"]] == [["gpu01"], ["gpu02"]]
    assert data["waves"][0]["gpus_in_service"] == 56
    assert data["waves"][0]["steps"][0]["reboot"] is True
    assert len(data["up_to_date"]) == 6

    text = CliRunner().invoke(
        main,
        ["upgrade", "plan", str(LAB), "--state-dir", str(state), "--max-per-leaf", "2",
         "--max-fraction", "0.5"],
    )  # fmt: skip
    assert text.exit_code == 0, text.output
    assert "wave 1 (canary): 2 nodes, 16 GPUs out, 48/64 GPUs in service (75.0%)" in text.output
    assert "gpu[01-02]: nvidia_driver 570.124.06 -> 570.133.20" in text.output
    assert "; reboot" in text.output


def test_cli_plan_refuses_incompatible_pins(tmp_path: Path) -> None:
    data: Any = yaml.safe_load(Path(LAB).read_text(encoding="utf-8"))
    data["versions"]["nvidia_driver"] = "570.86.10"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data), encoding="utf-8")
    result = CliRunner().invoke(main, ["upgrade", "plan", str(spec), "--state-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "rule cuda-minimum-driver" in result.output


def test_cli_plan_without_store_is_bad_input(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["upgrade", "plan", str(LAB), "--state-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "no history store for cluster lab" in result.output
    assert "Traceback" not in result.output


def test_spec_upgrade_section_sets_the_limits(tmp_path: Path) -> None:
    data: Any = yaml.safe_load(Path(LAB).read_text(encoding="utf-8"))
    data["upgrade"] = {"max_per_leaf": 4, "max_fraction": 0.5}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data), encoding="utf-8")
    cluster = load_cluster(spec)
    plan = plan_upgrade(cluster, _all(cluster, OLD))
    assert [len(w.steps) for w in plan.waves] == [4, 4]
    assert render_text(plan)[2].startswith("limits    4 unit(s) per leaf, 50% of partition gpu")


def test_fabric_manager_only_where_nvswitches_are(tmp_path: Path) -> None:
    data: Any = yaml.safe_load(Path(LAB).read_text(encoding="utf-8"))
    data["node_types"]["h100-sxm"]["nvswitch"] = False
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data), encoding="utf-8")
    cluster = load_cluster(spec)
    no_fm = {k: v for k, v in OLD.items() if k != "fabricmanager"}
    plan = plan_upgrade(cluster, _all(cluster, no_fm))
    assert {c.component for s in plan.steps for c in s.changes} == {"nvidia_driver", "nccl"}
