"""Fleet risk: score every node from its series features, its peers and its events.

Signals (names are stable: they appear in reasons, drains and the scorecard):

* ``ecc_sbe_rate``, ``pcie_replay``, ``nvlink_crc``, ``ib_symbol_errors``: a counter's growth,
  never its level: the last bin's rate against the node's own earlier rate and against its peers'
  (same ``node_type`` and same GPU or port position; robust z on log rates with a minimum effect
  size), rising only when it grew beyond Poisson noise in several bins; a steady high rate or a
  one-off burst is reported weak. A counter that stopped growing has no finding;
* ``ib_link_downed``: a port whose link went down repeatedly within the window;
* ``row_remap``: remapped rows against NVIDIA's limits (512 per GPU; banks whose spare rows are
  low or gone, DCGM's bank histogram), their growth within the window, a pending remap;
* ``thermal_drift``: one GPU warming against its node's other GPUs at the same samples (same
  job, same load), persistently and more than its peers; a rack warming together is a facility
  finding (``cooling``), not its nodes;
* ``clock_low``: a GPU whose SM clock under load falls further behind its node's GPUs;
* ``xid_recurrence``: Xid 13/31/43 (application-class) recurring on the same GPU, or a
  hardware Xid seen again; ``remediation_recurrence``: more than one remediation or health drain
  of the node within the window (NVSentinel's rule of thumb).

A leaf where most nodes see the same fabric errors is a ``fabric`` finding. A node's evidence is
the noisy-or of its strongest finding per signal; its score is that evidence calibrated
(:func:`calibrated`) as the probability of a failure within the horizon.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuforge.predict.signals import (
    CLOCK_DEFICIT,
    DAY_S,
    GPU_TEMP,
    GPU_UTIL,
    HOUR_S,
    JOINT,
    SM_CLOCK,
    TEMP_EXCESS,
    TEMP_LOADED,
    Features,
    Pending,
    Window,
    counter_features,
    gauge_features,
    joint_gauges,
    level_features,
    nanmedian_rows,
    robust_scale,
    theil_sen,
)
from gpuforge.predict.telemetry import Event, FloatArray, Telemetry, format_time
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
#: The exported gauge read only as the load of the joint gauges (signals.joint_gauges).
LOAD = GPU_UTIL
#: Every metric the scorer reads; others in the telemetry are ignored.
METRICS = (*COUNTERS, *REMAP_METRICS, *GAUGES)
#: NVIDIA: row remapping supports up to 512 remappings per GPU frame buffer (docs/predictive.md).
REMAP_LIMIT = 512
#: Xids NVIDIA sends to the application first; recurring on one GPU they point at the GPU.
RECURRING_XIDS = frozenset({13, 31, 43})
#: Bins (of the last RECENT_BINS) in which a rate or deviation must have grown: persistence.
PERSISTENT_BINS = 2
#: The recent part of the window; the bins before it are the node's own earlier baseline.
RECENT_BINS = 3
#: Minimum effect size: a rate must be this many times its peers' and its own earlier rate.
MIN_EFFECT = 3.0
#: Floor of the peers' spread of log10 rates (a fleet of equal rates: x1.4 is still noise).
LOG_NOISE = 0.15
#: One bin holding this share of a series' increments in the window is a one-off burst.
BURST_SHARE = 0.6
#: Peer groups smaller than this fall back from "same position" to "same node type".
MIN_PEERS = 8
#: Probabilities of a failure within the horizon given one finding (calibrated on the first
#: generator's fleets, reported on the held-out generator's: docs/predictive.md).
P_BURST = 0.02
P_STEADY = 0.03
P_RISING = 0.45
P_MAX = 0.9
#: A GPU whose SM clock under load fell this far (MHz) further behind its node's GPUs.
CLOCK_DROP_MHZ = 40.0
#: Robust z above which a rate or level stands out from its peers.
PEER_Z = 3.0
#: A GPU whose temperature rose this much more than its rack's (degrees C) drifts; a rack whose
#: median rose this much more than the fleet's warms as a whole.
RISE_C = 2.0
#: A rack whose nodes' median temperature at load rose this much more than the fleet's (and
#: stands out from the racks' spread, floored at RACK_NOISE_C) warms as a whole.
RACK_RISE_C = 1.0
RACK_NOISE_C = 0.3
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

    @property
    def evidence(self) -> dict[str, float]:
        """Per signal, its strongest finding's strength (evidence before calibration)."""
        out: dict[str, float] = {}
        for f in self.findings:
            out[f.signal] = round(max(out.get(f.signal, 0.0), float(f.strength)), 3)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "node": self.node,
            "status": self.status,
            "score": round(float(self.score), 4),
            "signal": self.top_signal,
            "evidence": self.evidence,
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
        self._node: str | None = None
        self._pending: dict[str, list[tuple[list[str], FloatArray, FloatArray]]] = defaultdict(list)

    def add(
        self, node: str, metric: str, subjects: Sequence[str], t: FloatArray, x: FloatArray
    ) -> None:
        """Add ``x`` (one row per subject) of ``metric`` on ``node``, sampled at ``t``.

        A node's gauges (temperature, clock, utilisation) are also kept until the next node
        comes (or the fleet is scored), then compared GPU by GPU with the node's other GPUs at
        the same samples (:func:`joint_gauges`): one node's samples at most stay in memory.
        """
        if metric in JOINT:
            if self._node is not None and node != self._node:
                self._flush()
            self._node = node
            self._pending[metric].append((list(subjects), t, x))
        if metric not in METRICS:
            return
        if metric in REMAP_METRICS or metric in GAUGES:
            # gauges are scored from their joint features (below); alone they give coverage
            feats = level_features(t, x, self.window)
        else:
            feats = counter_features(t, x, self.window)
        self._add_feats(node, metric, subjects, feats)

    def _add_feats(self, node: str, metric: str, subjects: Sequence[str], feats: Features) -> None:
        block = self._blocks[metric]
        block.nodes.extend([node] * len(subjects))
        block.subjects.extend(subjects)
        block.feats.append(feats)
        if metric.startswith("_"):
            return
        self.coverage[node] = max(self.coverage.get(node, 0.0), feats.coverage)
        if feats.samples:
            self.last_time[node] = max(self.last_time.get(node, -np.inf), feats.last_time)

    def _flush(self) -> None:
        """The pending node's joint gauge features (GPU against its node's other GPUs)."""
        node, pending = self._node, self._pending
        self._node, self._pending = None, defaultdict(list)
        if node is None:
            return
        start, end = self.window.start, self.window.at
        inside: Pending = defaultdict(list)
        for metric, blocks in pending.items():  # only the window's samples matter
            for subjects, t, x in blocks:
                lo, hi = np.searchsorted(t, start, side="left"), np.searchsorted(t, end, "right")
                inside[metric].append((subjects, t[lo:hi], x[:, lo:hi]))
        for metric, (subjects, t, x) in joint_gauges(inside).items():
            feats = gauge_features(t, x, self.window, nan_aware=True, slope=False)
            self._add_feats(node, metric, subjects, feats)

    def table(self, metric: str) -> _Table | None:
        """The flat feature arrays of ``metric``, or None when no series had it."""
        self._flush()
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
    def from_telemetry(cls, telemetry: Telemetry, window: Window) -> FleetFeatures:
        """Features of every series of ``telemetry`` the scorer reads."""
        fleet = cls(window)
        keys = sorted(
            (k for k in telemetry.series if k.metric in METRICS or k.metric in JOINT),
            key=lambda k: (k.node, k.metric, k.gpu if k.gpu is not None else -1, k.port or ""),
        )
        for key in keys:
            t, v = telemetry.series[key]
            fleet.add(key.node, key.metric, [key.subject], t, v[None, :])
        fleet._flush()
        return fleet


