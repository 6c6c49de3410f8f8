"""Expansion of the examples: placement, addresses, leaves, phases, determinism."""

from __future__ import annotations

import json
import random
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hostlist
import pytest

from gpuforge.topology import Problem, SpecError, Topology, expand, load_cluster, load_spec
from gpuforge.topology.check import _plan_phases

from ..conftest import EXAMPLES, LAB


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_is_valid(path: Path) -> None:
    topo = load_spec(path)
    assert isinstance(topo, Topology)


def test_lab_nodes_follow_the_contract() -> None:
    cluster = load_cluster(LAB)
    assert [n.hostname for n in cluster.nodes] == ["ctl01"] + [f"gpu{i:02d}" for i in range(1, 9)]
    ctl, gpu01, gpu05 = cluster.node("ctl01"), cluster.node("gpu01"), cluster.node("gpu05")
    assert (ctl.role, ctl.su, ctl.phase, ctl.rails, ctl.rack) == ("controller", 0, 1, (), "svc01")
    assert (gpu01.role, gpu01.rack, gpu01.su, gpu01.phase) == ("gpu", "r001", 1, 1)
    assert (gpu05.rack, gpu05.su, gpu05.phase) == ("r002", 1, 2)
    assert gpu01.fqdn == "gpu01.lab.gpuforge.test"
    # Node number 1 (ctl01 is 0) at offset 10 in every subnet.
    assert (gpu01.mgmt_address, gpu01.bmc_address) == ("10.231.0.11", "10.231.1.11")
    rail7 = gpu05.rails[7]
    assert (rail7.rail, rail7.device, rail7.netdev) == (7, "mlx5_7", "ib7")
    assert rail7.address == "10.100.7.15/24"
    assert (rail7.leaf, rail7.port) == ("leaf-su01-r7", 5)


def test_lab_phases_and_gates() -> None:
    cluster = load_cluster(LAB)
    canary, wave = cluster.phases
    assert (canary.number, canary.name, canary.hostlist) == (1, "canary", "gpu[01-04]")
    assert (wave.number, wave.hostlist) == (2, "gpu[05-08]")
    assert canary.min_pass_fraction == 0.75
    assert canary.required_passes == 3


def test_non_rail_optimized_nodes_keep_all_rails_on_one_leaf(
    lab_data: dict[str, Any], write_spec: Callable[[dict[str, Any]], Path]
) -> None:
    lab_data["fabric"]["rail_optimized"] = False
    cluster = load_cluster(write_spec(lab_data))
    gpu01, gpu05 = cluster.node("gpu01"), cluster.node("gpu05")
    assert {p.leaf for p in gpu01.rails} == {"leaf-001"}
    assert {p.leaf for p in gpu05.rails} == {"leaf-002"}  # 4 nodes x 8 rails fill 32 ports
    assert [p.port for p in gpu05.rails] == list(range(1, 9))


def test_nvl72_blocks_are_racks() -> None:
    cluster = load_cluster(EXAMPLES / "nvl72.yaml")
    gpu = cluster.gpu_nodes
    assert cluster.topology_plugin == "block"
    blocks = Counter(n.nvlink_block for n in gpu)
    assert set(blocks.values()) == {18} and len(blocks) == 16
    assert all(len({n.rack for n in gpu if n.nvlink_block == b}) == 1 for b in blocks)


def test_expand_is_deterministic() -> None:
    topo = load_spec(EXAMPLES / "superpod-4su.yaml")
    assert expand(topo) == expand(topo)


def test_expand_rejects_an_unchecked_bad_model(lab_data: dict[str, Any]) -> None:
    lab_data["layout"]["rack_power_kw"] = 1
    topo = Topology.model_validate(lab_data)
    with pytest.raises(SpecError, match=r"^<spec>: layout.rack_power_kw: "):
        expand(topo)


def test_10k_example_shape() -> None:
    cluster = load_cluster(EXAMPLES / "cluster-10k.yaml")
    assert len(cluster.gpu_nodes) == 1250
    assert cluster.gpus == 10_000
    assert cluster.fabric.tiers == 3
    # Every GPU node has one port on each of the 8 rail planes, on the leaf of its SU.
    for node in cluster.gpu_nodes[::97]:
        assert [p.leaf for p in node.rails] == [f"leaf-su{node.su:02d}-r{r}" for r in range(8)]
    addresses = [p.address for n in cluster.gpu_nodes for p in n.rails]
    assert len(set(addresses)) == len(addresses)


