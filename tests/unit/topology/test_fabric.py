"""Fat-tree arithmetic, checked against hand-computed cases (radix 64 = QM9700)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuforge.topology import Link, load_cluster
from gpuforge.topology.fabric import FabricImpossible, leaf_split, plan_fabric

from ..conftest import EXAMPLES


def superpod(nodes: int, **overrides: object) -> object:
    args: dict[str, object] = {
        "gpu_nodes": nodes,
        "nodes_per_su": 32,
        "rails": 8,
        "radix": 64,
        "oversubscription": 1.0,
        "rail_optimized": True,
    }
    args.update(overrides)
    return plan_fabric(**args)  # type: ignore[arg-type]


def test_leaf_split_non_blocking_is_half_and_half() -> None:
    assert leaf_split(64, 1.0) == (32, 32)


def test_leaf_split_oversubscribed_moves_ports_down() -> None:
    # 3:1 on radix 64: 48 ports to nodes, 16 to spines.
    assert leaf_split(64, 3.0) == (48, 16)
    assert leaf_split(64, 2.0) == (42, 22)


def test_four_sus_of_32_is_the_superpod_two_tier_build() -> None:
    plan = plan_fabric(
        gpu_nodes=128, nodes_per_su=32, rails=8, radix=64, oversubscription=1.0, rail_optimized=True
    )
    assert (plan.tiers, plan.planes, plan.down, plan.up) == (2, 8, 32, 32)
    # Per rail: 4 SU leaves, ceil(4 * 32 / 64) = 2 spines, 16 cables from each leaf to each.
    assert (plan.leaves, plan.spines, plan.links_per_leaf_spine) == (4, 2, 16)
    # Whole fabric: 32 leaves and 16 spines, as in the DGX SuperPOD 4-SU design.
    assert (plan.leaves * plan.planes, plan.spines * plan.planes) == (32, 16)
    assert plan.bisection_gbps(400) == 128 * 400 / 2


def test_two_tiers_hold_radix_squared_over_two_per_rail() -> None:
    full = superpod(64 * 64 // 2)  # 2,048 nodes = 64 SUs = 64 leaves per rail
    assert (full.tiers, full.leaves, full.spines, full.links_per_leaf_spine) == (2, 64, 32, 1)
    over = superpod(64 * 64 // 2 + 1)  # one node more needs a 65th leaf
    assert over.tiers == 3


def test_three_tiers_pods_and_core_groups() -> None:
    plan = superpod(2049)  # 65 leaves per rail
    # Pods of radix/2 = 32 leaves (SUs) under 32 spines; 3 pods.
    assert (plan.sus_per_pod, plan.pods, plan.spines_per_pod, plan.spines) == (32, 3, 32, 96)
    # Each spine index j reaches a core group of the smallest divisor of 32 >= ceil(3*32/64)=2.
    assert (plan.core_group, plan.links_per_spine_core, plan.cores) == (2, 16, 64)


def test_three_tiers_hold_radix_cubed_over_four_per_rail() -> None:
    assert superpod(64**3 // 4).pods == 64
    with pytest.raises(FabricImpossible) as err:
        superpod(64**3 // 4 + 1)
    assert err.value.field == "fabric.radix"
    assert "65537 endpoints per plane exceed the 65536" in str(err.value)


def test_rail_optimized_su_larger_than_leaf_is_impossible() -> None:
    with pytest.raises(FabricImpossible) as err:
        superpod(128, nodes_per_su=40)
    assert err.value.field == "fabric.radix"
    assert "SU of 40 nodes needs 40 on each rail leaf" in str(err.value)


def test_not_rail_optimized_packs_whole_nodes_per_leaf() -> None:
    plan = superpod(128, rail_optimized=False)
    # 32 down ports / 8 rails = 4 nodes per leaf; 8 leaves per SU; one plane of 1,024 ports.
    assert (plan.planes, plan.nodes_per_leaf, plan.leaves_per_su, plan.leaves) == (1, 4, 8, 32)
    assert plan.endpoints == 1024
    assert plan.tiers == 2
    assert superpod(2049, rail_optimized=False).tiers == 3


def test_not_rail_optimized_radix_below_rails_is_impossible() -> None:
    with pytest.raises(FabricImpossible, match="fewer than the 8 rails"):
        superpod(8, radix=8, rail_optimized=False)


def test_partial_last_su_gets_only_the_leaves_it_needs() -> None:
    plan = superpod(40, rail_optimized=False)  # SU 1: 8 leaves, SU 2: 8 nodes -> 2 leaves
    assert plan.su_leaves == (8, 2)


@pytest.mark.parametrize(
    "name", ["lab.yaml", "superpod-4su.yaml", "nvl72.yaml", "cluster-10k.yaml"]
)
def test_cabling_uses_each_port_once_within_radix(name: str) -> None:
    cluster = load_cluster(EXAMPLES / name)
    radix = {s.name: s.radix for s in cluster.switches}
    ports: Counter[tuple[str, str]] = Counter()
    for link in cluster.links:
        assert link.upper in radix
        ports[(link.upper, str(link.upper_port))] += 1
        if link.lower in radix:
            ports[(link.lower, link.lower_port)] += 1
    assert max(ports.values()) == 1
    assert all(1 <= int(port) <= radix[name] for name, port in ports)
    # Every leaf uplink is cabled: leaves use all `up` ports toward spines.
    up_links = Counter(link.lower for link in cluster.links if link.tier == 2)
    leaves = [s for s in cluster.switches if s.kind == "leaf"]
    assert {up_links[s.name] for s in leaves} == {cluster.fabric.up}


def test_superpod_example_counts() -> None:
    cluster = load_cluster(EXAMPLES / "superpod-4su.yaml")
    kinds = Counter(s.kind for s in cluster.switches)
    assert kinds == {"leaf": 32, "spine": 16}
    assert cluster.fabric.tiers == 2
    assert len(cluster.links) == 128 * 8 + 32 * 32


_SHAPES = {
    "as written": {},
    "not rail-optimized": {"rail_optimized": False},
    "not rail-optimized, radix 128": {"rail_optimized": False, "radix": 128},
    "2:1": {"oversubscription": 2.0},
}


@pytest.mark.parametrize("shape", sorted(_SHAPES))
@pytest.mark.parametrize("name", ["lab.yaml", "superpod-4su.yaml", "cluster-10k.yaml"])
def test_link_counts_are_the_rows_the_links_make(
    name: str, shape: str, write_spec: Callable[[dict[str, Any]], Path]
) -> None:
    """``topology check`` counts links from the plan (it never makes them): the counts per tier
    are the rows, and the rows are the Links, in one order, each time they are read."""
    data = yaml.safe_load((EXAMPLES / name).read_text())
    data["fabric"].update(_SHAPES[shape])
    cluster = load_cluster(write_spec(data))
    links = list(cluster.links)
    assert all(type(link) is Link for link in links)
    assert Counter(link.tier for link in links) == {
        tier: cluster.links.tier(tier) for tier in (1, 2, 3) if cluster.links.tier(tier)
    }
    assert len(links) == len(cluster.links)
    assert list(cluster.links.rows()) == [tuple(link) for link in links]
    assert list(cluster.links) == links  # made again, the same
    node_links = [link for link in links if link.tier == 1]
    assert node_links == [
        (n.hostname, p.device, p.leaf, p.port, 1) for n in cluster.nodes for p in n.rails
    ]
    assert links[0] in cluster.links and ("x", "y", "z", 1, 1) not in cluster.links
    assert cluster.links.tier(4) == 0 and cluster.fabric.tiers == max(link.tier for link in links)
