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

import gc
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from gpuforge.topology.addressing import AddressRule
from gpuforge.topology.check import Analysis, analyse
from gpuforge.topology.cluster import Cluster, Link, Node, RailPort, Switch
from gpuforge.topology.errors import Problem, SpecError
from gpuforge.topology.fabric import FabricPlan
from gpuforge.topology.model import Topology


def expand(topo: Topology) -> Cluster:
    """Expand ``topo`` into every node, switch, link and phase; raise SpecError if invalid."""
    return build(topo, analyse(topo))


def build(topo: Topology, analysis: Analysis) -> Cluster:
    """Expand ``topo`` from its ``analysis`` (see :func:`gpuforge.topology.check.analyse`)."""
    if analysis.problems or analysis.fabric is None:
        raise SpecError(analysis.problems or [Problem("node_groups", "no GPU nodes")])
    with _collector_paused():
        return _build(topo, analysis, analysis.fabric)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cycle collector while the cluster is built.

    A 100k-GPU cluster is a million small objects (half a million links) and no reference
    cycle; every 700 allocations the collector would walk the young ones and, as they age, all
    of them again, for nothing: it was 0.5 of the 1.1 CPU-s that expansion took.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _width(count: int, minimum: int = 2) -> int:
    return max(minimum, len(str(count)))


