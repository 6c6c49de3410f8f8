"""Fleet risk: score every node from its series features, its peers and its events.

Signals (names are stable: they appear in reasons, drains and the scorecard):

* ``ecc_sbe_rate``, ``pcie_replay``, ``nvlink_crc``, ``ib_symbol_errors``: a counter's rate in
  the last bin against its peers (robust z: median and MAD of the same metric among nodes of the
  same ``node_type``) and its trend over the window (Theil-Sen). A rate high against the peers in
  fewer than :data:`PERSISTENT_BINS` bins is a one-off burst: reported, weak, never a drain;
* ``ib_link_downed``: a port whose link went down repeatedly within the window;
* ``row_remap``: remapped rows against NVIDIA's limits (512 per GPU; banks whose spare rows are
  low or gone, DCGM's bank histogram), their growth within the window, a pending remap;
* ``thermal_drift``: one GPU warming more than the other GPUs of its node (which run the same
  job, so a load change is no drift) and more than its rack (so a whole rack warming is not N
  nodes at risk);
* ``clock_low``: a GPU whose SM clock runs far below its peers';
* ``xid_recurrence``: Xid 13/31/43 (application-class) recurring on the same GPU, or a
  hardware Xid seen again; ``remediation_recurrence``: more than one remediation or health drain
  of the node within the window (NVSentinel's rule of thumb).

A rack whose nodes warm together is a facility finding (``cooling``), and a leaf where most nodes
see the same fabric errors is a ``fabric`` finding: their nodes are not scored for it.
A node's score is the noisy-or of its strongest finding per signal, in [0, 1).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuforge.predict.history import Event, FloatArray, History, format_time
from gpuforge.predict.signals import (
    DAY_S,
    HOUR_S,
    Features,
    Window,
    counter_features,
    gauge_features,
    level_features,
    nanmedian_rows,
    robust_scale,
)
from gpuforge.validate.xid_catalogue import catalogue as xid_catalogue


@dataclass(frozen=True)
class CounterSignal:
    """A counter metric read for its rate: below ``floor_per_h`` a rate is never a finding."""

    signal: str
    what: str
    floor_per_h: float
    scope: str | None = None  # "leaf": most of a leaf at once is a fabric finding


#: dcgm-exporter's and node_exporter's names (docs/predictive.md cites the sources).
ECC_SBE = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
PCIE_REPLAY = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
NVLINK_CRC = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
IB_SYMBOL = "node_infiniband_symbol_error_total"
IB_LINK_DOWNED = "node_infiniband_link_downed_total"
REMAP_CORRECTABLE = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"
REMAP_UNCORRECTABLE = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"
REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
BANKS_LOW = "DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_LOW"
BANKS_NONE = "DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_NONE"
GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"

COUNTERS: Mapping[str, CounterSignal] = {
    ECC_SBE: CounterSignal("ecc_sbe_rate", "correctable ECC errors", 1.0),
    PCIE_REPLAY: CounterSignal("pcie_replay", "PCIe replays", 2.0),
    NVLINK_CRC: CounterSignal("nvlink_crc", "NVLink CRC flit errors", 2.0),
    IB_SYMBOL: CounterSignal("ib_symbol_errors", "IB symbol errors", 2.0, scope="leaf"),
    IB_LINK_DOWNED: CounterSignal("ib_link_downed", "IB link down events", 0.0, scope="leaf"),
}
REMAP_METRICS = (
    REMAP_CORRECTABLE,
    REMAP_UNCORRECTABLE,
    REMAP_PENDING,
    REMAP_FAILURE,
    BANKS_LOW,
    BANKS_NONE,
)
GAUGES = (GPU_TEMP, SM_CLOCK)
#: Every metric the scorer reads; others in a history are ignored.
METRICS = (*COUNTERS, *REMAP_METRICS, *GAUGES)
#: NVIDIA: row remapping supports up to 512 remappings per GPU frame buffer (docs/predictive.md).
REMAP_LIMIT = 512
#: Xids NVIDIA sends to the application first; recurring on one GPU they point at the GPU.
RECURRING_XIDS = frozenset({13, 31, 43})
#: Elevated bins needed before a high rate counts as persistent rather than a burst.
PERSISTENT_BINS = 2
#: Robust z above which a rate or level stands out from its peers.
PEER_Z = 3.0
#: A GPU whose temperature rose this much more than its rack's (degrees C) drifts; a rack whose
#: median rose this much more than the fleet's warms as a whole.
RISE_C = 2.0
#: Fraction of a group's nodes that makes a finding the group's (facility), not the nodes'.
GROUP_FRACTION = 0.5
GROUP_MIN_NODES = 3
SIGNALS = (
    *(c.signal for c in COUNTERS.values()),
    "row_remap",
    "thermal_drift",
    "clock_low",
    "xid_recurrence",
    "remediation_recurrence",
)


@dataclass(frozen=True)
class Finding:
    """One reason a node is at risk: the signal, where, how strong, and the numbers."""

    signal: str
    subject: str
    strength: float
    detail: str
    value: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "signal": self.signal,
            "subject": self.subject,
            "strength": round(float(self.strength), 3),
            "value": round(float(self.value), 3),
            "detail": self.detail,
        }


@dataclass(frozen=True)
class GroupFinding:
    """A finding of a whole rack or leaf (facility: cooling, fabric), not of its nodes."""

    kind: str
    scope: str
    group: str
    signal: str
    nodes: tuple[str, ...]
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "kind": self.kind,
            "scope": self.scope,
            "group": self.group,
            "signal": self.signal,
            "nodes": list(self.nodes),
            "detail": self.detail,
        }


@dataclass(frozen=True)
class NodeRisk:
    """A node's score and reasons, or why it could not be scored."""

    node: str
    score: float
    findings: tuple[Finding, ...] = ()
    status: str = "scored"  # scored | insufficient_data
    note: str = ""

    @property
    def top_signal(self) -> str:
        """The signal of the strongest finding (what a drain reason names)."""
        return max(self.findings, key=lambda f: f.strength).signal if self.findings else ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "node": self.node,
            "status": self.status,
            "score": round(float(self.score), 4),
            "signal": self.top_signal,
            "findings": [f.to_dict() for f in self.findings],
            "note": self.note,
        }


