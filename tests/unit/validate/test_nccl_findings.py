"""Slow links between leaves are reported as a switch or a rail link, never as nodes."""

from __future__ import annotations

from typing import Any

from gpuforge.validate.nccl import FabricMap, FabricNode, Localizer, merge_findings
from gpuforge.validate.result import FabricFinding

GOOD, SLOW, FLOOR = 48.0, 12.0, 40.0  # one NIC's busbw, a quarter of it, the floor


def cluster(sus: int, per_su: int = 4, rails: int = 2) -> tuple[list[FabricNode], dict[str, Any]]:
    """A rail-optimized fabric as topology.json describes it: leaf-suNN-rR, spines per rail."""
    nodes = [
        FabricNode(
            f"gpu{su}{i}",
            tuple(f"leaf-su{su:02d}-r{r}" for r in range(rails)),
            tuple(f"mlx5_{r}" for r in range(rails)),
        )
        for su in range(1, sus + 1)
        for i in range(per_su)
    ]
    switches = [
        [f"leaf-su{su:02d}-r{r}", "leaf", r, su, None, 64]
        for su in range(1, sus + 1)
        for r in range(rails)
    ]
    switches += [[f"spine-r{r}-01", "spine", r, None, None, 64] for r in range(rails)]
    links = [
        [f"leaf-su{su:02d}-r{r}", str(33 + k), f"spine-r{r}-01", k + 1, 2]
        for su in range(1, sus + 1)
        for r in range(rails)
        for k in range(4)
    ]
    topology = {
        "switch_fields": ["name", "kind", "plane", "su", "pod", "radix"],
        "switches": switches,
        "link_fields": ["lower", "lower_port", "upper", "upper_port", "tier"],
        "links": links,
    }
    return nodes, topology


def rail_test(
    nodes: list[FabricNode], rail: int, slow_leaves: set[str]
) -> tuple[list[FabricFinding], tuple[str, ...], tuple[str, ...]]:
    """Localize a one-rail all_reduce where traffic leaving ``slow_leaves`` crawls."""
    leaf = {n.hostname: n.leaves[rail] for n in nodes}

    def run(group: tuple[str, ...]) -> float:
        used = {leaf[n] for n in group}
        return SLOW if len(used) > 1 and used & slow_leaves else GOOD

    loc = Localizer(run, FLOOR, leaf, rail=rail).localize([n.hostname for n in nodes])
    return list(loc.findings), loc.culprits, loc.unresolved


def test_a_slow_leaf_uplink_is_reported_as_that_switch() -> None:
    nodes, topology = cluster(sus=3)
    findings, culprits, unresolved = rail_test(nodes, 1, {"leaf-su02-r1"})
    assert (culprits, unresolved) == ((), ())  # no node drained or held for it
    merged = merge_findings(findings, FabricMap.build(nodes, topology))
    assert [(f.kind, f.subject) for f in merged] == [("leaf-uplink", "leaf-su02-r1")]
    assert "on rail 1" in merged[0].detail
    assert "4 uplinks to spine-r1-01" in merged[0].detail


def test_a_rail_slow_between_every_leaf_is_reported_as_the_rail() -> None:
    nodes, topology = cluster(sus=4)
    slow = {f"leaf-su{su:02d}-r0" for su in range(1, 5)}
    findings, culprits, _ = rail_test(nodes, 0, slow)
    assert culprits == ()
    merged = merge_findings(findings, FabricMap.build(nodes, topology))
    assert [(f.kind, f.subject) for f in merged] == [("rail-link", "rail 0")]
    assert "spine-r0-01" in merged[0].detail


def test_two_leaves_on_a_rail_name_the_link_between_them() -> None:
    nodes, topology = cluster(sus=2)
    findings, culprits, unresolved = rail_test(nodes, 0, {"leaf-su01-r0"})
    assert (culprits, unresolved) == ((), ())
    merged = merge_findings(findings, FabricMap.build(nodes, topology))
    assert [(f.kind, f.subject) for f in merged] == [
        ("rail-link", "rail 0: leaf-su01-r0 <-> leaf-su02-r0")
    ]


def test_the_one_rail_finding_replaces_the_all_rail_one_and_duplicates_merge() -> None:
    nodes, topology = cluster(sus=3)
    all_rails = FabricFinding("leaf-uplink", "leaf-su02-r0+leaf-su02-r1", "all-rail test")
    one_rail = FabricFinding("leaf-uplink", "leaf-su02-r1", "rail test")
    other = FabricFinding("nccl-unresolved", "gpu1[0-3]", "noise")
    merged = merge_findings(
        [all_rails, one_rail, one_rail, other], FabricMap.build(nodes, topology)
    )
    assert sorted((f.kind, f.subject) for f in merged) == [
        ("leaf-uplink", "leaf-su02-r1"),
        ("nccl-unresolved", "gpu1[0-3]"),
    ]
