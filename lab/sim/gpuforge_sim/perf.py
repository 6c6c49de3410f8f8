"""Bandwidth model: what a collective or an RDMA write reaches, given every participant's health.

The rule is the weakest link: a collective runs at the minimum over the participating nodes'
NVLink domains and, across nodes, at the pace of the slowest NIC or leaf-spine link any of its
rails crosses, times the number of rails. A degraded node therefore lowers every collective it
joins.
"""

from __future__ import annotations

from dataclasses import dataclass

from .gpu import gpu_health, throttled
from .skus import IB_WRITE_EFFICIENCY, NCCL_NET_EFFICIENCY
from .state import Lab, NodeView

# Busbw a GPU pair reaches over PCIe alone when NVLink is gone (NCCL falls back to P2P/SHM).
PCIE_FALLBACK_BUSBW = 20.0
# Without nvidia_peermem (no GPUDirect RDMA) NCCL stages through host memory.
NO_GDR_FACTOR = 0.55


def rail_rate_gbps(node: NodeView, rail: int) -> float:
    """Signalling rate of a rail's port as negotiated now (0 when the port is not Active)."""
    r = node.rails[rail]
    if node.rail_faults(rail, "ib_port_down") or node.rail_faults(rail, "ib_port_polling"):
        return 0.0
    rate = float(r.get("rate_gbps", 400))
    for f in node.rail_faults(rail, "ib_wrong_rate"):
        rate = float(f.get("rate_gbps", 200))
    return rate


def rail_payload_factor(node: NodeView, rail: int) -> float:
    f = 1.0
    for fault in node.rail_faults(rail, "slow_nic"):
        f = min(f, float(fault.get("factor", 0.5)))
    return f


def ib_write_gbps(lab: Lab, a: NodeView, rail_a: int, b: NodeView, rail_b: int) -> float:
    """ib_write_bw average Gb/s between two ports (0 when either is down)."""
    rate = min(rail_rate_gbps(a, rail_a), rail_rate_gbps(b, rail_b))
    rate *= min(rail_payload_factor(a, rail_a), rail_payload_factor(b, rail_b))
    leaf_a = a.rails[rail_a].get("leaf", "")
    leaf_b = b.rails[rail_b].get("leaf", "")
    if leaf_a != leaf_b:
        rate *= min(lab.uplink_factor(leaf_a), lab.uplink_factor(leaf_b))
    return rate * IB_WRITE_EFFICIENCY


def intra_busbw(node: NodeView, coll: str, gpus_used: list[int]) -> float:
    """Plateau busbw (GB/s) of ``coll`` among ``gpus_used`` physical GPUs of one node."""
    sku = node.sku
    if sku is None:
        return 0.0
    peak = sku.intra_busbw[coll]
    if len(gpus_used) <= 1:
        return peak
    health = {g.physical: g for g in gpu_health(node)}
    factor = 1.0
    for phys in gpus_used:
        g = health.get(phys)
        if g is None:
            continue
        if g.nvlinks_up == 0:
            return PCIE_FALLBACK_BUSBW
        factor = min(factor, g.nvlinks_up / sku.nvlinks)
        if throttled(g):
            factor = min(factor, 0.9)
    return peak * factor


@dataclass
class Participant:
    node: NodeView
    gpus: list[int]  # physical GPU indices in use on this node


def hca_selects(spec: str | None, device: str) -> bool:
    """Does ``NCCL_IB_HCA`` (``spec``) let NCCL use ``device``?

    NCCL's syntax: a comma-separated list of device prefixes (``mlx5`` is every mlx5 card),
    ``=`` in front for exact names, ``^`` in front to exclude the list instead, ``:port`` after
    a name for one port (the lab's NICs have port 1 only). Unset or empty: every device.
    """
    text = (spec or "").strip()
    if not text:
        return True
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    names = [item.split(":", 1)[0].strip() for item in text.split(",") if item.strip()]
    hit = any(device == n if exact else device.startswith(n) for n in names)
    return hit != exclude


def inter_busbw(lab: Lab, parts: list[Participant], hca: str | None = None) -> float:
    """Cross-node busbw ceiling (GB/s): every live rail runs at the slowest live rail's pace.

    NCCL splits a collective evenly over its channels, one NIC each, and finishes when the
    slowest channel does: one half-rate NIC halves the cross-node busbw of every collective its
    node joins. A rail's pace is its slowest NIC (and leaf-spine uplink, when it crosses leaves).
    A rail with a port down is not used at all (NCCL skips inactive ports); 0 when none is left.
    Only the rails whose devices ``NCCL_IB_HCA`` (``hca``) selects on every node take part:
    ``=mlx5_3`` measures rail 3 alone, at one NIC's bandwidth.
    """
    paces = []
    for rail in range(min(len(p.node.rails) for p in parts)):
        devices = {str(p.node.rails[rail].get("device", f"mlx5_{rail}")) for p in parts}
        if not all(hca_selects(hca, d) for d in devices):
            continue
        leaves = {p.node.rails[rail].get("leaf", "") for p in parts}
        uplink = min(lab.uplink_factor(leaf) for leaf in leaves) if len(leaves) > 1 else 1.0
        nics = []
        for p in parts:
            gbps = rail_rate_gbps(p.node, rail) * rail_payload_factor(p.node, rail)
            if p.node.has("missing_peermem"):
                gbps *= NO_GDR_FACTOR
            nics.append(gbps)
        if min(nics) > 0:
            paces.append(min(nics) * uplink)
    return len(paces) * min(paces, default=0.0) / 8.0 * NCCL_NET_EFFICIENCY


def collective_peak(lab: Lab, coll: str, parts: list[Participant], hca: str | None = None) -> float:
    """Plateau busbw for ``coll`` over ``parts`` (one or more nodes), ``NCCL_IB_HCA`` = hca."""
    intra = min(intra_busbw(p.node, coll, p.gpus) for p in parts)
    if len(parts) == 1:
        return intra
    inter = inter_busbw(lab, parts, hca)
    if coll == "alltoall":
        inter *= 0.8  # all-to-all is bisection-bound across nodes
    # Across nodes NVLS/SHARP is off in the model: a ring's intra-node step is not the bottleneck.
    return min(intra, inter)


def busbw_at(peak: float, size: int, multi_node: bool) -> float:
    """Bus bandwidth at message ``size``: small sizes are latency-bound, large ones plateau.

    The curve is fitted by eye to the a3mega (2x8 H100) and OCI (2x8 H200) captures:
    half the plateau near 64 MiB across nodes, near 8 MiB inside one node.
    """
    half = (64 if multi_node else 8) * 1024 * 1024
    if size <= 0:
        return 0.0
    x = float(size / half) ** 0.7
    return float(peak * x / (1.0 + x))