@dataclass(frozen=True)
class RiskReport:
    """Every node ranked (highest score first), insufficient-data nodes last; group findings."""

    at: float
    window_s: float
    horizon_s: float
    nodes: tuple[NodeRisk, ...]
    groups: tuple[GroupFinding, ...] = ()
    skipped_lines: int = 0
    source: str = ""

    @property
    def ranked(self) -> list[NodeRisk]:
        """Scored nodes, highest score first."""
        return [n for n in self.nodes if n.status == "scored"]

    @property
    def insufficient(self) -> list[NodeRisk]:
        """Nodes with too little data to score (never read as safe)."""
        return [n for n in self.nodes if n.status != "scored"]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of ``gpuforge fleet risk --json``."""
        return {
            "schema": "gpuforge.risk/1",
            "at": format_time(self.at),
            "window_s": self.window_s,
            "horizon_s": self.horizon_s,
            "source": self.source,
            "skipped_lines": self.skipped_lines,
            "nodes": [n.to_dict() for n in self.nodes],
            "facility": [g.to_dict() for g in self.groups],
        }


@dataclass
class _Block:
    nodes: list[str] = field(default_factory=list)
    subjects: list[str] = field(default_factory=list)
    feats: list[Features] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)


@dataclass
class _Table:
    """One metric's features for every series, as flat arrays."""

    node: list[str]
    subject: list[str]
    bins: FloatArray
    slope: FloatArray
    first: FloatArray
    last: FloatArray


class FleetFeatures:
    """Accumulates per-series features node by node, so raw samples need not stay in memory."""

    def __init__(self, window: Window) -> None:
        self.window = window
        self._blocks: dict[str, _Block] = defaultdict(_Block)
        self.coverage: dict[str, float] = {}
        self.last_time: dict[str, float] = {}

    def add(
        self, node: str, metric: str, subjects: Sequence[str], t: FloatArray, x: FloatArray
    ) -> None:
        """Add ``x`` (one row per subject) of ``metric`` on ``node``, sampled at ``t``."""
        if metric not in METRICS:
            return
        if metric in GAUGES:
            feats = gauge_features(t, x, self.window)
        elif metric in REMAP_METRICS:
            feats = level_features(t, x, self.window)
        else:
            feats = counter_features(t, x, self.window)
        block = self._blocks[metric]
        block.nodes.extend([node] * len(subjects))
        block.subjects.extend(subjects)
        block.feats.append(feats)
        self.coverage[node] = max(self.coverage.get(node, 0.0), feats.coverage)
        if feats.samples:
            self.last_time[node] = max(self.last_time.get(node, -np.inf), feats.last_time)

    def table(self, metric: str) -> _Table | None:
        """The flat feature arrays of ``metric``, or None when no series had it."""
        block = self._blocks.get(metric)
        if block is None or not block.feats:
            return None
        return _Table(
            node=block.nodes,
            subject=block.subjects,
            bins=np.vstack([f.bins for f in block.feats]),
            slope=np.concatenate([f.slope for f in block.feats]),
            first=np.concatenate([f.first for f in block.feats]),
            last=np.concatenate([f.last for f in block.feats]),
        )

    @classmethod
    def from_history(cls, history: History, window: Window) -> FleetFeatures:
        """Features of every series of ``history`` the scorer reads."""
        fleet = cls(window)
        for key, (t, v) in history.series.items():
            if key.metric in METRICS:
                fleet.add(key.node, key.metric, [key.subject], t, v[None, :])
        return fleet


