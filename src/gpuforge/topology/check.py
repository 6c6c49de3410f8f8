"""Cross-field checks of a spec, in one pass that also plans hostnames, fabric and phases.

Field-level rules live in :mod:`gpuforge.topology.model`; the rules here relate several fields
(subnets that must hold every node, phases that must cover every GPU node, racks that must hold
their power), so each problem names its own field path. :func:`analyse` runs once per load; its
:class:`Analysis` is what :func:`gpuforge.topology.expand.build` expands.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations, islice, repeat

import hostlist

from gpuforge.topology.addressing import check_subnet
from gpuforge.topology.cluster import PhasePlan, compress
from gpuforge.topology.errors import Problem
from gpuforge.topology.fabric import FabricImpossible, FabricPlan, plan_fabric
from gpuforge.topology.model import NodeGroup, Subnet, Topology
from gpuforge.topology.spec_rules import check_rules

MAX_NODES = 200_000
"""Nodes of one spec; planning is linear in them, this bounds time and memory."""
MAX_PHASES = 1000
"""Rollout phases of one spec (a rollout has a handful: a canary, then waves)."""
BMC_SUFFIX = "-bmc"
"""A node's BMC name is its hostname and this (``inventory/templates/hosts.j2``)."""
_DECIMAL_TAIL = re.compile(r".*\{index(:0?\d*d?)?\}")
"""A hostname pattern whose names all end in a digit, so in no BMC name."""
MAX_LABEL = 63
MAX_FQDN = 253


def hostlist_size(expr: str) -> int:
    """How many names the Slurm hostlist ``expr`` expands to, without expanding it."""
    total, depth, item = 0, 0, ""
    for char in f"{expr},":
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            size = 1 if item else 0
            for group in re.findall(r"\[([^\]]*)\]", item):
                count = 0
                for part in group.split(","):
                    low, _, high = part.partition("-")
                    if low.isdigit() and high.isdigit():
                        count += max(0, int(high) - int(low)) + 1
                    else:
                        count += 1
                size *= count
            total += size
            item = ""
        else:
            item += char
    return total


def _positional(pattern: str) -> str:
    """``pattern`` with its ``{index...}`` fields as ``{0...}``: ``str.format`` of it, bound
    once and mapped over the indexes, names 200,000 nodes at a third of the keyword call's cost."""
    out = []
    for literal, field, spec, conversion in string.Formatter().parse(pattern):
        out.append(literal.replace("{", "{{").replace("}", "}}"))
        if field is not None:
            out.append("{0" + (f"!{conversion}" if conversion else "") + f":{spec}}}")
    return "".join(out)


@dataclass(slots=True)
class Analysis:
    """What checking a spec found: its hostnames, fabric and phases, and every problem."""

    hostnames: list[tuple[int, str]]  # (group index, hostname) for every node in spec order
    gpu_order: list[str]
    nvlink_nodes: int
    fabric: FabricPlan | None
    phase_of: dict[str, int]
    phases: list[PhasePlan]
    problems: list[Problem]


def check(topo: Topology) -> list[Problem]:
    """Every cross-field problem of ``topo`` (field-level ones are caught by the model)."""
    return analyse(topo).problems


def analyse(topo: Topology) -> Analysis:  # noqa: PLR0912, PLR0915 - one pass, many rules
    """Check ``topo`` across fields and plan its nodes, fabric and phases in one pass."""
    problems: list[Problem] = []
    add = problems.append
    types = topo.node_types
    total_nodes = sum(g.count for g in topo.node_groups)
    if total_nodes > MAX_NODES:
        add(Problem("node_groups", f"{total_nodes} nodes, more than gpuforge plans ({MAX_NODES})"))
        return Analysis([], [], 1, None, {}, [], problems)

    # Node groups: types, names, roles, hostnames.
    seen_groups: dict[str, int] = {}
    hostnames: list[tuple[int, str]] = []
    gpu_order: list[str] = []
    owner: dict[str, int] = {}
    bmc_like: list[tuple[int, str]] = []  # hostnames that end as BMC names do
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
        indexes = range(group.first_index, group.first_index + group.count)
        names = list(map(_positional(pattern).format, indexes))
        _check_name_lengths(topo.domain, where, names, add)
        if not _DECIMAL_TAIL.fullmatch(pattern):
            bmc_like.extend((gi, n) for n in names if n.endswith(BMC_SUFFIX))
        mine = dict.fromkeys(names, gi)
        if len(mine) == len(names) and not mine.keys() & owner.keys():
            owner.update(mine)
            hostnames.extend(zip(repeat(gi), names))
            if group.role == "gpu":
                gpu_order.extend(names)
            last = names[-1]
            if len(last) > 63 or not last.replace("-", "").isalnum() or last != last.lower():
                add(Problem(f"{where}.hostname", f"pattern gives {last!r}, not a valid DNS label"))
            continue
        for name in names:  # a duplicate: the first one, named
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
            if group.role == "gpu":
                gpu_order.append(name)

    for gi, name in bmc_like:
        node = name.removesuffix(BMC_SUFFIX)
        if node in owner:
            add(
                Problem(
                    f"node_groups[{gi}].hostname",
                    f"hostname {name} is also the BMC name of node {node} (group "
                    f"{topo.node_groups[owner[node]].name!r}): /etc/hosts would give it two "
                    "addresses",
                )
            )
            break
    _check_node_types(topo, add)

    roles = {g.role for g in topo.node_groups}
    if "gpu" not in roles:
        add(Problem("node_groups", "no group has role gpu"))
    if "controller" not in roles:
        add(Problem("node_groups", "no group has role controller (the Slurm controller)"))

    gpu_groups = [
        (gi, g) for gi, g in enumerate(topo.node_groups) if g.role == "gpu" and g.node_type in types
    ]
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
    _check_monitoring_servers(topo, owner, add)
    problems.extend(check_rules(topo, "block" if nvlink_nodes > 1 else "tree"))
    return Analysis(hostnames, gpu_order, nvlink_nodes, fabric, phase_of, phases, problems)


