"""Fat-tree arithmetic for the compute fabric.

The model follows the NVIDIA DGX SuperPOD reference architecture (DGX H100 SuperPOD RA,
compute fabric): scalable units (SUs) of 32 nodes, rail-optimized, built from QM9700
switches of radix 64. Terms and formulas:

* A *plane* is one independent fat tree. A rail-optimized fabric has one plane per rail
  (rail r of every node lands in plane r); otherwise one plane carries every rail.
* A leaf of radix R at oversubscription o (down:up bandwidth) gives
  ``down = floor(R * o / (1 + o))`` ports to nodes and ``up = R - down`` to spines;
  non-blocking 1:1 is R/2 down, R/2 up.
* Rail-optimized: each SU has one leaf per rail, holding rail r of all the SU's nodes, so an SU
  needs ``nodes_per_su <= down`` (32 nodes on a radix-64 leaf in the SuperPOD). Otherwise a
  leaf holds ``down // rails`` whole nodes (every rail of a node on the same leaf).
* Two tiers: every leaf has an uplink to every spine, so a spine (R ports) reaches at most R
  leaves: at most ``R * down`` endpoints per plane, ``R**2 / 2`` at 1:1 (2,048 for R = 64).
* Three tiers: a pod is at most R/2 leaves under ``up`` spines that split R/2 down, R/2 up;
  each spine index j of every pod connects to core group j, and a core (R ports) reaches at
  most R pods: ``R * R/2 * down`` endpoints per plane, ``R**3 / 4`` at 1:1 (65,536 for R = 64).
* Above that the spec is impossible, and so is an SU that a leaf cannot hold.

Spines are sized to the leaves present, not to the maximum: ``spines`` is the smallest
divisor d of ``up`` with ``d >= ceil(leaves * up / R)``, each leaf sending ``up / d`` links to
each spine (4 SUs of 32 nodes at R = 64: 4 leaves and 2 spines per rail, 32 + 16 switches,
the SuperPOD's 4-SU figures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class FabricImpossible(ValueError):  # noqa: N818 - a domain outcome, raised and caught here
    """The fabric cannot be built; ``field`` is the spec field to change."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class FabricPlan:
    """The derived shape of the compute fabric; counts are per plane unless named total."""

    radix: int
    rail_optimized: bool
    planes: int
    rails: int
    down: int
    up: int
    tiers: int
    nodes_per_leaf: int
    leaves_per_su: int
    su_leaves: tuple[int, ...]  # leaves of each SU (the last SU may be partial)
    leaves: int
    endpoints: int  # ports toward nodes, per plane
    sus_per_pod: int  # three tiers only; 0 for two
    pods: int
    spines_per_pod: int  # two tiers: all spines of the plane
    links_per_leaf_spine: int
    core_group: int  # cores per spine index; 0 for two tiers
    links_per_spine_core: int

    @property
    def spines(self) -> int:
        return self.spines_per_pod * max(1, self.pods)

    @property
    def cores(self) -> int:
        return self.up * self.core_group if self.tiers == 3 else 0

    def bisection_gbps(self, rate_gbps: int) -> float:
        """Bisection bandwidth of one plane: half the lesser of node and leaf-uplink bandwidth."""
        return min(self.endpoints, self.leaves * self.up) * rate_gbps / 2

    @property
    def capacity(self) -> int:
        """Most endpoints a plane of this radix and split can hold (2 or 3 tiers)."""
        return self.radix * (self.radix // 2) * self.down


def leaf_split(radix: int, oversubscription: float) -> tuple[int, int]:
    """Ports (down, up) of a leaf; 1:1 is radix/2 each."""
    down = math.floor(radix * oversubscription / (1 + oversubscription))
    return down, radix - down


def _divisor_at_least(n: int, minimum: int) -> int:
    return next(d for d in range(max(1, minimum), n + 1) if n % d == 0)


def plan_fabric(
    *,
    gpu_nodes: int,
    nodes_per_su: int,
    rails: int,
    radix: int,
    oversubscription: float,
    rail_optimized: bool,
) -> FabricPlan:
    """Derive the fat tree; raise :class:`FabricImpossible` naming the field to change."""
    down, up = leaf_split(radix, oversubscription)
    ratio = f"{oversubscription:g}:1"
    if rail_optimized:
        if nodes_per_su > down:
            raise FabricImpossible(
                "fabric.radix",
                f"radix {radix} at {ratio} leaves {down} node ports per leaf, but a "
                f"rail-optimized SU of {nodes_per_su} nodes needs {nodes_per_su} on each rail leaf",
            )
        nodes_per_leaf, leaves_per_su, planes, ports_per_node = nodes_per_su, 1, rails, 1
    else:
        nodes_per_leaf = down // rails
        if nodes_per_leaf == 0:
            raise FabricImpossible(
                "fabric.radix",
                f"radix {radix} at {ratio} leaves {down} node ports per leaf, fewer than the "
                f"{rails} rails of one node",
            )
        leaves_per_su, planes, ports_per_node = math.ceil(nodes_per_su / nodes_per_leaf), 1, rails

    full, last = divmod(gpu_nodes, nodes_per_su)
    su_leaves = [leaves_per_su] * full
    if last:
        su_leaves.append(math.ceil(last / nodes_per_leaf))
    leaves = sum(su_leaves)
    endpoints = gpu_nodes * ports_per_node

    if leaves <= radix:
        spines = _divisor_at_least(up, math.ceil(leaves * up / radix)) if leaves else 0
        return FabricPlan(
            radix=radix,
            rail_optimized=rail_optimized,
            planes=planes,
            rails=rails,
            down=down,
            up=up,
            tiers=2,
            nodes_per_leaf=nodes_per_leaf,
            leaves_per_su=leaves_per_su,
            su_leaves=tuple(su_leaves),
            leaves=leaves,
            endpoints=endpoints,
            sus_per_pod=0,
            pods=0,
            spines_per_pod=spines,
            links_per_leaf_spine=up // spines if spines else 0,
            core_group=0,
            links_per_spine_core=0,
        )

    half = radix // 2
    if leaves_per_su > half:
        raise FabricImpossible(
            "fabric.radix",
            f"three tiers are needed, but an SU's {leaves_per_su} leaves exceed the {half} "
            f"leaves a radix-{radix} pod holds",
        )
    sus_per_pod = half // leaves_per_su
    pods = math.ceil(len(su_leaves) / sus_per_pod)
    if pods > radix:
        capacity = radix * half * down
        raise FabricImpossible(
            "fabric.radix",
            f"{endpoints} endpoints per plane exceed the {capacity} that three tiers of "
            f"radix {radix} at {ratio} hold",
        )
    core_group = _divisor_at_least(half, math.ceil(pods * half / radix))
    return FabricPlan(
        radix=radix,
        rail_optimized=rail_optimized,
        planes=planes,
        rails=rails,
        down=down,
        up=up,
        tiers=3,
        nodes_per_leaf=nodes_per_leaf,
        leaves_per_su=leaves_per_su,
        su_leaves=tuple(su_leaves),
        leaves=leaves,
        endpoints=endpoints,
        sus_per_pod=sus_per_pod,
        pods=pods,
        spines_per_pod=up,
        links_per_leaf_spine=1,
        core_group=core_group,
        links_per_spine_core=half // core_group,
    )