#: The calibration of the combined evidence: logit(score) = A + B x logit(evidence), fitted
#: on the tuning generator's fleets (2,000 nodes x 30 days, reliability per bin: evidence 0.54
#: -> 71% failed within 7 days, 0.71 -> 93%, 0.93 -> 100%) and reported on the held-out
#: generator's (docs/predictive.md). The map is monotonic: it changes no ranking.
CALIBRATION_A = 0.5
CALIBRATION_B = 2.0
#: The highest score: no telemetry makes a failure certain.
SCORE_MAX = 0.99


def calibrated(evidence: float) -> float:
    """The probability of a failure within the horizon for the combined ``evidence``."""
    if evidence <= 0:
        return 0.0
    e = min(max(evidence, 1e-6), 1 - 1e-6)
    logit = CALIBRATION_A + CALIBRATION_B * float(np.log(e / (1 - e)))
    return float(min(SCORE_MAX, 1.0 / (1.0 + np.exp(-logit))))


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
    out: list[tuple[str, Finding]] = []
    if sig.signal == "ib_link_downed":
        total = np.nansum(table.bins, axis=1)
        for i in np.nonzero(total >= 2)[0]:
            n = int(total[i])
            strength = min(0.9, 0.45 + 0.1 * (n - 2))
            detail = f"link went down {n} times within the window"
            out.append((table.node[i], Finding(sig.signal, table.subject[i], strength, detail, n)))
        return out
    return out + _growth_findings(table, sig, window, labels)