def _check_name_lengths(
    domain: str, where: str, names: list[str], add: Callable[[Problem], None]
) -> None:
    """A group's names, with the BMC suffix and the domain, are DNS labels and FQDNs."""
    size = max(map(len, names))
    if size + len(BMC_SUFFIX) + 1 + len(domain) <= MAX_FQDN and size + len(BMC_SUFFIX) <= MAX_LABEL:
        return
    longest = next(n for n in names if len(n) == size)
    if size + len(BMC_SUFFIX) > MAX_LABEL:
        add(
            Problem(
                f"{where}.hostname",
                f"the BMC name {longest}{BMC_SUFFIX} is longer than a DNS label ({MAX_LABEL})",
            )
        )
    fqdn = f"{longest}{BMC_SUFFIX}.{domain}"
    if len(fqdn) > MAX_FQDN:
        add(
            Problem(
                f"{where}.hostname",
                f"the FQDN {fqdn} is {len(fqdn)} characters, more than {MAX_FQDN}",
            )
        )


def _check_node_types(topo: Topology, add: Callable[[Problem], None]) -> None:
    """Each node type's NICs are distinct interfaces; NVSwitch has an NVLink domain."""
    for name, kind in topo.node_types.items():
        where = f"node_types.{name}"
        if kind.nvswitch and not kind.gpus:
            add(Problem(f"{where}.nvswitch", "NVSwitch on a node type without GPUs"))
        elif kind.nvswitch and kind.nvlink_domain < 1:
            add(
                Problem(
                    f"{where}.nvlink_domain",
                    f"{kind.nvlink_domain} with NVSwitch: give the GPUs of one NVLink domain "
                    f"(at least the node's {kind.gpus}; 8 for HGX, 72 for NVL72)",
                )
            )
        elif kind.nvlink_domain and not kind.gpus:
            add(Problem(f"{where}.nvlink_domain", "an NVLink domain on a node type without GPUs"))
        # Netdevs and RDMA devices are names of their own; storage_nics may hold either.
        mgmt = kind.management_nic
        used: dict[str, str] = {} if mgmt is None else {mgmt: "management_nic"}
        for ri, nic in enumerate(kind.rails):
            if nic.netdev == mgmt:
                add(Problem(f"{where}.rails[{ri}].netdev", f"{mgmt} is also management_nic"))
            used.setdefault(nic.netdev, f"rails[{ri}].netdev")
            used.setdefault(nic.device, f"rails[{ri}].device")
        for si, storage in enumerate(kind.storage_nics):
            other = used.get(storage)
            if other is not None:
                add(Problem(f"{where}.storage_nics[{si}]", f"{storage} is also {other}"))
            used.setdefault(storage, f"storage_nics[{si}]")


def _check_monitoring_servers(
    topo: Topology, owner: dict[str, int], add: Callable[[Problem], None]
) -> None:
    """``monitoring.servers`` names nodes of the spec (the Prometheus shards)."""
    expr = topo.monitoring.servers
    if expr is None:
        return
    where = "monitoring.servers"
    if hostlist_size(expr) > 1000:
        add(Problem(where, f"{expr!r} names more than 1000 Prometheus servers"))
        return
    try:
        names = hostlist.expand_hostlist(expr)
    except hostlist.BadHostlist as exc:
        add(Problem(where, f"{expr!r} is not a hostlist: {exc}"))
        return
    unknown = [n for n in names if n not in owner]
    if not names or unknown:
        shown = ", ".join(unknown[:5]) or repr(expr)
        add(Problem(where, f"not nodes of this spec: {shown}"))


