"""What a lab is made of: its name, network and nodes, derived from a topology spec."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from gpuforge.errors import InputError


@dataclass(frozen=True)
class LabNode:
    """One node as the lab needs it."""

    hostname: str
    fqdn: str
    role: str
    address: str


@dataclass(frozen=True)
class LabPlan:
    """What a lab is made of: derived from a topology spec (or written by hand in tests)."""

    name: str
    domain: str
    subnet: str
    gateway: str
    nodes: tuple[LabNode, ...]

    @property
    def network(self) -> str:
        """The podman network of the lab."""
        return f"gpuforge-{self.name}"

    @property
    def mirror_name(self) -> str:
        """Container (and DNS) name of the lab's package mirror."""
        return f"{self.name}-mirror"

    @property
    def mirror_address(self) -> str:
        """The mirror's address: the highest host address of the subnet no node uses."""
        taken = {n.address for n in self.nodes} | {self.gateway}
        net = ipaddress.IPv4Network(self.subnet)
        for candidate in reversed(_hosts_tail(net)):
            if str(candidate) not in taken:
                return str(candidate)
        raise InputError(f"management subnet {self.subnet} has no free address for the mirror")

    def container(self, hostname: str) -> str:
        """Container name of node ``hostname``."""
        return f"{self.name}-{hostname}"

    def node(self, name: str) -> LabNode:
        """A node by hostname, FQDN or container name."""
        for node in self.nodes:
            if name in (node.hostname, node.fqdn, self.container(node.hostname)):
                return node
        known = ", ".join(n.hostname for n in self.nodes)
        raise InputError(f"lab {self.name} has no node {name!r} (nodes: {known})")

    def validate(self) -> None:
        """InputError unless every node has its own address inside the subnet."""
        if not self.nodes:
            raise InputError(f"lab {self.name} has no nodes")
        net = ipaddress.IPv4Network(self.subnet)
        for node in self.nodes:
            if ipaddress.IPv4Address(node.address) not in net:
                raise InputError(
                    f"{node.hostname}: address {node.address} is outside {self.subnet}"
                )
        if len({n.address for n in self.nodes}) != len(self.nodes):
            raise InputError(f"lab {self.name}: two nodes share a management address")


def plan_from_cluster(cluster: Any) -> LabPlan:
    """The lab plan of an expanded topology (``gpuforge.topology.Cluster``)."""
    mgmt = cluster.spec.addressing.management
    gateway = mgmt.gateway or next(mgmt.subnet.hosts())
    nodes = tuple(
        LabNode(hostname=n.hostname, fqdn=n.fqdn, role=n.role, address=str(n.mgmt_address))
        for n in cluster.nodes
    )
    return LabPlan(
        name=cluster.name,
        domain=cluster.domain,
        subnet=str(mgmt.subnet),
        gateway=str(gateway),
        nodes=nodes,
    )


def _hosts_tail(net: ipaddress.IPv4Network, count: int = 64) -> list[ipaddress.IPv4Address]:
    last = int(net.broadcast_address) - 1
    first = max(int(net.network_address) + 1, last - count + 1)
    return [ipaddress.IPv4Address(i) for i in range(first, last + 1)]