def _growth_findings(
    table: _Table, sig: CounterSignal, window: Window, labels: Mapping[str, Mapping[str, str]]
) -> list[tuple[str, Finding]]:
    """A counter scored on its growth: recent rate against its own earlier rate and its peers'.

    The raw count is never read: only increments per bin. Per series, ``recent`` is the last
    bin's rate and ``earlier`` the median rate of the bins before the last :data:`RECENT_BINS`
    (the node's own baseline). A finding needs (noise model, every test at once):

    * the recent rate at least the signal's floor and a robust z of :data:`PEER_Z` above the
      peers' recent rates (same ``node_type`` and same GPU or port position) on a log scale,
      and at least :data:`MIN_EFFECT` times their median (a minimum effect size);
    * for *rising*: the recent count beyond Poisson noise of the earlier rate (z >= 4), the
      rate at least :data:`MIN_EFFECT` times the earlier one and more than the peers' median
      change, growth in at least :data:`PERSISTENT_BINS` of the last :data:`RECENT_BINS` bins
      (a one-off burst is one bin) and the last bin not far below the peak (still growing).

    A counter that stopped growing has no recent rate and no finding, however large it is; a
    steady high rate (the top of a healthy spread) is reported weak, never near a drain.
    """
    bin_h = window.bin_s / HOUR_S
    bins = table.bins
    nb = bins.shape[1]
    out: list[tuple[str, Finding]] = []
    if nb < RECENT_BINS + 2:
        return out
    floor = sig.floor_per_h
    recent = bins[:, -1] / bin_h
    early = nanmedian_rows(bins[:, : nb - RECENT_BINS]) / bin_h
    early = np.where(np.isfinite(early), early, 0.0)
    pad = floor / 10  # a rate this small is no rate: keeps ratios of near-zeros finite
    ratio = (recent + pad) / (early + pad)
    log_rate = np.log10(recent + pad)
    groups = np.asarray(_position_groups(table.node, table.subject, labels))
    z = np.full(len(recent), -np.inf)
    peer_median = np.zeros(len(recent))
    peer_ratio = np.ones(len(recent))
    for group in np.unique(groups):
        members = groups == group
        median, scale = robust_scale(log_rate[members], LOG_NOISE)
        if np.isfinite(median):
            z[members] = (log_rate[members] - median) / scale
            peer_median[members] = 10**median - pad
            peer_ratio[members] = float(np.median(ratio[members]))
    with np.errstate(invalid="ignore"):
        candidates = np.nonzero(
            (recent >= floor) & (z >= PEER_Z) & (recent >= MIN_EFFECT * (peer_median + pad))
        )[0]
    for i in candidates:
        row = bins[i]
        tail = row[-RECENT_BINS:] / bin_h
        # a step counts as growth beyond Poisson noise of the bin before it
        before = row[-RECENT_BINS - 1 : -1]
        steps = np.diff(row[-RECENT_BINS - 1 :])
        growing = int(np.sum(steps > 2.0 * np.sqrt(np.nan_to_num(before) + 1.0)))
        lam = early[i] * bin_h
        poisson_z = (row[-1] - lam) / np.sqrt(lam + 1.0)
        total = float(np.nansum(row))
        burst = (
            total > 0 and float(np.nanmax(row)) >= BURST_SHARE * total and growing < PERSISTENT_BINS
        )
        rising = (
            not burst
            and poisson_z >= 4
            and ratio[i] >= MIN_EFFECT
            and ratio[i] >= MIN_EFFECT * peer_ratio[i]
            and growing >= PERSISTENT_BINS
            and tail[-1] >= 0.5 * float(np.nanmax(tail))
        )
        slope_h = float(table.slope[i]) / bin_h
        numbers = (
            f"{sig.what} {recent[i]:.1f}/h in the last {_span(window.bin_s)}, "
            f"{early[i]:.2f}/h before (x{ratio[i]:.0f}); peers' {recent_peer(peer_median[i])} "
            f"(robust z {z[i]:.1f} on a log scale)"
        )
        if burst:
            strength = P_BURST
            share = float(np.nanmax(row)) / total
            detail = f"one-off burst: {numbers}; {share:.0%} of the window's errors in one bin"
        elif rising:
            # evidence grows with the acceleration (doublings beyond the minimum effect) and
            # with the number of bins it has kept growing
            doublings = float(np.log2(ratio[i] / MIN_EFFECT))
            strength = min(P_MAX, P_RISING + 0.04 * doublings + 0.05 * (growing - 1))
            detail = (
                f"rising: {numbers}; grew in {growing} of the last {RECENT_BINS} "
                f"{_span(window.bin_s)}s, Theil-Sen slope {slope_h:+.2f}/h per bin"
            )
        else:
            strength = P_STEADY
            detail = f"steady, high: {numbers}; not rising (the normal spread of a healthy fleet)"
        out.append(
            (table.node[i], Finding(sig.signal, table.subject[i], strength, detail, recent[i]))
        )
    return out