def _noisy_or(strengths: Iterable[float]) -> float:
    keep = 1.0
    for s in strengths:
        keep *= 1.0 - min(max(s, 0.0), 0.99)
    return float(1.0 - keep)


def _peer_groups(nodes: Sequence[str], labels: Mapping[str, Mapping[str, str]]) -> list[str]:
    return [labels.get(n, {}).get("node_type", "") for n in nodes]


def _counter_findings(
    table: _Table, sig: CounterSignal, window: Window, labels: Mapping[str, Mapping[str, str]]
) -> list[tuple[str, Finding]]:
    bin_h = window.bin_s / HOUR_S
    recent = table.bins[:, -1] / bin_h
    with np.errstate(invalid="ignore"):
        earlier = table.bins[:, :-1]
        baseline = (
            np.where(
                np.isfinite(earlier).any(axis=1),
                np.nansum(earlier, axis=1) / np.maximum(np.isfinite(earlier).sum(axis=1), 1),
                np.nan,
            )
            / bin_h
        )
    out: list[tuple[str, Finding]] = []
    if sig.signal == "ib_link_downed":
        total = np.nansum(table.bins, axis=1)
        for i in np.nonzero(total >= 2)[0]:
            n = int(total[i])
            strength = min(0.9, 0.45 + 0.1 * (n - 2))
            detail = f"link went down {n} times within the window"
            out.append((table.node[i], Finding(sig.signal, table.subject[i], strength, detail, n)))
        return out
    groups = np.asarray(_peer_groups(table.node, labels))
    z = np.full(len(recent), -np.inf)
    medians = np.zeros(len(recent))
    for group in np.unique(groups):
        members = groups == group
        median, scale = robust_scale(recent[members], sig.floor_per_h)
        if np.isfinite(median):
            z[members] = (recent[members] - median) / scale
            medians[members] = median
    with np.errstate(invalid="ignore"):
        candidates = np.nonzero((recent >= sig.floor_per_h) & (z >= PEER_Z))[0]
    for i in candidates:
        bins = table.bins[i]
        # a bin is elevated at a quarter of the floor rate: background noise stays below it
        active = int(np.sum(bins >= sig.floor_per_h * bin_h / 4))
        slope_h = float(table.slope[i]) / bin_h
        base = float(baseline[i]) if np.isfinite(baseline[i]) else 0.0
        # rising: the robust trend over the window explains a fair part of the recent rate
        trend = slope_h * (window.bins - 1) >= recent[i] / 4
        rising = trend and recent[i] > 2 * max(base, sig.floor_per_h / 4)
        numbers = (
            f"{sig.what} {recent[i]:.1f}/h in the last {_span(window.bin_s)}, "
            f"{base:.1f}/h before; peers' median {medians[i]:.1f}/h, robust z {z[i]:.0f}"
        )
        if active < PERSISTENT_BINS:
            strength = 0.1
            detail = f"one-off burst: {numbers}; elevated in {active} of {window.bins} bins"
        elif rising:
            strength = min(0.95, 0.6 + 0.1 * np.log10(max(recent[i] / sig.floor_per_h, 1.0)))
            detail = f"rising: {numbers}; Theil-Sen slope +{slope_h:.1f}/h per bin"
        else:
            strength = 0.3
            detail = f"steady, high: {numbers}; not rising"
        out.append(
            (table.node[i], Finding(sig.signal, table.subject[i], strength, detail, recent[i]))
        )
    return out


