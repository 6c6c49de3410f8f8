"""The expanded cluster: every node, switch, link and phase a spec describes.

:mod:`gpuforge.topology.check` checks a spec and plans its hostnames, fabric and phases;
:mod:`gpuforge.topology.expand` builds these types from that plan.
"""

from __future__ import annotations

import gc
import math
import re
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain, repeat
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


#: A link's fields as a plain tuple (:meth:`Links.rows`).
LinkRow = tuple[str, str, str, int, int]


class Links(Collection[Link]):
    """Every cable of a cluster, in a fixed order: node to leaf in node order, then per plane
    leaf to spine and spine to core. Made each time they are read, never held.

    A 100k-GPU cluster has half a million links and a 200,000-node one eight million (a
    gigabyte as tuples); ``topology check`` needs only their number per tier, which the
    expansion counts from the fabric plan, and ``topology.json`` writes each row as it is made.
    tests/unit/topology/test_fabric.py holds the counts to the rows.
    """

    __slots__ = ("_blocks", "_tiers")

    def __init__(
        self, tiers: tuple[int, int, int], blocks: Callable[[], Iterable[Iterable[LinkRow]]]
    ) -> None:
        self._tiers = tiers
        self._blocks = blocks  # the rows in blocks (a switch's uplinks), made when called

    def tier(self, tier: int) -> int:
        """How many links of ``tier`` (1 node-leaf, 2 leaf-spine, 3 spine-core)."""
        return self._tiers[tier - 1] if 1 <= tier <= len(self._tiers) else 0

    def rows(self) -> Iterator[LinkRow]:
        """The links as plain tuples of their fields, for a writer that reads each once (no
        :class:`Link` is made: each row may be the same tuple object, refilled)."""
        return chain.from_iterable(self._blocks())

    def __len__(self) -> int:
        return sum(self._tiers)

    def __iter__(self) -> Iterator[Link]:
        # tuple.__new__ in C, not Link(...)'s Python __new__: a third of the cost per link.
        return map(tuple.__new__, repeat(Link), self.rows())

    def __contains__(self, item: object) -> bool:
        return any(item == link for link in self.rows())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Links):
            return NotImplemented
        pairs = zip(self.rows(), other.rows(), strict=True)
        return self._tiers == other._tiers and all(a == b for a, b in pairs)

    def __hash__(self) -> int:
        return hash(self._tiers)

    def __repr__(self) -> str:
        return f"Links({len(self):,}: tiers {self._tiers})"


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
    links: Links
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


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cycle collector while a cluster is built or its files are rendered.

    A 100k-GPU cluster is a hundred thousand small objects (rail ports, nodes, switches, the
    rows of its files) and no reference cycle; every 700 allocations the collector would walk
    the young ones and, as they age, all of them again, for nothing: it was 0.5 of the 1.1
    CPU-s that expansion took, and a quarter of writing ``topology.json``.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


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
    if list(hosts) != [f"{prefix}{number:0{width}d}" for number in range(first, last + 1)]:
        return None
    return hosts[0] if len(hosts) == 1 else f"{prefix}[{digits}-{last:0{width}d}]"


def fabric_rate(topo: Topology) -> int:
    for group in topo.node_groups:
        kind = topo.node_types.get(group.node_type)
        if group.role == "gpu" and kind is not None and kind.rails:
            return kind.rails[0].rate_gbps
    return 0