def _elevated(table: _Table, sig: CounterSignal, window: Window) -> set[str]:
    """Nodes with a series of ``sig`` at or above its floor rate in the last bin."""
    if sig.signal == "ib_link_downed":
        total = np.nansum(table.bins, axis=1)
        return {table.node[i] for i in np.nonzero(total >= 2)[0]}
    recent = table.bins[:, -1] / (window.bin_s / HOUR_S)
    with np.errstate(invalid="ignore"):
        return {table.node[i] for i in np.nonzero(recent >= max(sig.floor_per_h, 1e-9))[0]}


def recent_peer(rate: float) -> str:
    """The peers' median recent rate, as a phrase."""
    return f"median {max(rate, 0.0):.2f}/h"


def _position_groups(
    nodes: Sequence[str], subjects: Sequence[str], labels: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """Peers: the same node type and the same GPU index or port (one position per group)."""
    kinds = [labels.get(n, {}).get("node_type", "") for n in nodes]
    groups = [f"{k}|{s}" for k, s in zip(kinds, subjects, strict=True)]
    sizes: dict[str, int] = defaultdict(int)
    for g in groups:
        sizes[g] += 1
    return [g if sizes[g] >= MIN_PEERS else k for g, k in zip(groups, kinds, strict=True)]


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


def _rise(table: _Table) -> tuple[FloatArray, FloatArray]:
    """Per row: the last bin less the median of the bins before the recent ones; the trend."""
    nb = table.bins.shape[1]
    early = nanmedian_rows(table.bins[:, : max(nb - RECENT_BINS, 1)])
    return table.bins[:, -1] - early, early


def _persistent(table: _Table, early: FloatArray, step: float, sign: float) -> FloatArray:
    """How many of the last RECENT_BINS bins are ``step`` beyond ``early`` (in ``sign``)."""
    tail = table.bins[:, -RECENT_BINS:]
    with np.errstate(invalid="ignore"):
        beyond = sign * (tail - early[:, None]) >= step
    counted: FloatArray = np.sum(beyond, axis=1).astype(np.float64)
    return counted


def _peer_z(
    table: _Table, values: FloatArray, labels: Mapping[str, Mapping[str, str]], floor: float
) -> FloatArray:
    """Robust z of ``values`` against the same type and position (the type when too few)."""
    groups = np.asarray(_position_groups(table.node, table.subject, labels))
    z = np.zeros(len(values))
    for group in np.unique(groups):
        members = groups == group
        median, scale = robust_scale(values[members], floor)
        z[members] = (values[members] - (median if np.isfinite(median) else 0.0)) / scale
    return z


def _thermal(
    fleet: FleetFeatures, labels: Mapping[str, Mapping[str, str]]
) -> tuple[list[tuple[str, Finding]], list[GroupFinding]]:
    """GPUs warming against their node's GPUs at the same load; racks warming together.

    A GPU's excess (its temperature less its node's median GPU at each sample: same job, same
    load) must have risen by :data:`RISE_C` against its own earlier excess, stand out from its
    peers' rises, and have risen in :data:`PERSISTENT_BINS` of the last bins. A rack: its nodes'
    median temperature at load rose by ``RISE_C`` more than the fleet's (a facility finding).
    """
    out: list[tuple[str, Finding]] = []
    excess = fleet.table(TEMP_EXCESS)
    if excess is not None:
        rise, early = _rise(excess)
        z = _peer_z(excess, rise, labels, 0.5)
        held = _persistent(excess, early, RISE_C, 1.0)
        slope = theil_sen(excess.bins)
        with np.errstate(invalid="ignore"):
            hot = np.nonzero(
                (rise >= RISE_C) & (z >= PEER_Z) & (held >= PERSISTENT_BINS) & (slope > 0)
            )[0]
        for i in hot:
            strength = min(0.85, 0.35 + 0.05 * float(rise[i]))
            detail = (
                f"GPU temperature at equal load up {rise[i]:+.1f} C against its node's GPUs "
                f"(now {excess.bins[i, -1]:+.1f} C, before {early[i]:+.1f} C; robust z "
                f"{z[i]:.0f} against peers; held {int(held[i])} of the last {RECENT_BINS} bins)"
            )
            out.append(
                (
                    excess.node[i],
                    Finding("thermal_drift", excess.subject[i], strength, detail, rise[i]),
                )
            )
    return out, _cooling(fleet, labels)


def _cooling(fleet: FleetFeatures, labels: Mapping[str, Mapping[str, str]]) -> list[GroupFinding]:
    table = fleet.table(TEMP_LOADED)
    if table is None:
        return []
    rise, _ = _rise(table)
    node_rise = _median_by(np.asarray(table.node), rise)
    fleet_median = float(np.median(list(node_rise.values()))) if node_rise else 0.0
    racks: dict[str, dict[str, float]] = defaultdict(dict)
    for node, r in node_rise.items():
        rack = labels.get(node, {}).get("rack", "")
        if rack:
            racks[rack][node] = r
    medians = {r: float(np.median(list(v.values()))) for r, v in racks.items()}
    # the noise model: the spread of the racks' median rises (a rack median is quiet)
    centre, scale = robust_scale(np.asarray(list(medians.values()) or [0.0]), RACK_NOISE_C)
    groups: list[GroupFinding] = []
    for rack, rises in sorted(racks.items()):
        rack_median = medians[rack]
        warm = [n for n, r in rises.items() if r - fleet_median >= RACK_RISE_C]
        if (
            len(rises) >= GROUP_MIN_NODES
            and rack_median - fleet_median >= RACK_RISE_C
            and (rack_median - centre) / scale >= PEER_Z
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
                        f"{rack_median:+.1f} C at load in the last {_span(fleet.window.bin_s)} "
                        f"(fleet {fleet_median:+.1f} C): check the rack's cooling, not the nodes"
                    ),
                )
            )
    return groups


