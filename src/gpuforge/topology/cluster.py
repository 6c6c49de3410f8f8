"""The expanded cluster: every node, switch, link and phase a spec describes.

:mod:`gpuforge.topology.check` checks a spec and plans its hostnames, fabric and phases;
:mod:`gpuforge.topology.expand` builds these types from that plan.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import NamedTuple

import hostlist

from gpuforge.topology.fabric import FabricPlan
from gpuforge.topology.model import Topology


class RailPort(NamedTuple):
    """One compute NIC of a node and where it lands.

    A named tuple, like :class:`Link`: a 100k-GPU cluster has 100,000 of them and half a million
    links, and ``topology.json`` writes each as the row of its fields, in this order.
    """

    rail: int
    device: str
    netdev: str
    address: str  # with prefix, e.g. 10.100.0.10/16
    leaf: str
    port: int


@dataclass(frozen=True, slots=True)
class Node:
    """One expanded node."""

    hostname: str
    fqdn: str
    role: str
    group: str
    node_type: str
    number: int  # 0-based, every node in spec order; the host part of its addresses
    rack: str
    su: int  # 1-based; 0 for service nodes
    phase: int  # 1-based
    mgmt_address: str
    bmc_address: str
    rails: tuple[RailPort, ...]
    nvlink_block: int  # 1-based NVLink domain for multi-node domains (NVL72), else 0


@dataclass(frozen=True, slots=True)
class Switch:
    """One switch of the compute fabric."""

    name: str
    tier: int  # 1 leaf, 2 spine, 3 core
    plane: int | None  # rail for a rail-optimized fabric, else None
    su: int | None  # leaves only
    pod: int | None  # three tiers: leaves and spines
    radix: int

    @property
    def kind(self) -> str:
        return ("leaf", "spine", "core")[self.tier - 1]


class Link(NamedTuple):
    """One cable: ``lower`` (a node or switch) up to ``upper``; tier 1 is node to leaf."""

    lower: str
    lower_port: str  # RDMA device for a node, port number for a switch
    upper: str
    upper_port: int
    tier: int


@dataclass(frozen=True, slots=True)
class PhasePlan:
    """One rollout phase: its GPU nodes and its gate."""

    number: int
    name: str
    hosts: tuple[str, ...]  # GPU nodes, in cluster order
    min_pass_fraction: float

    @property
    def hostlist(self) -> str:
        return compress(self.hosts)

    @property
    def required_passes(self) -> int:
        """Nodes that must pass before the next phase may start."""
        return passes_needed(self.min_pass_fraction, len(self.hosts))


def passes_needed(fraction: float, total: int) -> int:
    """Nodes of ``total`` that reach ``fraction`` (0.75 of 4 -> 3; 0.6 of 4 -> 3)."""
    return math.ceil(round(fraction * total, 9))


@dataclass(frozen=True, slots=True)
class Cluster:
    """The expanded cluster. ``nodes`` are in hostname order of the spec."""

    name: str
    domain: str
    spec: Topology
    nodes: tuple[Node, ...]
    switches: tuple[Switch, ...]
    links: tuple[Link, ...]
    phases: tuple[PhasePlan, ...]
    fabric: FabricPlan
    racks: tuple[str, ...]
    sus: int
    _by_name: dict[str, Node] = field(repr=False, compare=False)

    def node(self, hostname: str) -> Node:
        return self._by_name[hostname]

    def by_role(self, role: str) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.role == role)

    @property
    def gpu_nodes(self) -> tuple[Node, ...]:
        return self.by_role("gpu")

    @property
    def gpus(self) -> int:
        types = self.spec.node_types
        return sum(types[n.node_type].gpus for n in self.nodes if n.role == "gpu")

    @property
    def topology_plugin(self) -> str:
        """``block`` when NVLink domains span nodes (NVL72), else ``tree``."""
        return "block" if any(n.nvlink_block for n in self.nodes) else "tree"

    @property
    def rate_gbps(self) -> int:
        return fabric_rate(self.spec)


def su_tag(cluster: Cluster, su: int) -> str:
    """The name part of scalable unit ``su``: ``su01``, zero-padded to the cluster's SU count.

    Slurm features, leaf names and inventory groups (``su_01``) all spell an SU this way.
    """
    return f"su{su:0{max(2, len(str(cluster.sus)))}d}"


def compress(hosts: tuple[str, ...] | list[str]) -> str:
    """A Slurm hostlist expression for ``hosts`` (python-hostlist's).

    A run of hosts that differ only in one zero-padded trailing number, in order (a rack, an
    SU, a phase), is written here; anything else goes to python-hostlist, whose general merge is
    a fifth of a 100k-GPU generate. tests/unit/topology/test_cluster.py holds the two to the
    same text.
    """
    if not hosts:
        return ""
    return _run_of(hosts) or str(hostlist.collect_hostlist(list(hosts)))


_NUMBERED = re.compile(r"([^\d\[\],]*)(\d+)")


def _run_of(hosts: tuple[str, ...] | list[str]) -> str | None:
    """``prefix[first-last]`` if ``hosts`` are prefix + first..last in one width, else None."""
    match = _NUMBERED.fullmatch(hosts[0])
    if match is None:
        return None
    prefix, digits = match.groups()
    width, first = len(digits), int(digits)
    last = first + len(hosts) - 1
    if len(str(last)) > width or hosts[-1] != f"{prefix}{last:0{width}d}":
        return None
    if any(h != f"{prefix}{first + i:0{width}d}" for i, h in enumerate(hosts)):
        return None
    return hosts[0] if len(hosts) == 1 else f"{prefix}[{digits}-{last:0{width}d}]"


def fabric_rate(topo: Topology) -> int:
    for group in topo.node_groups:
        kind = topo.node_types.get(group.node_type)
        if group.role == "gpu" and kind is not None and kind.rails:
            return kind.rails[0].rate_gbps
    return 0