def _remap_findings(fleet: FleetFeatures) -> list[tuple[str, Finding]]:
    latest: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    first: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for metric in REMAP_METRICS:
        table = fleet.table(metric)
        if table is None:
            continue
        interesting = np.nonzero(np.nan_to_num(table.last) > 0)[0]
        for i in interesting:
            key = (table.node[i], table.subject[i])
            latest[key][metric] = float(table.last[i])
            first[key][metric] = float(table.first[i])
    out: list[tuple[str, Finding]] = []
    for (node, subject), now in sorted(latest.items()):
        was = first[(node, subject)]
        total = now.get(REMAP_CORRECTABLE, 0.0) + now.get(REMAP_UNCORRECTABLE, 0.0)
        before = was.get(REMAP_CORRECTABLE, 0.0) + was.get(REMAP_UNCORRECTABLE, 0.0)
        growth = max(total - before, 0.0)
        parts = [f"{total:.0f} remapped rows of {REMAP_LIMIT} (+{growth:.0f} in the window)"]
        strength = 0.0
        if growth >= 1:
            strength = max(strength, min(0.85, 0.35 + 0.08 * growth))
        if total >= REMAP_LIMIT / 2:
            strength = max(strength, 0.7)
        if now.get(BANKS_LOW, 0) > 0:
            parts.append(f"{now[BANKS_LOW]:.0f} bank(s) with few spare rows left")
            strength = max(strength, 0.6)
        if now.get(BANKS_NONE, 0) > 0:
            parts.append(f"{now[BANKS_NONE]:.0f} bank(s) with no spare row left")
            strength = max(strength, 0.85)
        if now.get(REMAP_PENDING, 0) > 0:
            parts.append("a remap is pending (needs a GPU reset)")
            strength = max(strength, 0.5)
        if now.get(REMAP_FAILURE, 0) > 0:
            parts.append("a remap has failed")
            strength = max(strength, 0.95)
        if strength > 0:
            out.append((node, Finding("row_remap", subject, strength, "; ".join(parts), total)))
    return out


def _thermal(
    fleet: FleetFeatures, labels: Mapping[str, Mapping[str, str]]
) -> tuple[list[tuple[str, Finding]], list[GroupFinding]]:
    """GPUs warming against their rack; racks warming together (a facility finding).

    The rise is the last bin's mean temperature less the median of the earlier bins' means: a
    level shift (robust to a hot hour, and to the daily cycle when bins are days).
    """
    table = fleet.table(GPU_TEMP)
    if table is None:
        return [], []
    level = table.bins[:, -1]
    earlier = nanmedian_rows(table.bins[:, :-1])
    rise = level - earlier
    racks = np.asarray([labels.get(n, {}).get("rack", "") for n in table.node])
    node_names = np.asarray(table.node)
    out: list[tuple[str, Finding]] = []
    groups: list[GroupFinding] = []
    node_rise = _median_by(node_names, rise)
    fleet_median = float(np.median(list(node_rise.values()))) if node_rise else 0.0
    peer = np.asarray(_peer_groups(table.node, labels))
    level_z = np.zeros(len(level))
    for group in np.unique(peer):
        members = peer == group
        median, scale = robust_scale(level[members], 1.0)
        level_z[members] = (level[members] - median) / scale
    for rack in np.unique(racks):
        members = racks == rack
        rises = {n: node_rise[n] for n in set(node_names[members].tolist()) if n in node_rise}
        if not rises:
            continue
        rack_median = float(np.median(list(rises.values())))
        warm = [n for n, r in rises.items() if r - fleet_median >= RISE_C]
        if (
            rack
            and len(rises) >= GROUP_MIN_NODES
            and rack_median - fleet_median >= RISE_C
            and len(warm) >= GROUP_FRACTION * len(rises)
        ):
            groups.append(
                GroupFinding(
                    kind="cooling",
                    scope="rack",
                    group=str(rack),
                    signal="thermal_drift",
                    nodes=tuple(sorted(warm)),
                    detail=(
                        f"{len(warm)} of {len(rises)} nodes warming together: median rise "
                        f"{rack_median:+.1f} C in the last {_span(fleet.window.bin_s)} (fleet "
                        f"{fleet_median:+.1f} C): check the rack's cooling, not the nodes"
                    ),
                )
            )
        # against the GPUs of its own node (they run the same job: a load change moves them all)
        # and against its rack (a facility warming moves every node)
        idx = np.nonzero(members)[0]
        board = np.asarray([node_rise.get(str(n), np.nan) for n in node_names[members]])
        excess = rise[members] - np.maximum(board, max(rack_median, fleet_median))
        with np.errstate(invalid="ignore"):
            hot = np.nonzero(excess >= RISE_C)[0]
        for j in hot:
            i = idx[j]
            strength = min(0.9, 0.4 + 0.05 * float(excess[j]))
            detail = (
                f"GPU temperature up {rise[i]:+.1f} C on the window to {level[i]:.1f} C "
                f"(robust z {level_z[i]:.0f} against peers) while its node's GPUs rose "
                f"{board[j]:+.1f} C and its rack {rack_median:+.1f} C (median)"
            )
            out.append(
                (
                    table.node[i],
                    Finding("thermal_drift", table.subject[i], strength, detail, rise[i]),
                )
            )
    return out, groups


