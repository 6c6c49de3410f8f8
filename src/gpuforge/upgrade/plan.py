"""Planning a rolling upgrade: which nodes change what, in which waves, at what capacity.

:func:`plan_upgrade` is pure: it takes the expanded cluster (the spec with the new pins), what
each GPU node has installed (:class:`Installed`, read from the history store by
:func:`installed_from_history`) and the :class:`Limits`, and returns an :class:`UpgradePlan`.
``gpuforge upgrade plan`` prints it; ``gpuforge upgrade run`` executes its waves in order.

Rules (docs/upgrades.md "The plan"):

- A node changes the components whose installed version does not match the pin (the same
  matching as the node's ``software.versions`` check). A node with no known versions is planned
  with every component changing and a reboot (it is listed under ``unknown``).
- A driver, kernel or DOCA/OFED change needs a reboot (new kernel modules).
- The unit taken out is a node, or on multi-node NVLink domains (NVL72) every changing node of
  the domain together: a domain missing one node cannot run a job that needs the domain.
- Waves follow the spec's rollout phases (the canary phase's nodes first; a wave never mixes
  phases); within a phase, a wave takes whole leaves (Slurm's lowest topology switch), or at
  most ``max_per_leaf`` units of one leaf, in cluster order, while the GPUs out stay within
  ``max_fraction`` of the partition's. Whole leaves, not one node of every leaf: a leaf is then
  either entirely in service or entirely out, and a job that needs a full leaf still finds one.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import hostlist

from gpuforge.history.store import HistoryStore, iso
from gpuforge.topology.cluster import Cluster, Node
from gpuforge.topology.compat import judge, spec_pins
from gpuforge.validate.checks import pinned_version

PARTITION = "gpu"
"""The partition gpuforge's nodes.conf puts every GPU node in."""

REBOOT_COMPONENTS = ("nvidia_driver", "kernel", "doca_ofed")
"""Components whose change loads new kernel modules: the node reboots."""

ORDER = ("nvidia_driver", "fabricmanager", "cuda", "nccl", "dcgm", "doca_ofed", "kernel", "slurm")
"""Components in the order a node applies them (the roles' order) and plans print them."""

NODE_KEYS = {"driver": "nvidia_driver"}
"""The node checker's version keys (health.yaml ``expect.versions``) that differ from ours."""


@dataclass(frozen=True, slots=True)
class Limits:
    """How much of the fleet may be out at once (the spec's ``upgrade:`` section)."""

    max_per_leaf: int | None = None  # None: a whole leaf at once
    max_fraction: float = 0.10

    def __post_init__(self) -> None:
        if self.max_per_leaf is not None and self.max_per_leaf < 1:
            raise ValueError("max_per_leaf must be at least 1")
        if not 0.0 < self.max_fraction <= 1.0:
            raise ValueError("max_fraction must be above 0 and at most 1")


@dataclass(frozen=True, slots=True)
class Installed:
    """What one node has: component -> installed version (None: the node reported it absent)."""

    versions: Mapping[str, str | None]
    source: str  # e.g. "history passive 2026-11-30T19:20:00Z"


@dataclass(frozen=True, slots=True)
class Change:
    """One component of one node moving from ``current`` to ``target``."""

    component: str
    current: str | None
    target: str

    def render(self) -> str:
        return f"{self.component} {self.current or 'absent'} -> {self.target}"


@dataclass(frozen=True, slots=True)
class NodeStep:
    """One node's part of the upgrade."""

    node: str
    leaf: str
    gpus: int
    phase: str
    changes: tuple[Change, ...]
    reboot: bool
    known: bool  # False: no record of the node's versions, every component planned

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "leaf": self.leaf,
            "gpus": self.gpus,
            "phase": self.phase,
            "changes": [
                {"component": c.component, "current": c.current, "target": c.target}
                for c in self.changes
            ],
            "reboot": self.reboot,
            "known": self.known,
        }


