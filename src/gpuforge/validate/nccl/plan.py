"""The multi-node acceptance tests of a batch, derived from the topology (leaves per rail)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuforge.validate.nccl.localize import Group


@dataclass(frozen=True)
class FabricNode:
    """What the NCCL plan needs of a node: its name and the leaf of each rail."""

    hostname: str
    leaves: tuple[str, ...]
    devices: tuple[str, ...] = ()

    @property
    def leaf_key(self) -> str:
        """Nodes with the same key sit on the same leaves on every rail."""
        return "+".join(self.leaves)


@dataclass(frozen=True)
class PlannedTest:
    """One multi-node collective of the acceptance plan."""

    name: str
    groups: tuple[Group, ...]  # run in parallel; each must pass
    rail: int | None = None


def acceptance_plan(nodes: Sequence[FabricNode]) -> list[PlannedTest]:
    """The multi-node tests, from the topology.

    * ``batch``: every node in one all_reduce.
    * ``rail<r>``: every node, NCCL restricted to rail ``r``'s NIC: a bad NIC, cable or leaf port
      on that rail cannot hide behind the other rails.
    * ``cross-leaf-a``/``-b``: pairs across neighbouring leaf groups, node i of one leaf group with
      node i of the next, in two rounds so that every leaf group talks to both neighbours; each
      node gets a distinct remote destination, which spreads the flows over the spines (IB routes
      by destination LID), so every leaf-spine uplink carries traffic.
    """
    if len(nodes) < 2:
        return []
    names = tuple(n.hostname for n in nodes)
    plan = [PlannedTest("batch", (names,))]
    rails = min(len(n.leaves) for n in nodes)
    plan += [PlannedTest(f"rail{r}", (names,), rail=r) for r in range(rails)]
    by_leaf: dict[str, list[str]] = {}
    for n in nodes:
        by_leaf.setdefault(n.leaf_key, []).append(n.hostname)
    keys = sorted(by_leaf)
    if len(keys) >= 2:
        for tag, start in (("a", 0), ("b", 1)):
            pairs: list[Group] = []
            used: set[str] = set()
            for j in range(start, len(keys) if len(keys) > 2 else 1, 2):
                left, right = by_leaf[keys[j]], by_leaf[keys[(j + 1) % len(keys)]]
                for x, y in zip(left, right, strict=False):
                    if x not in used and y not in used:
                        pairs.append((x, y))
                        used |= {x, y}
            if pairs:
                plan.append(PlannedTest(f"cross-leaf-{tag}", tuple(pairs)))
    return plan
