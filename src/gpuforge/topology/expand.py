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
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import combinations

import hostlist

from gpuforge.topology.addressing import AddressRule, check_subnet
from gpuforge.topology.errors import Problem, SpecError
from gpuforge.topology.fabric import FabricImpossible, FabricPlan, plan_fabric
from gpuforge.topology.model import NodeGroup, NodeType, Subnet, Topology


@dataclass(frozen=True, slots=True)
class RailPort:
    """One compute NIC of a node and where it lands."""

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


@dataclass(frozen=True, slots=True)
class Link:
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


def compress(hosts: tuple[str, ...] | list[str]) -> str:
    """A Slurm hostlist expression for ``hosts`` (python-hostlist)."""
    return str(hostlist.collect_hostlist(list(hosts))) if hosts else ""


def fabric_rate(topo: Topology) -> int:
    for group in topo.node_groups:
        kind = topo.node_types.get(group.node_type)
        if group.role == "gpu" and kind is not None and kind.rails:
            return kind.rails[0].rate_gbps
    return 0


@dataclass(slots=True)
class _Analysis:
    hostnames: list[tuple[int, str]]  # (group index, hostname) for every node in spec order
    gpu_order: list[str]
    nvlink_nodes: int
    fabric: FabricPlan | None
    phase_of: dict[str, int]
    phases: list[PhasePlan]
    problems: list[Problem]


def check(topo: Topology) -> list[Problem]:
    """Every cross-field problem of ``topo`` (field-level ones are caught by the model)."""
    return _analyse(topo).problems