@dataclass(frozen=True, slots=True)
class Wave:
    """Nodes out of service together; the next wave starts after this one passed its gate."""

    number: int
    phase: str
    steps: tuple[NodeStep, ...]
    partition_gpus: int

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(s.node for s in self.steps)

    @property
    def gpus_out(self) -> int:
        return sum(s.gpus for s in self.steps)

    @property
    def gpus_in_service(self) -> int:
        return self.partition_gpus - self.gpus_out

    @property
    def in_service_fraction(self) -> float:
        return self.gpus_in_service / self.partition_gpus if self.partition_gpus else 1.0

    @property
    def reboots(self) -> int:
        return sum(1 for s in self.steps if s.reboot)

    def to_dict(self) -> dict[str, Any]:
        return {
            "wave": self.number,
            "phase": self.phase,
            "nodes": list(self.nodes),
            "hostlist": hostlist.collect_hostlist(list(self.nodes)),
            "nodes_out": len(self.steps),
            "gpus_out": self.gpus_out,
            "gpus_in_service": self.gpus_in_service,
            "in_service_fraction": round(self.in_service_fraction, 4),
            "reboots": self.reboots,
            "steps": [s.to_dict() for s in self.steps],
        }


@dataclass(frozen=True, slots=True)
class UpgradePlan:
    """The whole plan; ``waves`` run in order, one at a time."""

    cluster: str
    pins: Mapping[str, str]
    limits: Limits
    partition: str
    partition_gpus: int
    waves: tuple[Wave, ...]
    up_to_date: tuple[str, ...]
    unknown: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def steps(self) -> tuple[NodeStep, ...]:
        return tuple(s for w in self.waves for s in w.steps)

    @property
    def min_in_service_fraction(self) -> float:
        """The lowest share of the partition's GPUs in service at any moment."""
        return min((w.in_service_fraction for w in self.waves), default=1.0)

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON (``gpuforge upgrade plan --json``; ``upgrade run`` reads it)."""
        return {
            "cluster": self.cluster,
            "pins": dict(self.pins),
            "limits": {
                "max_per_leaf": self.limits.max_per_leaf,  # null: a whole leaf
                "max_fraction": self.limits.max_fraction,
            },
            "partition": self.partition,
            "partition_gpus": self.partition_gpus,
            "nodes_to_change": len(self.steps),
            "reboots": sum(w.reboots for w in self.waves),
            "min_in_service_fraction": round(self.min_in_service_fraction, 4),
            "waves": [w.to_dict() for w in self.waves],
            "up_to_date": list(self.up_to_date),
            "unknown": list(self.unknown),
            "notes": list(self.notes),
        }


def node_versions(measured: str) -> dict[str, str | None]:
    """Parse ``software.versions``' measured text (``cuda=12.8.1-1, driver=570.133.20, ...``).

    Keys become components (``driver`` -> ``nvidia_driver``); ``absent`` becomes None. A driver
    that differs between GPUs reads ``570.133.20,570.124.06`` and never matches a pin.
    """
    out: dict[str, str | None] = {}
    for item in measured.split(", "):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            continue
        value = value.strip()
        out[NODE_KEYS.get(key.strip(), key.strip())] = None if value in ("", "absent") else value
    return out


def _leaf(cluster: Cluster, node: Node) -> str:
    """The node's lowest Slurm topology switch (tree), or its rack without a compute fabric."""
    if not node.rails:
        return node.rack
    if cluster.fabric.rail_optimized:
        return f"leaf-su{node.su:0{max(2, len(str(cluster.sus)))}d}"
    return node.rails[0].leaf


def _changes(
    pins: Mapping[str, str], installed: Installed | None, *, nvswitch: bool
) -> tuple[Change, ...]:
    out = []
    for component in ORDER:
        target = pins.get(component)
        if target is None or (component == "fabricmanager" and not nvswitch):
            continue  # Fabric Manager runs only where NVSwitches are
        if installed is None:
            out.append(Change(component, None, target))
            continue
        if component not in installed.versions:
            continue  # the node does not report it (DOCA, kernel): nothing to compare
        current = installed.versions[component]
        if not pinned_version(current, target).ok:
            out.append(Change(component, current, target))
    return tuple(out)


