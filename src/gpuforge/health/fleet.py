"""Fleet status from the history store and one ``scontrol show nodes``, and controller metrics.

:class:`Fleet` is what the controller knows of a cluster's GPU nodes from the inventory's
``generated/topology.json`` (no ``ansible-inventory`` run: 12,500 nodes load in well under a
second): management addresses (the collector accepts a node's record only from its own),
rail-0 leaves (the circuit breaker's groups), racks and SUs.

:func:`fleet_status` joins the latest record of every node with Slurm's view: nodes by verdict
and by action, drained by gpuforge (a reason :func:`gpuforge.admission.is_ours` parses) or by
operators, the age of each verdict, and stale nodes (no record *received* for more than
``stale_after`` intervals). Ages and staleness are the collector's clock: the time it received
each node's latest record, never the record's ``started`` (the node's clock, kept beside it as
data): a node whose clock is behind is not stale while it sends, and one that stopped sending is
stale whatever its clock said. :func:`controller_metrics` renders it and the breaker's refusals
as the textfile metrics docs/health.md lists (``gpuforge_fleet_*``,
``gpuforge_health_breaker_open``, ``gpuforge_health_refused_drains_total``).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuforge.admission import AdmissionRecord, is_ours
from gpuforge.errors import InputError
from gpuforge.history.store import VERDICTS, HistoryStore, LatestRow, iso
from gpuforge.inventory.reader import InventoryDir
from gpuforge.slurm.control import SlurmNode
from gpuforge.textfile import Family, render, write
from gpuforge.validate.xid_catalogue import Action

#: Seconds between two passive records of a node (the slurm role's HealthCheckInterval).
DEFAULT_INTERVAL_S = 300.0
#: A node with no record for this many intervals is stale.
STALE_AFTER = 3
#: What a node with no record at all counts as, in the verdict counts.
NO_RECORD = "none"
#: Where Debian's node_exporter reads textfile metrics.
TEXTFILE_DIR = Path("/var/lib/prometheus/node-exporter")
#: The controller's textfile.
TEXTFILE_NAME = "gpuforge_controller.prom"


@dataclass(frozen=True)
class Fleet:
    """The GPU nodes of one cluster as the inventory declares them."""

    name: str
    nodes: tuple[str, ...]
    addresses: Mapping[str, str]  # node -> management address
    leaves: Mapping[str, str]  # node -> leaf switch of its rail 0
    placement: Mapping[str, Mapping[str, Any]]  # node -> {rack, su}

    @classmethod
    def from_topology(cls, topology: Mapping[str, Any], source: str = "topology.json") -> Fleet:
        """Read ``topology.json``'s GPU nodes; InputError naming ``source`` when malformed."""
        fields = list(topology.get("rail_fields") or ())
        leaf_at = fields.index("leaf") if "leaf" in fields else None
        nodes: list[str] = []
        addresses: dict[str, str] = {}
        leaves: dict[str, str] = {}
        placement: dict[str, dict[str, Any]] = {}
        for i, n in enumerate(topology.get("nodes") or []):
            if not isinstance(n, Mapping) or not n.get("hostname"):
                raise InputError(f"{source}: nodes[{i}]: no hostname")
            if n.get("role") != "gpu":
                continue
            name = str(n["hostname"])
            nodes.append(name)
            if n.get("mgmt_address"):
                addresses[name] = str(n["mgmt_address"])
            rails = n.get("rails") or []
            if leaf_at is not None and rails and len(rails[0]) > leaf_at:
                leaves[name] = str(rails[0][leaf_at])
            placement[name] = {"rack": n.get("rack"), "su": n.get("su")}
        if not nodes:
            raise InputError(f"{source}: no GPU nodes")
        return cls(str(topology.get("name") or "cluster"), tuple(nodes), addresses, leaves,
                   placement)  # fmt: skip

    @classmethod
    def load(cls, inventory: Path) -> Fleet:
        """The fleet of the cluster directory ``inventory`` (its ``generated/topology.json``)."""
        path = InventoryDir.open(inventory).generated / "topology.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: {exc}") from None
        if not isinstance(data, Mapping):
            raise InputError(f"{path}: not a topology object")
        return cls.from_topology(data, str(path))


@dataclass(frozen=True)
class NodeStatus:
    """One node in the fleet status."""

    node: str
    verdict: str  # pass | warn | fail | error | none (no record)
    checks: str = ""  # the non-passing checks (history signature)
    action: str = ""  # the strongest action its failing checks name
    at: float | None = None  # the latest record's start, the node's clock (data)
    age_s: float | None = None  # since the collector received it
    stale: bool = True
    received: float | None = None  # when the collector received it (its clock)
    slurm_state: str = ""
    drained_by: str = ""  # gpuforge | operator | ""
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        data = asdict(self)
        data["at"] = iso(self.at) if self.at is not None else None
        data["received"] = iso(self.received) if self.received is not None else None
        return data