def _median_by(keys: Any, values: FloatArray) -> dict[str, float]:
    grouped: dict[str, list[float]] = defaultdict(list)
    for k, v in zip(list(keys), values.tolist(), strict=True):
        if np.isfinite(v):
            grouped[str(k)].append(v)
    return {k: float(np.median(v)) for k, v in grouped.items()}


def _clock_findings(
    fleet: FleetFeatures, labels: Mapping[str, Mapping[str, str]]
) -> list[tuple[str, Finding]]:
    """A GPU whose SM clock under load falls further behind its node's GPUs, bin after bin.

    The deficit (its clock less its node's median GPU at loaded samples: same job, same load,
    so an idle node or a lighter job moves every GPU) against its own earlier deficit, needs
    :data:`CLOCK_DROP_MHZ` of drop, a robust z of -:data:`PEER_Z` against its peers' drops and
    to have held in :data:`PERSISTENT_BINS` of the last bins, and a falling trend.
    """
    table = fleet.table(CLOCK_DEFICIT)
    if table is None:
        return []
    rise, early = _rise(table)
    z = _peer_z(table, rise, labels, 10.0)
    held = _persistent(table, early, CLOCK_DROP_MHZ / 2, -1.0)
    slope = theil_sen(table.bins)
    out: list[tuple[str, Finding]] = []
    with np.errstate(invalid="ignore"):
        slow = np.nonzero(
            (rise <= -CLOCK_DROP_MHZ) & (z <= -PEER_Z) & (held >= PERSISTENT_BINS) & (slope < 0)
        )[0]
    for i in slow:
        drop = -float(rise[i])
        strength = min(0.8, 0.4 + 0.1 * min(drop / 100.0, 4.0))
        detail = (
            f"SM clock under load {table.bins[i, -1]:+.0f} MHz against its node's GPUs (before "
            f"{early[i]:+.0f} MHz): {drop:.0f} MHz further behind, {float(slope[i]):+.0f} MHz "
            f"per {_span(fleet.window.bin_s)}; robust z {z[i]:.0f} against peers"
        )
        out.append((table.node[i], Finding("clock_low", table.subject[i], strength, detail, drop)))
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
    elevated: Mapping[str, set[str]],
) -> tuple[list[tuple[str, Finding]], list[GroupFinding]]:
    """Findings of a scoped signal that most of one group shares become one group finding.

    ``elevated``: per scoped signal, the nodes whose rate is at least the signal's floor (the
    peer test cannot see a leaf-wide fault when that leaf is half of the peers).
    """
    scoped = {c.signal: c.scope for c in COUNTERS.values() if c.scope}
    members: dict[tuple[str, str], set[str]] = defaultdict(set)
    for node in all_nodes:
        for scope in set(scoped.values()):
            group = labels.get(node, {}).get(scope)
            if group:
                members[(scope, group)].add(node)
    hit: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    seen = [(n, f.signal) for n, f in found if f.strength >= 0.3]
    seen += [(n, signal) for signal, nodes in elevated.items() for n in nodes]
    for node, signal in seen:
        where = scoped.get(signal)
        name = labels.get(node, {}).get(where) if where else None
        if where and name:
            hit[(signal, where, name)].add(node)
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
    elevated: dict[str, set[str]] = {}
    for metric, sig in COUNTERS.items():
        table = fleet.table(metric)
        if table is not None:
            found += _counter_findings(table, sig, window, labels)
            if sig.scope:
                elevated[sig.signal] = _elevated(table, sig, window)
    found += _remap_findings(fleet)
    thermal, groups = _thermal(fleet, labels)
    found += thermal
    found += _clock_findings(fleet, labels)
    found += _event_findings(events, window)
    all_nodes = sorted(set(fleet.coverage) | {e.node for e in events} | set(labels) | set(nodes))
    found, fabric = _fold_groups(found, labels, all_nodes, elevated)
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
        value = calibrated(_noisy_or(strongest.values()))
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


def score_telemetry(
    telemetry: Telemetry,
    window: Window,
    *,
    horizon_s: float = 7 * DAY_S,
    min_coverage: float = 0.5,
) -> RiskReport:
    """Score a :class:`Telemetry` read from a file, the history store or Prometheus."""
    fleet = FleetFeatures.from_telemetry(telemetry, window)
    return score(
        fleet,
        telemetry.events,
        telemetry.labels,
        horizon_s=horizon_s,
        min_coverage=min_coverage,
        source=telemetry.source,
        skipped_lines=len(telemetry.skipped),
    )