def plan_upgrade(  # noqa: PLR0912, PLR0915 - one pass over nodes, units and waves
    cluster: Cluster,
    installed: Mapping[str, Installed],
    limits: Limits | None = None,
) -> UpgradePlan:
    """Plan moving every GPU node of ``cluster`` to the pins of its spec (see module doc)."""
    limits = limits or Limits(cluster.spec.upgrade.max_per_leaf, cluster.spec.upgrade.max_fraction)
    pins = spec_pins(cluster.spec.versions)
    kinds = cluster.spec.node_types
    gpu_nodes = cluster.gpu_nodes
    phase_names = {p.number: p.name for p in cluster.phases}
    partition_gpus = sum(kinds[n.node_type].gpus for n in gpu_nodes)
    cap = math.floor(limits.max_fraction * partition_gpus + 1e-9)
    notes: list[str] = []

    steps: list[tuple[Node, NodeStep]] = []
    up_to_date: list[str] = []
    unknown: list[str] = []
    foreign: set[str] = set()
    for node in gpu_nodes:
        have = installed.get(node.hostname)
        changes = _changes(pins, have, nvswitch=kinds[node.node_type].nvswitch)
        if have is None:
            unknown.append(node.hostname)
        else:
            extra = {k: v for k, v in have.versions.items() if k not in pins and v}
            verdict = judge(dict(pins) | extra) if extra else None
            for conflict in verdict.conflicts if verdict else ():
                foreign.add(f"{node.hostname}: {conflict.message()}")
        if not changes:
            up_to_date.append(node.hostname)
            continue
        reboot = have is None or any(c.component in REBOOT_COMPONENTS for c in changes)
        steps.append(
            (
                node,
                NodeStep(
                    node=node.hostname,
                    leaf=_leaf(cluster, node),
                    gpus=kinds[node.node_type].gpus,
                    phase=phase_names.get(node.phase, str(node.phase)),
                    changes=changes,
                    reboot=reboot,
                    known=have is not None,
                ),
            )
        )

    # Units: a node, or the changing nodes of one multi-node NVLink domain together.
    by_phase: dict[int, OrderedDict[str, list[NodeStep]]] = {}
    for node, step in steps:
        unit = f"nvl{node.nvlink_block}" if node.nvlink_block else node.hostname
        by_phase.setdefault(node.phase, OrderedDict()).setdefault(unit, []).append(step)

    waves: list[Wave] = []
    too_big = False
    for phase in sorted(by_phase):
        # Per leaf, its units in cluster order, and the GPUs they hold.
        queues: OrderedDict[str, deque[list[NodeStep]]] = OrderedDict()
        pending: dict[str, int] = {}
        for members in by_phase[phase].values():
            leaf = members[0].leaf
            queues.setdefault(leaf, deque()).append(members)
            pending[leaf] = pending.get(leaf, 0) + sum(s.gpus for s in members)
        while queues:
            taken: list[NodeStep] = []
            gpus = 0
            for leaf, queue in queues.items():
                k = limits.max_per_leaf
                batch = len(queue) if k is None or k >= len(queue) else k
                size = (
                    pending[leaf]
                    if batch == len(queue)
                    else sum(s.gpus for unit in islice(queue, batch) for s in unit)
                )
                if gpus + size <= cap:
                    for _ in range(batch):
                        taken.extend(queue.popleft())
                    gpus += size
                    pending[leaf] -= size
                    continue
                if not taken:
                    # The leaf's batch alone is over the cap: take units up to it, at least one.
                    for _ in range(batch):
                        unit_size = sum(s.gpus for s in queue[0])
                        if taken and gpus + unit_size > cap:
                            break
                        too_big = too_big or unit_size > cap
                        taken.extend(queue.popleft())
                        gpus += unit_size
                        pending[leaf] -= unit_size
                break
            for leaf in [leaf for leaf, queue in queues.items() if not queue]:
                del queues[leaf]
            waves.append(
                Wave(
                    len(waves) + 1, phase_names.get(phase, str(phase)), tuple(taken), partition_gpus
                )
            )
    if too_big:
        notes.append(
            f"max_fraction {limits.max_fraction:g} allows {cap} of {partition_gpus} GPUs out, "
            "fewer than one unit: such waves take one unit and leave less in service"
        )
    if unknown:
        notes.append(
            f"no version record for {hostlist.collect_hostlist(unknown)} ({len(unknown)}): "
            "planned as changing every component, with a reboot"
        )
    if any(c.component == "slurm" for _, s in steps for c in s.changes):
        notes.append(
            "slurm changes: upgrade slurmdbd, then slurmctld, before any slurmd "
            "(slurmd may be older than slurmctld, never newer)"
        )
    notes.extend(sorted(foreign))
    return UpgradePlan(
        cluster=cluster.name,
        pins=pins,
        limits=limits,
        partition=PARTITION,
        partition_gpus=partition_gpus,
        waves=tuple(waves),
        up_to_date=tuple(up_to_date),
        unknown=tuple(unknown),
        notes=tuple(notes),
    )