@dataclass(frozen=True)
class FleetStatus:
    """The whole fleet at one moment."""

    cluster: str
    now: float
    interval_s: float
    nodes: tuple[NodeStatus, ...]
    slurm_read: bool

    def by_verdict(self) -> dict[str, list[str]]:
        """Nodes per verdict (``none``: never reported), every verdict present."""
        out: dict[str, list[str]] = {v: [] for v in (*VERDICTS, NO_RECORD)}
        for n in self.nodes:
            out[n.verdict].append(n.node)
        return out

    def by_action(self) -> dict[str, list[str]]:
        """Failing nodes per action their checks name."""
        out: dict[str, list[str]] = {}
        for n in self.nodes:
            if n.action:
                out.setdefault(n.action, []).append(n.node)
        return out

    def drained(self) -> dict[str, list[str]]:
        """Drained nodes by whom: ``gpuforge`` or ``operator``."""
        out: dict[str, list[str]] = {"gpuforge": [], "operator": []}
        for n in self.nodes:
            if n.drained_by:
                out[n.drained_by].append(n.node)
        return out

    @property
    def stale(self) -> list[str]:
        """Nodes whose last record was received longer ago than the stale limit, or that never
        reported."""
        return [n.node for n in self.nodes if n.stale]

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` form."""
        ages = [n.age_s for n in self.nodes if n.age_s is not None]
        return {
            "cluster": self.cluster,
            "at": iso(self.now),
            "interval_s": self.interval_s,
            "slurm_read": self.slurm_read,
            "counts": {
                "nodes": len(self.nodes),
                "by_verdict": {k: len(v) for k, v in self.by_verdict().items()},
                "by_action": {k: len(v) for k, v in self.by_action().items()},
                "drained": {k: len(v) for k, v in self.drained().items()},
                "stale": len(self.stale),
            },
            "age_s": {
                "max": max(ages) if ages else None,
                "median": statistics.median(ages) if ages else None,
            },
            "nodes": [n.to_dict() for n in self.nodes],
        }


def _action(row: LatestRow) -> str:
    """The strongest action named by the non-passing checks of a failing record."""
    if row.verdict != "fail":
        return ""
    named: list[str] = []
    for part in row.signature.split(","):
        _, _, rest = part.partition("=")
        status, _, action = rest.partition(":")
        if status == "fail" and not action.endswith("~shadow"):
            named.append(action or "quarantine")
    rank = {a.value: a.rank for a in Action} | {"quarantine": Action.REBOOT.rank}
    return max(named, key=lambda a: rank.get(a, 0)) if named else ""


def fleet_status(
    fleet: Fleet,
    store: HistoryStore,
    slurm_nodes: Sequence[SlurmNode] | None,
    *,
    now: float,
    tier: str | None = "passive",
    interval_s: float = DEFAULT_INTERVAL_S,
    stale_after: int = STALE_AFTER,
) -> FleetStatus:
    """Every GPU node of ``fleet``: its latest verdict (of ``tier``) and its Slurm state."""
    latest = store.latest(tier, records=False)
    slurm = {s.name: s for s in slurm_nodes or ()}
    limit = stale_after * interval_s
    nodes: list[NodeStatus] = []
    for name in fleet.nodes:
        row = latest.get(name)
        state = slurm.get(name)
        drained_by = ""
        if state is not None and state.drained:
            drained_by = "gpuforge" if is_ours(state.reason) else "operator"
        common: dict[str, Any] = {
            "slurm_state": state.state_text if state else "",
            "drained_by": drained_by,
            "reason": state.reason if state else "",
        }
        if row is None:
            nodes.append(NodeStatus(name, NO_RECORD, **common))
            continue
        # The collector's clock on both sides: the node's started is data, not the measure.
        age = max(0.0, now - row.received)
        nodes.append(
            NodeStatus(
                name,
                row.verdict,
                checks=row.signature,
                action=_action(row),
                at=row.at,
                age_s=age,
                stale=age > limit,
                received=row.received,
                **common,
            )
        )
    return FleetStatus(fleet.name, now, interval_s, tuple(nodes), slurm_nodes is not None)


@dataclass(frozen=True)
class BreakerState:
    """The circuit breaker as the admission record shows it."""

    open: bool
    refused_total: int
    refused_recent: tuple[str, ...]


def breaker_state(record: AdmissionRecord, *, now: float, window_s: float) -> BreakerState:
    """Refused health drains: all of them, and whether any fell in the last window (open)."""
    refused = [r for r in record.actions(action="refused") if r.source == "health"]
    recent = tuple(r.action.node for r in refused if r.at >= now - window_s)
    return BreakerState(bool(recent), len(refused), recent)


def controller_metrics(status: FleetStatus | None, breaker: BreakerState | None) -> str:
    """The controller's textfile: the names docs/health.md fixes, in Prometheus text format."""
    families: list[Family] = []
    if breaker is not None:
        families += [
            Family.single(
                "gpuforge_health_breaker_open",
                "1 while the circuit breaker refused a drain in its window.",
                int(breaker.open),
            ),
            Family.single(
                "gpuforge_health_refused_drains_total",
                "Health drains the breaker refused.",
                breaker.refused_total,
                "counter",
            ),
        ]
    if status is not None:
        families.append(
            Family(
                "gpuforge_fleet_nodes",
                "GPU nodes by the verdict of their latest record.",
                "gauge",
                [({"verdict": v}, len(nodes)) for v, nodes in status.by_verdict().items()],
            )
        )
        if status.slurm_read:
            families.append(
                Family(
                    "gpuforge_fleet_drained_nodes",
                    "Drained GPU nodes by who drained them.",
                    "gauge",
                    [({"by": by}, len(nodes)) for by, nodes in status.drained().items()],
                )
            )
        families.append(
            Family.single(
                "gpuforge_fleet_stale_nodes",
                "GPU nodes without a record received for 3 intervals.",
                len(status.stale),
            )
        )
    return render(families) or "\n"


def write_textfile(directory: Path, text: str, name: str = TEXTFILE_NAME) -> Path:
    """Write ``text`` as ``directory/name`` atomically (node_exporter never reads half a file)."""
    return write(directory / name, text)


def action_counts(status: FleetStatus) -> Counter[str]:
    """Number of failing nodes per action (for one-line summaries)."""
    return Counter({k: len(v) for k, v in status.by_action().items()})
