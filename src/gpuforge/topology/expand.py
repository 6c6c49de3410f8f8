"""Expansion: from a spec, every node, switch, link, address and phase. Pure and deterministic.

Placement rules (docs/topology.md explains them for users):

* GPU nodes, in spec order (groups in order, then index), fill racks of
  ``layout.nodes_per_rack`` and SUs of ``layout.racks_per_su`` racks; the last rack and SU
  may be partial. Controller, login and storage nodes fill service racks (``svc01``...) and
  belong to no SU (``su == 0``).
* Node number i (0-based, every node in spec order) gets ``network + host_offset + i`` in the
  management, BMC and every rail subnet, so one node ends in the same host part everywhere.
* Service nodes belong to phase 1; each phase's gate counts its GPU nodes only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, cycle, groupby, repeat
from operator import itemgetter

from gpuforge.topology.addressing import AddressRule
from gpuforge.topology.check import Analysis, analyse
from gpuforge.topology.cluster import (
    Cluster,
    LinkRow,
    Links,
    Node,
    RailPort,
    Switch,
    collector_paused,
)
from gpuforge.topology.errors import Problem, SpecError
from gpuforge.topology.fabric import FabricPlan
from gpuforge.topology.model import NodeType, Topology


def expand(topo: Topology) -> Cluster:
    """Expand ``topo`` into every node, switch, link and phase; raise SpecError if invalid."""
    return build(topo, analyse(topo))


def build(topo: Topology, analysis: Analysis) -> Cluster:
    """Expand ``topo`` from its ``analysis`` (see :func:`gpuforge.topology.check.analyse`)."""
    if analysis.problems or analysis.fabric is None:
        raise SpecError(analysis.problems or [Problem("node_groups", "no GPU nodes")])
    with collector_paused():
        return _build(topo, analysis, analysis.fabric)


def _width(count: int, minimum: int = 2) -> int:
    return max(minimum, len(str(count)))


def _build(topo: Topology, analysis: Analysis, plan: FabricPlan) -> Cluster:
    layout = topo.layout
    types = topo.node_types
    total = len(analysis.hostnames)
    # Every address of every node, made in bulk (node number i is the i-th of each list).
    mgmt = AddressRule.of(topo.addressing.management).addresses(total)
    bmc = AddressRule.of(topo.addressing.bmc).addresses(total)
    per_rail = [AddressRule.of(s).addresses(total, with_prefix=True) for s in topo.addressing.rails]
    rail_addresses: list[tuple[str, ...]] = (
        list(zip(*per_rail, strict=True)) if per_rail else [()] * total
    )

    n_gpu = len(analysis.gpu_order)
    nodes_per_rack, nodes_per_su = layout.nodes_per_rack, layout.nodes_per_su
    n_racks = math.ceil(n_gpu / nodes_per_rack)
    n_sus = len(plan.su_leaves)
    rack_names = [f"r{i:0{_width(n_racks, 3)}d}" for i in range(1, n_racks + 1)]
    leaf_names = _leaf_names(plan)

    domain = topo.domain
    n_service = sum(1 for gi, _ in analysis.hostnames if topo.node_groups[gi].role != "gpu")
    service_racks = [
        f"svc{i:02d}" for i in range(1, math.ceil(n_service / layout.service_nodes_per_rack) + 1)
    ]
    nodes: list[Node] = []
    number = gpu_i = service_i = 0
    spr = layout.service_nodes_per_rack
    nvl = analysis.nvlink_nodes
    # A group's nodes are consecutive (spec order): each field of them is made as a column, and
    # the nodes from the columns, without a Python step per node for each field.
    for gi, members in groupby(analysis.hostnames, key=itemgetter(0)):
        group = topo.node_groups[gi]
        names = [hostname for _, hostname in members]
        count = len(names)
        if group.role == "gpu":
            places = range(gpu_i, gpu_i + count)  # the nodes' places among the GPU nodes
            ports = _rail_ports(
                types[group.node_type],
                places,
                rail_addresses[number : number + count],
                plan=plan,
                nodes_per_su=nodes_per_su,
                leaf_names=leaf_names,
            )
            racks = [rack_names[g // nodes_per_rack] for g in places]
            sus = [g // nodes_per_su + 1 for g in places]
            phases = list(map(analysis.phase_of.__getitem__, names))
            blocks = [g // nvl + 1 for g in places] if nvl > 1 else [0] * count
            gpu_i += count
        else:
            ports = [()] * count
            racks = [service_racks[i // spr] for i in range(service_i, service_i + count)]
            sus, phases, blocks = [0] * count, [1] * count, [0] * count
            service_i += count
        nodes.extend(
            map(
                Node,  # its fields in order: hostname, fqdn, role, group, node_type, number, ...
                names,
                [f"{hostname}.{domain}" for hostname in names],
                repeat(group.role, count),
                repeat(group.name, count),
                repeat(group.node_type, count),
                range(number, number + count),
                racks,
                sus,
                phases,
                mgmt[number : number + count],
                bmc[number : number + count],
                ports,
                blocks,
            )
        )
        number += count

    all_nodes = tuple(nodes)
    switches, fabric_tiers, fabric_links = _build_fabric(plan, leaf_names)
    node_leaf = sum(len(n.rails) for n in all_nodes)

    def links() -> Iterator[Iterable[LinkRow]]:
        yield from _node_links(all_nodes)
        yield from fabric_links()

    return Cluster(
        name=topo.name,
        domain=topo.domain,
        spec=topo,
        nodes=all_nodes,
        switches=tuple(switches),
        links=Links((node_leaf, *fabric_tiers), links),
        phases=tuple(analysis.phases),
        fabric=plan,
        racks=tuple(rack_names + service_racks),
        sus=n_sus,
        _by_name={n.hostname: n for n in all_nodes},
    )


def _rail_ports(
    kind: NodeType,
    places: range,
    addresses: list[tuple[str, ...]],
    *,
    plan: FabricPlan,
    nodes_per_su: int,
    leaf_names: list[list[list[str]]],
) -> list[tuple[RailPort, ...]]:
    """The rail ports of GPU nodes of one type at ``places`` (among the GPU nodes), made from
    columns: every rail port of the group in one pass, then cut into each node's ports.

    Rail-optimized, rail r lands on the SU's leaf of plane r, at the node's place in the SU;
    otherwise all rails of a node land side by side on one leaf. The spec check made every GPU
    node type have ``fabric.rails`` NICs, as many as there are rail subnets.
    """
    rails = len(kind.rails)
    if not rails:
        return [()] * len(places)
    in_su = [divmod(g, nodes_per_su) for g in places]  # (SU, place in it), 0-based
    if plan.rail_optimized:
        su_leaves = [[planes[su][0] for planes in leaf_names] for su in range(len(leaf_names[0]))]
        leaves = chain.from_iterable([su_leaves[su] for su, _ in in_su])
        ports = chain.from_iterable(map(repeat, [pos + 1 for _, pos in in_su], repeat(rails)))
    else:
        npl = plan.nodes_per_leaf
        one_leaf = [leaf_names[0][su][pos // npl] for su, pos in in_su]
        leaves = chain.from_iterable(map(repeat, one_leaf, repeat(rails)))
        first = [(pos % npl) * rails + 1 for _, pos in in_su]
        ports = chain.from_iterable([range(port, port + rails) for port in first])
    made = map(
        tuple.__new__,
        repeat(RailPort),
        zip(
            cycle(range(rails)),
            cycle([nic.device for nic in kind.rails]),
            cycle([nic.netdev for nic in kind.rails]),
            chain.from_iterable(addresses),
            leaves,
            ports,
        ),
    )
    return list(zip(*[made] * rails, strict=True))


def _leaf_names(plan: FabricPlan) -> list[list[list[str]]]:
    """Leaf names per plane, per SU (0-based), in order: rail-optimized, one leaf per SU and
    rail; otherwise leaves numbered across the cluster, so that every switch name carries one
    number (Slurm hostlist ranges need that)."""
    if plan.rail_optimized:
        su_w = _width(len(plan.su_leaves))
        return [
            [[f"leaf-su{su + 1:0{su_w}d}-r{plane}"] for su in range(len(plan.su_leaves))]
            for plane in range(plan.planes)
        ]
    leaf_w = _width(plan.leaves, 3)
    names: list[list[str]] = []
    first = 0
    for count in plan.su_leaves:
        names.append([f"leaf-{first + k + 1:0{leaf_w}d}" for k in range(count)])
        first += count
    return [names]


def _node_links(nodes: tuple[Node, ...]) -> Iterator[Iterable[LinkRow]]:
    """Node to leaf: every rail of every node, in node order (a block per node)."""
    for node in nodes:
        if node.rails:
            _, devices, _, _, leaves, ports = zip(*node.rails, strict=True)
            yield zip(repeat(node.hostname), devices, leaves, ports, repeat(1))


def _build_fabric(
    plan: FabricPlan, leaf_names: list[list[list[str]]]
) -> tuple[list[Switch], tuple[int, int], Callable[[], Iterator[Iterable[LinkRow]]]]:
    """The fabric's switches, its links per tier (leaf-spine, spine-core) and what makes them.

    Links are made in blocks, one per switch (or node): its uplinks' columns zipped into rows,
    without a Python step per link.
    """
    radix, up = plan.radix, plan.up
    pod_w = _width(plan.pods)
    leaves: list[Switch] = []
    spines: list[Switch] = []
    cores: list[Switch] = []
    # Per plane, what its links need: leaf names with their pod, spine names (per pod) and
    # core names.
    planes: list[tuple[list[tuple[str, int]], list[list[str]], list[str]]] = []
    for plane in range(plan.planes):
        tag = f"-r{plane}" if plan.rail_optimized else ""
        plane_id = plane if plan.rail_optimized else None
        plane_leaves: list[tuple[str, int]] = []  # (leaf, pod index)
        for su0, names in enumerate(leaf_names[plane]):
            pod = su0 // plan.sus_per_pod if plan.tiers == 3 else None
            su_pod = None if pod is None else pod + 1
            for name in names:
                leaves.append(Switch(name, 1, plane_id, su0 + 1, su_pod, radix))
                plane_leaves.append((name, pod or 0))
        if plan.tiers == 2:
            row = [f"spine{tag}-{s + 1:02d}" for s in range(plan.spines_per_pod)]
            spines.extend(Switch(name, 2, plane_id, None, None, radix) for name in row)
            planes.append((plane_leaves, [row], []))
            continue
        # Three tiers: pods of leaves under `up` spines; spine j of every pod to core group j.
        plane_cores = [f"core{tag}-{c + 1:03d}" for c in range(up * plan.core_group)]
        cores.extend(Switch(name, 3, plane_id, None, None, radix) for name in plane_cores)
        pod_spines: list[list[str]] = []
        for p in range(plan.pods):
            row = [f"spine-p{p + 1:0{pod_w}d}{tag}-{j + 1:02d}" for j in range(up)]
            spines.extend(Switch(name, 2, plane_id, None, p + 1, radix) for name in row)
            pod_spines.append(row)
        planes.append((plane_leaves, pod_spines, plane_cores))

    n_leaves = sum(len(p[0]) for p in planes)
    if plan.tiers == 2:
        tiers = (n_leaves * plan.spines_per_pod * plan.links_per_leaf_spine, 0)
    else:
        tiers = (
            n_leaves * up,
            plan.planes * plan.pods * up * plan.core_group * plan.links_per_spine_core,
        )

    def links() -> Iterator[Iterable[LinkRow]]:
        for plane_leaves, pod_spines, plane_cores in planes:
            if plan.tiers == 2:
                yield from _two_tier_links(plan, plane_leaves, pod_spines[0])
            else:
                yield from _three_tier_links(plan, plane_leaves, pod_spines, plane_cores)

    return leaves + spines + cores, tiers, links


def _two_tier_links(
    plan: FabricPlan, plane_leaves: list[tuple[str, int]], plane_spines: list[str]
) -> Iterator[Iterable[LinkRow]]:
    """Every leaf to every spine of its plane, ``links_per_leaf_spine`` cables each (a block
    per leaf)."""
    per = plan.links_per_leaf_spine
    count = len(plane_spines) * per
    leaf_ports = [str(plan.down + 1 + i) for i in range(count)]
    uppers = [spine for spine in plane_spines for _ in range(per)]
    for li, (leaf, _) in enumerate(plane_leaves):
        spine_ports = list(range(li * per + 1, li * per + per + 1)) * len(plane_spines)
        yield zip(repeat(leaf, count), leaf_ports, uppers, spine_ports, repeat(2))


def _three_tier_links(
    plan: FabricPlan,
    plane_leaves: list[tuple[str, int]],
    pod_spines: list[list[str]],
    plane_cores: list[str],
) -> Iterator[Iterable[LinkRow]]:
    """Each leaf to the ``up`` spines of its pod; spine j of every pod to core group j (a
    block per switch)."""
    up, half = plan.up, plan.radix // 2
    group, per_core = plan.core_group, plan.links_per_spine_core
    leaf_ports = [str(plan.down + 1 + j) for j in range(up)]
    position_in_pod: dict[int, int] = {}
    for leaf, pod in plane_leaves:
        q = position_in_pod.get(pod, 0)
        position_in_pod[pod] = q + 1
        yield zip(repeat(leaf, up), leaf_ports, pod_spines[pod], repeat(q + 1), repeat(2))
    spine_ports = [str(half + 1 + g * per_core + m) for g in range(group) for m in range(per_core)]
    core_rows = [
        [plane_cores[j * group + g] for g in range(group) for _ in range(per_core)]
        for j in range(up)
    ]
    count = group * per_core
    for p, row in enumerate(pod_spines):
        core_ports = [p * per_core + m + 1 for _ in range(group) for m in range(per_core)]
        for j, spine in enumerate(row):
            yield zip(repeat(spine, count), spine_ports, core_rows[j], core_ports, repeat(3))
