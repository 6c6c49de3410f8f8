"""A one-screen summary of an expanded cluster (``gpuforge topology check``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpuforge.topology.cluster import Cluster


def summarize(cluster: Cluster) -> dict[str, Any]:
    """Counts a person checks before building: nodes, GPUs, racks, switches, links, bandwidth."""
    plan = cluster.fabric
    roles = Counter(n.role for n in cluster.nodes)
    tiers = Counter(s.kind for s in cluster.switches)
    rate = cluster.rate_gbps
    spec = cluster.spec
    return {
        "name": cluster.name,
        "domain": cluster.domain,
        "nodes": len(cluster.nodes),
        "nodes_by_role": {
            role: roles.get(role, 0) for role in ("controller", "login", "gpu", "storage")
        },
        "gpus": cluster.gpus,
        "racks": len(cluster.racks),
        "gpu_racks": sum(1 for r in cluster.racks if not r.startswith("svc")),
        "sus": cluster.sus,
        "nodes_per_su": spec.layout.nodes_per_su,
        "fabric": {
            "kind": spec.fabric.kind,
            "rails": spec.fabric.rails,
            "rate_gbps": rate,
            "rail_optimized": plan.rail_optimized,
            "planes": plan.planes,
            "tiers": plan.tiers,
            "radix": plan.radix,
            "leaf_ports_down_up": [plan.down, plan.up],
            "bisection_gbps_per_plane": plan.bisection_gbps(rate),
            "bisection_gbps_total": plan.bisection_gbps(rate) * plan.planes,
        },
        "switches": {kind: tiers.get(kind, 0) for kind in ("leaf", "spine", "core")},
        "switches_total": len(cluster.switches),
        "links": {
            "node_leaf": cluster.links.tier(1),
            "leaf_spine": cluster.links.tier(2),
            "spine_core": cluster.links.tier(3),
        },
        "links_total": len(cluster.links),
        "slurm_topology_plugin": cluster.topology_plugin,
        "phases": len(cluster.phases),
        "versions": spec.versions.model_dump(exclude_none=True),
    }


def render_summary(data: dict[str, Any]) -> str:
    """The summary as aligned text lines."""
    fabric = data["fabric"]
    roles = data["nodes_by_role"]
    sw = data["switches"]
    links = data["links"]
    bis = fabric["bisection_gbps_per_plane"] / 1000
    rows = [
        ("cluster", f"{data['name']} ({data['domain']})"),
        (
            "nodes",
            f"{data['nodes']:,}: {roles['gpu']:,} gpu, {roles['controller']} controller, "
            f"{roles['login']} login, {roles['storage']} storage",
        ),
        ("GPUs", f"{data['gpus']:,}"),
        ("racks", f"{data['racks']:,} ({data['gpu_racks']:,} GPU racks)"),
        ("SUs", f"{data['sus']:,} of up to {data['nodes_per_su']} GPU nodes"),
        (
            "fabric",
            f"{fabric['kind']}, {fabric['rails']} rails x {fabric['rate_gbps']} Gb/s, "
            f"{'rail-optimized' if fabric['rail_optimized'] else 'not rail-optimized'}, "
            f"{fabric['tiers']} tiers, radix {fabric['radix']} "
            f"({fabric['leaf_ports_down_up'][0]} down / {fabric['leaf_ports_down_up'][1]} up)",
        ),
        (
            "switches",
            f"{data['switches_total']:,}: {sw['leaf']:,} leaf, {sw['spine']:,} spine, "
            f"{sw['core']:,} core",
        ),
        (
            "links",
            f"{data['links_total']:,}: {links['node_leaf']:,} node-leaf, "
            f"{links['leaf_spine']:,} leaf-spine, {links['spine_core']:,} spine-core",
        ),
        (
            "bisection",
            f"{bis:,.1f} Tb/s per {'rail' if fabric['rail_optimized'] else 'plane'} "
            f"x {fabric['planes']} = {bis * fabric['planes']:,.1f} Tb/s",
        ),
        ("slurm topology", data["slurm_topology_plugin"]),
        ("phases", str(data["phases"])),
        ("versions", ", ".join(f"{k} {v}" for k, v in data["versions"].items())),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