def _analyse(topo: Topology) -> _Analysis:  # noqa: PLR0912, PLR0915 - one pass, many rules
    problems: list[Problem] = []
    add = problems.append
    types = topo.node_types

    # Node groups: types, names, roles, hostnames.
    seen_groups: dict[str, int] = {}
    hostnames: list[tuple[int, str]] = []
    owner: dict[str, int] = {}
    for gi, group in enumerate(topo.node_groups):
        where = f"node_groups[{gi}]"
        if group.name in seen_groups:
            add(Problem(f"{where}.name", f"duplicate group name {group.name!r}"))
        seen_groups.setdefault(group.name, gi)
        kind = types.get(group.node_type)
        if kind is None:
            add(
                Problem(
                    f"{where}.node_type",
                    f"unknown node type {group.node_type!r} (known: {', '.join(sorted(types))})",
                )
            )
        elif group.role == "gpu" and not kind.gpus:
            add(
                Problem(
                    f"{where}.node_type", f"gpu group uses {group.node_type!r}, which has no GPUs"
                )
            )
        pattern = group.hostname
        for index in range(group.first_index, group.first_index + group.count):
            name = pattern.format(index=index)
            if name in owner:
                other = topo.node_groups[owner[name]].name
                add(
                    Problem(
                        f"{where}.hostname", f"duplicate hostname {name} (also in group {other!r})"
                    )
                )
                break
            owner[name] = gi
            hostnames.append((gi, name))
        else:
            last = pattern.format(index=group.first_index + group.count - 1)
            if len(last) > 63 or not last.replace("-", "").isalnum() or last != last.lower():
                add(Problem(f"{where}.hostname", f"pattern gives {last!r}, not a valid DNS label"))

    roles = {g.role for g in topo.node_groups}
    if "gpu" not in roles:
        add(Problem("node_groups", "no group has role gpu"))
    if "controller" not in roles:
        add(Problem("node_groups", "no group has role controller (the Slurm controller)"))

    gpu_groups = [
        (gi, g) for gi, g in enumerate(topo.node_groups) if g.role == "gpu" and g.node_type in types
    ]
    gpu_order = [h for gi, h in hostnames if topo.node_groups[gi].role == "gpu"]
    rails = topo.fabric.rails

    # Rails: NICs per GPU node type, rates, subnets.
    rates: set[int] = set()
    nvlink: set[int] = set()
    for name in sorted({g.node_type for _, g in gpu_groups}):
        kind = types[name]
        if len(kind.rails) != rails:
            add(
                Problem(
                    f"node_types.{name}.rails",
                    f"{len(kind.rails)} compute NICs, but fabric.rails is {rails}",
                )
            )
        for ri, nic in enumerate(kind.rails):
            if kind.rails[0].rate_gbps != nic.rate_gbps:
                add(Problem(f"node_types.{name}.rails[{ri}].rate_gbps", "rails differ in rate"))
        if kind.rails:
            rates.add(kind.rails[0].rate_gbps)
        for field_name in ("device", "netdev"):
            values = [getattr(n, field_name) for n in kind.rails]
            if len(set(values)) != len(values):
                add(Problem(f"node_types.{name}.rails", f"duplicate {field_name} among the rails"))
        nvlink.add(kind.nvlink_nodes)
    if len(rates) > 1:
        add(Problem("node_types", f"GPU node types use different rail rates {sorted(rates)}"))
    if len(nvlink) > 1:
        add(Problem("node_types", "GPU node types differ in NVLink domain span (nodes per domain)"))
    nvlink_nodes = max(nvlink, default=1)

    total = len(hostnames)
    if len(topo.addressing.rails) != rails:
        add(
            Problem(
                "addressing.rails",
                f"{len(topo.addressing.rails)} rail subnets, but fabric.rails is {rails}",
            )
        )
    subnets: list[tuple[str, Subnet]] = [
        ("addressing.management", topo.addressing.management),
        ("addressing.bmc", topo.addressing.bmc),
        *((f"addressing.rails[{i}]", s) for i, s in enumerate(topo.addressing.rails)),
    ]
    for path, subnet in subnets:
        for rel, message in check_subnet(subnet, total):
            add(Problem(f"{path}.{rel}", message))
    for (path_a, a), (path_b, b) in combinations(subnets, 2):
        if a.subnet.overlaps(b.subnet):
            add(Problem(f"{path_b}.subnet", f"{b.subnet} overlaps {path_a}.subnet ({a.subnet})"))

    # Racks: count and power.
    layout = topo.layout
    gpu_racks = math.ceil(len(gpu_order) / layout.nodes_per_rack)
    if layout.racks is not None and gpu_racks > layout.racks:
        add(
            Problem(
                "layout.racks",
                f"{len(gpu_order)} GPU nodes at {layout.nodes_per_rack} per rack need "
                f"{gpu_racks} racks, only {layout.racks} available",
            )
        )
    _check_power(topo, gpu_groups, add)
    if nvlink_nodes > 1:
        if layout.nodes_per_rack % nvlink_nodes:
            add(
                Problem(
                    "layout.nodes_per_rack",
                    f"{layout.nodes_per_rack} is not a multiple of the {nvlink_nodes} nodes of "
                    "one NVLink domain; a domain cannot span racks",
                )
            )
        for gi, group in gpu_groups:
            if group.count % nvlink_nodes:
                add(
                    Problem(
                        f"node_groups[{gi}].count",
                        f"{group.count} nodes leave a partial NVLink domain of "
                        f"{nvlink_nodes} nodes",
                    )
                )

    # Fabric.
    fabric: FabricPlan | None = None
    if gpu_order:
        try:
            fabric = plan_fabric(
                gpu_nodes=len(gpu_order),
                nodes_per_su=layout.nodes_per_su,
                rails=rails,
                radix=topo.fabric.radix,
                oversubscription=topo.fabric.oversubscription,
                rail_optimized=topo.fabric.rail_optimized,
            )
        except FabricImpossible as exc:
            add(Problem(exc.field, str(exc)))

    phase_of, phases = _plan_phases(topo, gpu_order, add)
    return _Analysis(hostnames, gpu_order, nvlink_nodes, fabric, phase_of, phases, problems)


