"""Fabric findings in the terms of the generated topology: a leaf switch, or a rail's link.

The localization blames leaf groups: in all-rail tests a node's key joins its leaves on every
rail (``leaf-su01-r0+leaf-su01-r1+...``), in a one-rail test it is that rail's leaf. What an
operator acts on is a switch or a link, so :func:`merge_findings` rewrites one batch's findings:

- a leaf blamed in a one-rail test stays a ``leaf-uplink`` finding on that switch, with its
  uplinks (count and spines) from ``topology.json``;
- when every leaf of a rail that the batch uses is blamed, the rail is: one ``rail-link`` finding
  on the rail's spine layer, not one per leaf;
- with only two leaves on a rail nothing can tell which side's uplinks are slow: a
  ``rail-link`` finding on the path between them;
- an all-rail finding whose leaf group holds a switch that a one-rail finding names is dropped:
  the one-rail finding is the precise one.

Nodes are never blamed here: a fabric finding drains no node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuforge.validate.nccl.plan import FabricNode
from gpuforge.validate.result import FabricFinding


@dataclass(frozen=True)
class FabricMap:
    """The switches a batch's collectives cross, from the generated ``topology.json``."""

    rail_of_leaf: dict[str, int] = field(default_factory=dict)
    """Each leaf the batch uses, with its rail (the index of the node's rail it serves)."""
    spines: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """The spines of each rail's plane (rail-optimized fabrics), by rail."""
    uplinks: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per leaf: links to each upper switch."""

    @classmethod
    def build(cls, nodes: Sequence[FabricNode], topology: Mapping[str, Any]) -> FabricMap:
        """Leaves from the batch's nodes; spines and uplinks from ``topology.json``."""
        rail_of_leaf = {leaf: r for n in nodes for r, leaf in enumerate(n.leaves)}
        switch_fields = list(topology.get("switch_fields") or [])
        link_fields = list(topology.get("link_fields") or [])
        switches = [
            dict(zip(switch_fields, row, strict=False)) for row in _rows(topology, "switches")
        ]
        links = [dict(zip(link_fields, row, strict=False)) for row in _rows(topology, "links")]
        spines: dict[int, list[str]] = {}
        for sw in switches:
            if sw.get("kind") == "spine" and isinstance(sw.get("plane"), int):
                spines.setdefault(int(sw["plane"]), []).append(str(sw["name"]))
        uplinks: dict[str, dict[str, int]] = {}
        for link in links:
            lower = str(link.get("lower"))
            if lower in rail_of_leaf:
                upper = uplinks.setdefault(lower, {})
                upper[str(link.get("upper"))] = upper.get(str(link.get("upper")), 0) + 1
        return cls(rail_of_leaf, {p: tuple(sorted(s)) for p, s in spines.items()}, uplinks)

    def leaves(self, rail: int) -> list[str]:
        """The leaves of ``rail`` the batch uses."""
        return sorted(leaf for leaf, r in self.rail_of_leaf.items() if r == rail)

    def describe_uplinks(self, leaf: str) -> str:
        """``32 uplinks to spine-r0-01`` (or nothing when the topology has no links)."""
        ups = self.uplinks.get(leaf)
        if not ups:
            return ""
        return f"{sum(ups.values())} uplinks to {', '.join(sorted(ups))}"


def _rows(topology: Mapping[str, Any], key: str) -> Iterable[Sequence[Any]]:
    rows = topology.get(key) or []
    return [r for r in rows if isinstance(r, list | tuple)]


def merge_findings(findings: Iterable[FabricFinding], fabric: FabricMap) -> list[FabricFinding]:
    """One batch's findings, deduplicated and named by switch or rail (see the module doc)."""
    unique = list({(f.kind, f.subject): f for f in findings}.values())
    out: list[FabricFinding] = []
    one_rail: dict[int, list[FabricFinding]] = {}
    paths: list[tuple[int, FabricFinding]] = []
    for f in unique:
        rail = fabric.rail_of_leaf.get(f.subject)
        if f.kind == "leaf-uplink" and rail is not None:
            one_rail.setdefault(rail, []).append(f)
            continue
        path_rail = _path_rail(f.subject, fabric)
        if f.kind == "leaf-path" and path_rail is not None:
            paths.append((path_rail, f))
            continue
        out.append(f)
    named: set[str] = set()
    for rail, blamed in sorted(one_rail.items()):
        leaves = sorted(f.subject for f in blamed)
        named |= set(leaves)
        if len(leaves) >= 2 and leaves == fabric.leaves(rail):
            out.append(_rail_finding(rail, fabric, blamed))
            continue
        for f in blamed:
            ups = fabric.describe_uplinks(f.subject)
            detail = f"{f.detail}; its {ups}" if ups else f.detail
            out.append(FabricFinding(f.kind, f.subject, detail, f.evidence))
    for rail, f in paths:
        a, b = f.subject.split(" <-> ")
        named |= {a, b}
        spines = ", ".join(fabric.spines.get(rail, ())) or "the rail's spines"
        out.append(
            FabricFinding(
                "rail-link",
                f"rail {rail}: {f.subject}",
                f"collectives on rail {rail} between {a} and {b} underperform while each leaf "
                f"passes alone: {a}'s uplinks, {b}'s uplinks or {spines} (no third leaf on this "
                "rail to tell which)",
                f.evidence,
            )
        )
    return [f for f in out if not _superseded(f, named)]


def _path_rail(subject: str, fabric: FabricMap) -> int | None:
    """The rail of a path between two single leaves of one rail, else None."""
    ends = subject.split(" <-> ")
    rails = {fabric.rail_of_leaf.get(e) for e in ends}
    if len(ends) != 2 or len(rails) != 1:
        return None
    return rails.pop()


def _rail_finding(rail: int, fabric: FabricMap, blamed: Sequence[FabricFinding]) -> FabricFinding:
    spines = ", ".join(fabric.spines.get(rail, ())) or "the rail's spines"
    leaves = ", ".join(fabric.leaves(rail))
    return FabricFinding(
        "rail-link",
        f"rail {rail}",
        f"every leaf of rail {rail} ({leaves}) is slow across leaves and fine within: the rail's "
        f"spine layer ({spines}) or the links to it",
        "\n".join(dict.fromkeys(f.evidence for f in blamed if f.evidence)),
    )


def _superseded(finding: FabricFinding, named: set[str]) -> bool:
    """An all-rail finding on a leaf group that holds a switch a one-rail finding names."""
    if finding.kind not in ("leaf-uplink", "leaf-path"):
        return False
    switches = {s for side in finding.subject.split(" <-> ") for s in side.split("+")}
    return len(switches) > 1 and bool(switches & named)