def _build(topo: Topology, analysis: Analysis, plan: FabricPlan) -> Cluster:  # noqa: PLR0915
    layout = topo.layout
    types = topo.node_types
    rails = topo.fabric.rails
    rail_optimized = plan.rail_optimized
    mgmt = AddressRule.of(topo.addressing.management)
    bmc = AddressRule.of(topo.addressing.bmc)
    rail_rules = [AddressRule.of(s) for s in topo.addressing.rails]

    n_gpu = len(analysis.gpu_order)
    nodes_per_rack, nodes_per_su = layout.nodes_per_rack, layout.nodes_per_su
    n_racks = math.ceil(n_gpu / nodes_per_rack)
    n_sus = len(plan.su_leaves)
    rack_names = [f"r{i:0{_width(n_racks, 3)}d}" for i in range(1, n_racks + 1)]
    su_w = _width(n_sus)
    pod_w = _width(plan.pods)

    # Leaf names: per plane, per SU, the SU's leaves in order.
    # Rail-optimized: one leaf per SU and rail. Otherwise leaves are numbered across the
    # cluster, so that every switch name carries one number (Slurm hostlist ranges need that).
    first_leaf = [0]
    for count in plan.su_leaves:
        first_leaf.append(first_leaf[-1] + count)
    leaf_w = _width(plan.leaves, 3)

    def leaf_name(plane: int, su: int, k: int) -> str:
        if rail_optimized:
            return f"leaf-su{su:0{su_w}d}-r{plane}"
        return f"leaf-{first_leaf[su - 1] + k + 1:0{leaf_w}d}"

    domain = topo.domain
    n_service = sum(1 for gi, _ in analysis.hostnames if topo.node_groups[gi].role != "gpu")
    service_racks = [
        f"svc{i:02d}" for i in range(1, math.ceil(n_service / layout.service_nodes_per_rack) + 1)
    ]
    nodes: list[Node] = []
    links: list[Link] = []
    gpu_i = service_i = 0
    nvl = analysis.nvlink_nodes
    npl = plan.nodes_per_leaf
    for number, (gi, hostname) in enumerate(analysis.hostnames):
        group = topo.node_groups[gi]
        kind = types[group.node_type]
        ports: tuple[RailPort, ...] = ()
        if group.role == "gpu":
            su0, pos = divmod(gpu_i, nodes_per_su)
            su = su0 + 1
            rack = rack_names[gpu_i // nodes_per_rack]
            phase = analysis.phase_of[hostname]
            block = gpu_i // nvl + 1 if nvl > 1 else 0
            port_list = []
            for r, nic in enumerate(kind.rails):
                if rail_optimized:
                    leaf, port = leaf_name(r, su, 0), pos + 1
                else:
                    k, slot = divmod(pos, npl)
                    leaf, port = leaf_name(0, su, k), slot * rails + r + 1
                port_list.append(
                    RailPort(r, nic.device, nic.netdev, rail_rules[r].interface(number), leaf, port)
                )
                links.append(Link(hostname, nic.device, leaf, port, 1))
            ports = tuple(port_list)
            gpu_i += 1
        else:
            su, phase, block = 0, 1, 0
            rack = service_racks[service_i // layout.service_nodes_per_rack]
            service_i += 1
        nodes.append(
            Node(
                hostname=hostname,
                fqdn=f"{hostname}.{domain}",
                role=group.role,
                group=group.name,
                node_type=group.node_type,
                number=number,
                rack=rack,
                su=su,
                phase=phase,
                mgmt_address=mgmt.address(number),
                bmc_address=bmc.address(number),
                rails=ports,
                nvlink_block=block,
            )
        )

    switches, fabric_links = _build_fabric(plan, leaf_name, pod_w)
    links.extend(fabric_links)
    return Cluster(
        name=topo.name,
        domain=topo.domain,
        spec=topo,
        nodes=tuple(nodes),
        switches=tuple(switches),
        links=tuple(links),
        phases=tuple(analysis.phases),
        fabric=plan,
        racks=tuple(rack_names + service_racks),
        sus=n_sus,
        _by_name={n.hostname: n for n in nodes},
    )


def _build_fabric(  # noqa: PLR0912 - two and three tiers, side by side
    plan: FabricPlan,
    leaf_name: Callable[[int, int, int], str],
    pod_w: int,
) -> tuple[list[Switch], list[Link]]:
    name_leaf = leaf_name
    radix, down, up, half = plan.radix, plan.down, plan.up, plan.radix // 2
    leaves: list[Switch] = []
    spines: list[Switch] = []
    cores: list[Switch] = []
    links: list[Link] = []
    for plane in range(plan.planes):
        tag = f"-r{plane}" if plan.rail_optimized else ""
        plane_id = plane if plan.rail_optimized else None
        plane_leaves: list[tuple[Switch, int]] = []  # (leaf, pod index)
        for su0, count in enumerate(plan.su_leaves):
            pod = su0 // plan.sus_per_pod if plan.tiers == 3 else None
            for k in range(count):
                leaf = Switch(
                    name_leaf(plane, su0 + 1, k),
                    1,
                    plane_id,
                    su0 + 1,
                    None if pod is None else pod + 1,
                    radix,
                )
                plane_leaves.append((leaf, pod or 0))
        leaves.extend(leaf for leaf, _ in plane_leaves)
        if plan.tiers == 2:
            per = plan.links_per_leaf_spine
            plane_spines = [
                Switch(f"spine{tag}-{s + 1:02d}", 2, plane_id, None, None, radix)
                for s in range(plan.spines_per_pod)
            ]
            spines.extend(plane_spines)
            for li, (leaf, _) in enumerate(plane_leaves):
                for s, spine in enumerate(plane_spines):
                    for m in range(per):
                        links.append(
                            Link(
                                leaf.name,
                                str(down + 1 + s * per + m),
                                spine.name,
                                li * per + m + 1,
                                2,
                            )
                        )
            continue
        # Three tiers: pods of leaves under `up` spines; spine j of every pod to core group j.
        group, per_core = plan.core_group, plan.links_per_spine_core
        plane_cores = [
            Switch(f"core{tag}-{c + 1:03d}", 3, plane_id, None, None, radix)
            for c in range(up * group)
        ]
        cores.extend(plane_cores)
        pod_spines: list[list[Switch]] = []
        for p in range(plan.pods):
            row = [
                Switch(
                    f"spine-p{p + 1:0{pod_w}d}{tag}-{j + 1:02d}", 2, plane_id, None, p + 1, radix
                )
                for j in range(up)
            ]
            pod_spines.append(row)
            spines.extend(row)
        position_in_pod: dict[int, int] = {}
        for leaf, pod in plane_leaves:
            q = position_in_pod.get(pod, 0)
            position_in_pod[pod] = q + 1
            for j, spine in enumerate(pod_spines[pod]):
                links.append(Link(leaf.name, str(down + 1 + j), spine.name, q + 1, 2))
        for p, row in enumerate(pod_spines):
            for j, spine in enumerate(row):
                for g in range(group):
                    core = plane_cores[j * group + g]
                    for m in range(per_core):
                        links.append(
                            Link(
                                spine.name,
                                str(half + 1 + g * per_core + m),
                                core.name,
                                p * per_core + m + 1,
                                3,
                            )
                        )
    return leaves + spines + cores, links