def test_schema_is_json_and_forbids_extra_fields() -> None:
    schema = Topology.model_json_schema()
    json.dumps(schema)
    assert schema["additionalProperties"] is False
    assert "fabric" in schema["required"]
    assert schema["$defs"]["Fabric"]["additionalProperties"] is False


def test_a_load_analyses_the_spec_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cross-field analysis (hostnames, fabric, phases) ran twice per load before the split."""
    from gpuforge.topology import check, load  # noqa: PLC0415

    # The package's ``expand`` is the function; the module is reached through sys.modules.
    expand_module = sys.modules["gpuforge.topology.expand"]
    calls: list[str] = []

    def counted(topo: Topology) -> check.Analysis:
        calls.append(topo.name)
        return check.analyse(topo)

    monkeypatch.setattr(load, "analyse", counted)
    monkeypatch.setattr(expand_module, "analyse", counted)
    load_cluster(LAB)
    assert calls == ["lab"]


def _reference_phases(phases: list[dict[str, Any]], gpu: list[str], per_su: int) -> list[Any]:
    """What each phase selects, by list scans (quadratic, plain): the planner's model."""
    owner: dict[str, int] = {}
    out: list[Any] = []
    for number, phase in enumerate(phases, 1):
        free = [h for h in gpu if h not in owner]
        if "count" in phase:
            chosen = free[: phase["count"]]
        elif "sus" in phase:
            sus = sorted(set(phase["sus"]))
            chosen = [h for i, h in enumerate(gpu) if i // per_su + 1 in sus and h not in owner]
        elif "hosts" in phase:
            names = set(hostlist.expand_hostlist(phase["hosts"]))
            chosen = [h for h in gpu if h in names]
        else:
            chosen = free
        fresh = [h for h in chosen if h not in owner]
        taken = [h for h in chosen if h in owner]
        owner.update(dict.fromkeys(fresh, number))
        out.append((tuple(fresh), bool(taken)))
    out.append([h for h in gpu if h not in owner])
    return out


def test_phase_planning_matches_the_list_scan_model(lab_data: dict[str, Any]) -> None:
    """Random selectors over 96 GPU nodes in SUs of 8: the planner takes what the model takes."""
    rng = random.Random(7)
    group = lab_data["node_groups"][1]
    group.update(count=96, hostname="gpu{index:03d}")
    per_su = lab_data["layout"]["nodes_per_rack"] * lab_data["layout"]["racks_per_su"]
    gpu = [f"gpu{i:03d}" for i in range(1, 97)]
    for _ in range(300):
        phases: list[dict[str, Any]] = []
        for i in range(rng.randrange(1, 8)):
            kind = rng.choice(["count", "sus", "hosts", "rest"])
            phase: dict[str, Any] = {"name": f"p{i}"}
            if kind == "count":
                phase["count"] = rng.randrange(1, 40)
            elif kind == "sus":
                phase["sus"] = sorted(rng.sample(range(1, 96 // per_su + 1), rng.randrange(1, 4)))
            elif kind == "hosts":
                first = rng.randrange(1, 90)
                phase["hosts"] = f"gpu[{first:03d}-{first + rng.randrange(0, 7):03d}]"
            else:
                phase["rest"] = True
            phases.append(phase)
        lab_data["rollout"]["phases"] = phases
        topo = Topology.model_validate(lab_data)
        problems: list[Problem] = []
        phase_of, plans = _plan_phases(topo, gpu, problems.append)
        *expected, left_out = _reference_phases(phases, gpu, per_su)
        assert [p.hosts for p in plans] == [hosts for hosts, _ in expected], phases
        assert {h: p.number for p in plans for h in p.hosts} == phase_of
        overlaps = {p.path for p in problems if "overlaps phase" in p.message}
        assert overlaps == {f"rollout.phases[{i}]" for i, (_, o) in enumerate(expected) if o}
        in_no_phase = [p.message for p in problems if "in no phase" in p.message]
        assert bool(in_no_phase) == bool(left_out)
        if left_out:
            assert in_no_phase[0].startswith(f"{len(left_out)} GPU nodes are in no phase: ")
