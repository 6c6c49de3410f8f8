"""The address plan: node number i gets ``network + host_offset + i`` in every subnet.

Addresses are computed with integer arithmetic (the ``ipaddress`` objects are only used to
check the plan), because a 12,500-node cluster has 100,000 rail addresses.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address

from gpuforge.topology.model import Subnet


@dataclass(frozen=True, slots=True)
class AddressRule:
    """Precomputed form of a :class:`Subnet` for fast per-node addresses."""

    network: int
    prefix: int
    offset: int
    gateway: str
    last_host: int

    @classmethod
    def of(cls, subnet: Subnet) -> AddressRule:
        net = subnet.subnet
        gateway = subnet.gateway or (net.network_address + 1)
        return cls(
            network=int(net.network_address),
            prefix=net.prefixlen,
            offset=subnet.host_offset,
            gateway=str(gateway),
            last_host=int(net.broadcast_address) - 1
            if net.prefixlen < 31
            else int(net.broadcast_address),
        )

    def address(self, number: int) -> str:
        """Address of node ``number`` (0-based), without prefix."""
        return ipv4(self.network + self.offset + number)

    def interface(self, number: int) -> str:
        """Address of node ``number`` with its prefix, e.g. ``10.100.0.10/16``."""
        return f"{ipv4(self.network + self.offset + number)}/{self.prefix}"

    def addresses(self, count: int, *, with_prefix: bool = False) -> list[str]:
        """:meth:`address` (or :meth:`interface`) of nodes 0 to ``count - 1``, in order.

        One text per /24 block and one per last octet: 1.6 million rail addresses of a
        200,000-node cluster cost a string concatenation each, not four shifts and a format.
        """
        tail = f"/{self.prefix}" if with_prefix else ""
        octets = [f"{octet}{tail}" for octet in range(256)]
        out: list[str] = []
        value, end = self.network + self.offset, self.network + self.offset + count
        while value < end:
            stop = min(end, (value | 255) + 1)
            head = ipv4(value)[: -len(str(value & 255))]
            out.extend([head + octet for octet in octets[value & 255 : (stop - 1 & 255) + 1]])
            value = stop
        return out

    def capacity(self) -> int:
        """How many node numbers fit in the subnet after the offset."""
        return max(0, self.last_host - (self.network + self.offset) + 1)


def ipv4(value: int) -> str:
    """Dotted-quad form of an IPv4 address given as an integer."""
    return f"{value >> 24 & 255}.{value >> 16 & 255}.{value >> 8 & 255}.{value & 255}"


def check_subnet(subnet: Subnet, nodes: int) -> list[tuple[str, str]]:
    """Problems (relative field, message) if ``subnet`` cannot address ``nodes`` nodes."""
    rule = AddressRule.of(subnet)
    problems: list[tuple[str, str]] = []
    if rule.capacity() < nodes:
        problems.append(
            (
                "subnet",
                f"{subnet.subnet} is too small: {nodes} nodes from offset {subnet.host_offset} "
                f"need {nodes + subnet.host_offset + 1} addresses, it has "
                f"{subnet.subnet.num_addresses}",
            )
        )
    gateway = int(IPv4Address(rule.gateway))
    net = subnet.subnet
    if subnet.gateway is not None and subnet.gateway not in net:
        problems.append(("gateway", f"{subnet.gateway} is outside {net}"))
    elif net.prefixlen < 31 and subnet.gateway in (net.network_address, net.broadcast_address):
        kind = "network" if subnet.gateway == net.network_address else "broadcast"
        problems.append(("gateway", f"{subnet.gateway} is the {kind} address of {net}"))
    elif rule.network + rule.offset <= gateway < rule.network + rule.offset + nodes:
        problems.append(
            (
                "host_offset",
                f"node addresses from offset {rule.offset} include the gateway {rule.gateway}",
            )
        )
    return problems