def _median_by(keys: Any, values: FloatArray) -> dict[str, float]:
    grouped: dict[str, list[float]] = defaultdict(list)
    for k, v in zip(list(keys), values.tolist(), strict=True):
        if np.isfinite(v):
            grouped[str(k)].append(v)
    return {k: float(np.median(v)) for k, v in grouped.items()}


def _clock_findings(
    fleet: FleetFeatures, labels: Mapping[str, Mapping[str, str]]
) -> list[tuple[str, Finding]]:
    table = fleet.table(SM_CLOCK)
    if table is None:
        return []
    level = table.bins[:, -1]
    peer = np.asarray(_peer_groups(table.node, labels))
    out: list[tuple[str, Finding]] = []
    for group in np.unique(peer):
        members = np.nonzero(peer == group)[0]
        median, scale = robust_scale(level[members], 10.0)
        for i in members:
            z = (level[i] - median) / scale
            if np.isfinite(z) and z <= -2 * PEER_Z and median - level[i] >= 50:
                detail = (
                    f"SM clock {level[i]:.0f} MHz against peers' median {median:.0f} MHz "
                    f"(robust z {z:.0f})"
                )
                out.append(
                    (table.node[i], Finding("clock_low", table.subject[i], 0.45, detail, level[i]))
                )
    return out


def _event_findings(events: Sequence[Event], window: Window) -> list[tuple[str, Finding]]:
    catalogue = xid_catalogue()
    recent = [e for e in events if window.start <= e.time <= window.at]
    app: dict[tuple[str, int | None], list[int]] = defaultdict(list)
    hardware: dict[tuple[str, int | None], list[int]] = defaultdict(list)
    remediations: dict[str, list[str]] = defaultdict(list)
    for e in recent:
        if e.event == "xid" and e.code is not None:
            if e.code in RECURRING_XIDS:
                app[(e.node, e.gpu)].append(e.code)
            elif catalogue.get(e.code).action.drains:
                hardware[(e.node, e.gpu)].append(e.code)
        elif e.event == "remediation" or (
            e.event == "drain" and not e.detail.startswith(PREDICTED_PREFIX)
        ):
            remediations[e.node].append(e.event)
    out: list[tuple[str, Finding]] = []
    for (node, gpu), codes in sorted(app.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1)):
        if len(codes) >= 3:
            subject = f"gpu{gpu}" if gpu is not None else "node"
            strength = min(0.9, 0.4 + 0.1 * (len(codes) - 3))
            detail = f"Xid {_codes(codes)} {len(codes)} times on the same GPU within the window"
            out.append((node, Finding("xid_recurrence", subject, strength, detail, len(codes))))
    for (node, gpu), codes in sorted(hardware.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1)):
        if len(codes) >= 2:
            subject = f"gpu{gpu}" if gpu is not None else "node"
            detail = f"hardware Xid {_codes(codes)} {len(codes)} times within the window"
            out.append((node, Finding("xid_recurrence", subject, 0.7, detail, len(codes))))
    for node, kinds in sorted(remediations.items()):
        if len(kinds) >= 2:
            detail = f"{len(kinds)} remediations or health drains within the window"
            out.append((node, Finding("remediation_recurrence", "node", 0.6, detail, len(kinds))))
    return out


def _codes(codes: Sequence[int]) -> str:
    return "/".join(str(c) for c in sorted(set(codes)))