def _check_power(
    topo: Topology, gpu_groups: list[tuple[int, NodeGroup]], add: Callable[[Problem], None]
) -> None:
    layout = topo.layout
    power: list[float] = []
    kinds: list[NodeType] = []
    for _, group in gpu_groups:
        kind = topo.node_types[group.node_type]
        kinds.extend([kind] * group.count)
    for start in range(0, len(kinds), layout.nodes_per_rack):
        rack = kinds[start : start + layout.nodes_per_rack]
        power.append(sum(k.power_kw for k in rack))
    if power and max(power) > layout.rack_power_kw + 1e-9:
        worst = power.index(max(power))
        add(
            Problem(
                "layout.rack_power_kw",
                f"rack {worst + 1} holds {min(layout.nodes_per_rack, len(kinds))} GPU nodes "
                f"drawing {max(power):g} kW, more than the {layout.rack_power_kw:g} kW budget",
            )
        )


def _plan_phases(  # noqa: PLR0912 - one branch per selector and rule
    topo: Topology, gpu_order: list[str], add: Callable[[Problem], None]
) -> tuple[dict[str, int], list[PhasePlan]]:
    report = add
    nodes_per_su = topo.layout.nodes_per_su
    position = {h: i for i, h in enumerate(gpu_order)}
    phase_of: dict[str, int] = {}
    plans: list[PhasePlan] = []
    names: set[str] = set()
    for pi, phase in enumerate(topo.rollout.phases):
        where = f"rollout.phases[{pi}]"
        number = pi + 1
        if phase.name in names:
            report(Problem(f"{where}.name", f"duplicate phase name {phase.name!r}"))
        names.add(phase.name)
        chosen: list[str] = []
        if phase.count is not None:
            free = [h for h in gpu_order if h not in phase_of]
            if len(free) < phase.count:
                report(
                    Problem(
                        f"{where}.count", f"{phase.count} nodes asked, {len(free)} GPU nodes left"
                    )
                )
            chosen = free[: phase.count]
        elif phase.sus is not None:
            sus = math.ceil(len(gpu_order) / nodes_per_su)
            for su in phase.sus:
                if not 1 <= su <= sus:
                    report(Problem(f"{where}.sus", f"SU {su} does not exist (1..{sus})"))
            wanted = set(phase.sus)
            chosen = [
                h
                for i, h in enumerate(gpu_order)
                if i // nodes_per_su + 1 in wanted and h not in phase_of
            ]
        elif phase.hosts is not None:
            try:
                names_given = hostlist.expand_hostlist(phase.hosts)
            except hostlist.BadHostlist as exc:
                report(Problem(f"{where}.hosts", f"bad hostlist {phase.hosts!r}: {exc}"))
                names_given = []
            unknown = [h for h in names_given if h not in position]
            if unknown:
                report(
                    Problem(f"{where}.hosts", f"not GPU nodes of this spec: {compress(unknown)}")
                )
            chosen = sorted((h for h in names_given if h in position), key=position.__getitem__)
        else:
            chosen = [h for h in gpu_order if h not in phase_of]
        taken = [h for h in chosen if h in phase_of]
        if taken:
            earlier = topo.rollout.phases[phase_of[taken[0]] - 1].name
            report(Problem(where, f"overlaps phase {earlier!r} on {compress(taken)}"))
        fresh = [h for h in chosen if h not in phase_of]
        if not fresh and not taken:
            report(Problem(where, "selects no GPU nodes"))
        for h in fresh:
            phase_of[h] = number
        plans.append(PhasePlan(number, phase.name, tuple(fresh), phase.min_pass_fraction))
    left = [h for h in gpu_order if h not in phase_of]
    if left:
        report(
            Problem(
                "rollout.phases",
                f"{len(left)} GPU nodes are in no phase: {compress(left)} "
                "(add a phase with rest: true)",
            )
        )
    return phase_of, plans


def expand(topo: Topology) -> Cluster:
    """Expand ``topo`` into every node, switch, link and phase; raise SpecError if invalid."""
    analysis = _analyse(topo)
    if analysis.problems or analysis.fabric is None:
        raise SpecError(analysis.problems or [Problem("node_groups", "no GPU nodes")])
    return _build(topo, analysis, analysis.fabric)


def _width(count: int, minimum: int = 2) -> int:
    return max(minimum, len(str(count)))


def _build(topo: Topology, analysis: _Analysis, plan: FabricPlan) -> Cluster:  # noqa: PLR0915
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