TIERS = ("passive", "conformance")
"""Record tiers whose ``software.versions`` check says what a node has installed."""


def installed_from_history(store: HistoryStore) -> dict[str, Installed]:
    """Each node's newest ``software.versions`` measurement in the history store."""
    rows = (
        (row.node, row.tier, row.at, row.record)
        for tier in TIERS
        for row in store.latest(tier).values()
    )
    return installed_from_records(rows)


def installed_from_records(
    records: Iterable[tuple[str, str, float, Mapping[str, Any]]],
) -> dict[str, Installed]:
    """Each node's newest ``software.versions`` measurement.

    ``records`` yields (node, tier, time in epoch seconds, record); a record whose check did
    not run (skip/error, or no measured text) does not count.
    """
    best: dict[str, tuple[float, Installed]] = {}
    for node, tier, at, record in records:
        for check in record.get("checks") or ():
            if check.get("check") != "software.versions":
                continue
            measured = check.get("measured")
            if check.get("status") not in ("pass", "fail", "warn") or not measured:
                continue
            if node in best and best[node][0] >= at:
                continue
            source = f"history {tier} {iso(at)}"
            best[node] = (at, Installed(node_versions(str(measured)), source))
    return {node: item for node, (_, item) in best.items()}


def render_text(plan: UpgradePlan) -> list[str]:
    """The plan as lines: per wave its nodes grouped by identical changes, and the capacity."""
    total = len(plan.steps) + len(plan.up_to_date)
    lines = [
        f"{plan.cluster}: {total} GPU nodes, {len(plan.steps)} to change "
        f"({sum(w.reboots for w in plan.waves)} with a reboot), {len(plan.up_to_date)} up to "
        f"date, {len(plan.unknown)} without a version record",
        "target    " + ", ".join(f"{k} {plan.pins[k]}" for k in ORDER if k in plan.pins),
        f"limits    {plan.limits.max_per_leaf or 'whole'} unit(s) per leaf, "
        f"{plan.limits.max_fraction:.0%} of partition {plan.partition} "
        f"({math.floor(plan.limits.max_fraction * plan.partition_gpus + 1e-9)} of "
        f"{plan.partition_gpus} GPUs) at once",
        f"waves     {len(plan.waves)}; lowest capacity in service "
        f"{plan.min_in_service_fraction:.1%} of {plan.partition_gpus} GPUs",
    ]
    for wave in plan.waves:
        lines.append(
            f"wave {wave.number} ({wave.phase}): {len(wave.steps)} nodes, {wave.gpus_out} GPUs "
            f"out, {wave.gpus_in_service}/{wave.partition_gpus} GPUs in service "
            f"({wave.in_service_fraction:.1%}), {wave.reboots} reboots"
        )
        groups: OrderedDict[tuple[str, bool], list[str]] = OrderedDict()
        for step in wave.steps:
            what = ", ".join(c.render() for c in step.changes)
            groups.setdefault((what, step.reboot), []).append(step.node)
        for (what, reboot), nodes in groups.items():
            lines.append(
                f"  {hostlist.collect_hostlist(nodes)}: {what}{'; reboot' if reboot else ''}"
            )
    if plan.up_to_date:
        lines.append(f"up to date: {hostlist.collect_hostlist(list(plan.up_to_date))}")
    lines.extend(f"note: {n}" for n in plan.notes)
    return lines