def _span(seconds: float) -> str:
    if seconds % DAY_S == 0:
        days = int(seconds // DAY_S)
        return "day" if days == 1 else f"{days} days"
    if seconds % HOUR_S == 0:
        hours = int(seconds // HOUR_S)
        return "hour" if hours == 1 else f"{hours} h"
    return f"{seconds / 60:.0f} min"


#: Drains of predicted nodes carry this check name prefix (``gpuforge:predicted.<signal>:...``).
PREDICTED_PREFIX = "gpuforge:predicted."


def _fold_groups(
    found: list[tuple[str, Finding]],
    labels: Mapping[str, Mapping[str, str]],
    all_nodes: Sequence[str],
) -> tuple[list[tuple[str, Finding]], list[GroupFinding]]:
    """Findings of a scoped signal that most of one group shares become one group finding."""
    scoped = {c.signal: c.scope for c in COUNTERS.values() if c.scope}
    members: dict[tuple[str, str], set[str]] = defaultdict(set)
    for node in all_nodes:
        for scope in set(scoped.values()):
            group = labels.get(node, {}).get(scope)
            if group:
                members[(scope, group)].add(node)
    hit: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for node, f in found:
        where = scoped.get(f.signal)
        name = labels.get(node, {}).get(where) if where else None
        if where and name and f.strength >= 0.3:
            hit[(f.signal, where, name)].add(node)
    folded: set[tuple[str, str]] = set()
    groups: list[GroupFinding] = []
    for (signal, scope, group), nodes in sorted(hit.items()):
        size = len(members[(scope, group)])
        if len(nodes) >= GROUP_MIN_NODES and len(nodes) >= GROUP_FRACTION * size:
            groups.append(
                GroupFinding(
                    kind="fabric",
                    scope=scope,
                    group=group,
                    signal=signal,
                    nodes=tuple(sorted(nodes)),
                    detail=f"{len(nodes)} of {size} nodes of {scope} {group} show {signal} at "
                    f"once: check the {scope} switch and its cabling, not the nodes",
                )
            )
            folded.update((n, signal) for n in nodes)
    kept = [(n, f) for n, f in found if (n, f.signal) not in folded]
    return kept, groups


def score(
    fleet: FleetFeatures,
    events: Sequence[Event],
    labels: Mapping[str, Mapping[str, str]],
    *,
    horizon_s: float = 7 * DAY_S,
    nodes: Iterable[str] = (),
    min_coverage: float = 0.5,
    source: str = "",
    skipped_lines: int = 0,
) -> RiskReport:
    """Score every node (those with features, events or labels, and ``nodes``)."""
    window = fleet.window
    found: list[tuple[str, Finding]] = []
    for metric, sig in COUNTERS.items():
        table = fleet.table(metric)
        if table is not None:
            found += _counter_findings(table, sig, window, labels)
    found += _remap_findings(fleet)
    thermal, groups = _thermal(fleet, labels)
    found += thermal
    found += _clock_findings(fleet, labels)
    found += _event_findings(events, window)
    all_nodes = sorted(set(fleet.coverage) | {e.node for e in events} | set(labels) | set(nodes))
    found, fabric = _fold_groups(found, labels, all_nodes)
    groups += fabric
    by_node: dict[str, list[Finding]] = defaultdict(list)
    for node, f in found:
        by_node[node].append(f)
    risks: list[NodeRisk] = []
    for node in all_nodes:
        coverage = fleet.coverage.get(node, 0.0)
        findings = sorted(by_node.get(node, []), key=lambda f: (-f.strength, f.signal, f.subject))
        strongest: dict[str, float] = {}
        for f in findings:
            strongest[f.signal] = max(strongest.get(f.signal, 0.0), f.strength)
        value = _noisy_or(strongest.values())
        if coverage < min_coverage:
            note = (
                "no samples in the window"
                if node not in fleet.coverage
                else f"samples span {coverage:.0%} of the window (need {min_coverage:.0%})"
            )
            risks.append(NodeRisk(node, value, tuple(findings), "insufficient_data", note))
        else:
            risks.append(NodeRisk(node, value, tuple(findings)))
    risks.sort(key=lambda r: (r.status != "scored", -r.score, r.node))
    return RiskReport(
        at=window.at,
        window_s=window.length,
        horizon_s=horizon_s,
        nodes=tuple(risks),
        groups=tuple(groups),
        skipped_lines=skipped_lines,
        source=source,
    )


def score_history(
    history: History,
    window: Window,
    *,
    horizon_s: float = 7 * DAY_S,
    min_coverage: float = 0.5,
) -> RiskReport:
    """Score a :class:`History` read from a file, the store or Prometheus."""
    fleet = FleetFeatures.from_history(history, window)
    return score(
        fleet,
        history.events,
        history.labels,
        horizon_s=horizon_s,
        min_coverage=min_coverage,
        source=history.source,
        skipped_lines=len(history.skipped),
    )