def _check_power(
    topo: Topology, gpu_groups: list[tuple[int, NodeGroup]], add: Callable[[Problem], None]
) -> None:
    layout = topo.layout
    per_node: list[float] = []  # each GPU node's power, in rack order
    for _, group in gpu_groups:
        per_node.extend([topo.node_types[group.node_type].power_kw] * group.count)
    npr = layout.nodes_per_rack
    power = [sum(per_node[start : start + npr]) for start in range(0, len(per_node), npr)]
    if power and max(power) > layout.rack_power_kw + 1e-9:
        worst = power.index(max(power))
        add(
            Problem(
                "layout.rack_power_kw",
                f"rack {worst + 1} holds {min(npr, len(per_node))} GPU nodes "
                f"drawing {max(power):g} kW, more than the {layout.rack_power_kw:g} kW budget",
            )
        )


def _plan_phases(  # noqa: PLR0912, PLR0915 - one branch per selector and rule
    topo: Topology, gpu_order: list[str], add: Callable[[Problem], None]
) -> tuple[dict[str, int], list[PhasePlan]]:
    report = add
    nodes_per_su = topo.layout.nodes_per_su
    phases = topo.rollout.phases
    if len(phases) > MAX_PHASES:
        report(Problem("rollout.phases", f"{len(phases)} phases, more than {MAX_PHASES}"))
        return {}, []
    named = sum(hostlist_size(p.hosts) for p in phases if p.hosts is not None)
    if named > MAX_NODES:
        report(
            Problem(
                "rollout.phases", f"the phases' hosts name {named} nodes, more than {MAX_NODES}"
            )
        )
        return {}, []
    total = len(gpu_order)
    position: dict[str, int] = {}  # GPU node -> place, made when a phase names hosts
    phase_of: dict[str, int] = {}
    cursor = 0  # every GPU node before it is in a phase already

    def free(limit: int | None = None) -> list[str]:
        """GPU nodes no phase took yet, in order (the first ``limit``).

        Each call costs what it selects and the taken nodes it steps over, each of which it
        steps over once (``cursor``): many phases over many nodes stay linear (a list scan per
        phase took 25 s for 1,100 phases).
        """
        nonlocal cursor
        while cursor < total and gpu_order[cursor] in phase_of:
            cursor += 1
        untaken = (h for h in map(gpu_order.__getitem__, range(cursor, total)) if h not in phase_of)
        return list(untaken if limit is None else islice(untaken, limit))

    plans: list[PhasePlan] = []
    names: set[str] = set()
    for pi, phase in enumerate(phases):
        where = f"rollout.phases[{pi}]"
        number = pi + 1
        if phase.name in names:
            report(Problem(f"{where}.name", f"duplicate phase name {phase.name!r}"))
        names.add(phase.name)
        chosen: list[str] = []
        if phase.count is not None:
            left = total - len(phase_of)
            if left < phase.count:
                report(
                    Problem(f"{where}.count", f"{phase.count} nodes asked, {left} GPU nodes left")
                )
            chosen = free(phase.count)
        elif phase.sus is not None:
            sus = math.ceil(len(gpu_order) / nodes_per_su)
            for su in phase.sus:
                if not 1 <= su <= sus:
                    report(Problem(f"{where}.sus", f"SU {su} does not exist (1..{sus})"))
            chosen = [
                gpu_order[i]
                for su in sorted(set(phase.sus))
                if 1 <= su <= sus
                for i in range((su - 1) * nodes_per_su, min(su * nodes_per_su, len(gpu_order)))
                if gpu_order[i] not in phase_of
            ]
        elif phase.hosts is not None:
            try:
                names_given = hostlist.expand_hostlist(phase.hosts)
            except hostlist.BadHostlist as exc:
                report(Problem(f"{where}.hosts", f"bad hostlist {phase.hosts!r}: {exc}"))
                continue
            if not position:
                position = dict(zip(gpu_order, range(total), strict=True))
            unknown = [h for h in names_given if h not in position]
            if unknown:
                report(
                    Problem(f"{where}.hosts", f"not GPU nodes of this spec: {compress(unknown)}")
                )
            chosen = sorted((h for h in names_given if h in position), key=position.__getitem__)
        else:
            chosen = free()
        taken = [h for h in chosen if h in phase_of]
        if taken:
            earlier = phases[phase_of[taken[0]] - 1].name
            report(Problem(where, f"overlaps phase {earlier!r} on {compress(taken)}"))
        fresh = [h for h in chosen if h not in phase_of]
        if not fresh and not taken:
            report(Problem(where, "selects no GPU nodes"))
        phase_of.update(zip(fresh, repeat(number)))
        plans.append(PhasePlan(number, phase.name, tuple(fresh), phase.min_pass_fraction))
    left_out = free() if len(phase_of) < total else []
    if left_out:
        report(
            Problem(
                "rollout.phases",
                f"{len(left_out)} GPU nodes are in no phase: {compress(left_out)} "
                "(add a phase with rest: true)",
            )
        )
    return phase_of, plans
