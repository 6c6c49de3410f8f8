"""The fleet at a glance: one self-contained HTML page with a rack/leaf heat map.

:func:`render_heatmap` fills ``gpuforge/reporting/templates/fleet.html.j2`` (the reports' one
layout, :mod:`gpuforge.reporting`): a summary first, then rack power against the spec's budget,
then one small square per node grouped by SU and rack, and one per leaf coloured by its share of
unhealthy nodes. The page carries its data as one JSON object and draws the squares with a few
lines of inline JavaScript (``fleet_heatmap.js``), so 12,500 nodes stay a page of a few hundred
kilobytes, never a 12,500-row table. Nothing is loaded from the network. (The conformance report
has its own, coarser map: one cell per rack that is not all healthy.)

:func:`render_fleet` fills it from ``gpuforge fleet status``'s :class:`FleetStatus`;
:func:`rack_power_from_prometheus` reads ``gpuforge:rack_power_watts`` and
``gpuforge:rack_power_budget_watts`` (the recording rules of :mod:`gpuforge.monitoring.rules`)
through :class:`gpuforge.promclient.Prometheus`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from markupsafe import Markup

from gpuforge.atomic import write_atomic
from gpuforge.health.fleet import NO_RECORD, Fleet, FleetStatus
from gpuforge.promclient import Prometheus
from gpuforge.reporting import render_page

#: Cell states, in legend order, with their colours (colour-blind-safe where it matters:
#: fail and pass differ in lightness as well as hue).
STATES: Mapping[str, str] = {
    "pass": "#3aa655",
    "warn": "#e8b730",
    "fail": "#c0392b",
    "error": "#8e44ad",
    "drained": "#5b2c2c",
    "stale": "#7f8c8d",
    NO_RECORD: "#d5d8dc",
}
#: Legend text where the state's name alone would mislead (a drained node's verdict is fail).
_LEGEND = {"drained": "drained by gpuforge", NO_RECORD: "no record"}
#: A rack at or above this share of its budget is listed among the hottest racks.
POWER_WARN_RATIO = 0.9
#: Racks listed by name in the power section (the rest are in the heat map's colours).
POWER_TOP = 20
#: Seconds to wait for Prometheus.
PROMETHEUS_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Cell:
    """One node in the heat map."""

    node: str
    rack: str
    su: str
    leaf: str
    state: str  # a key of STATES
    detail: str = ""  # shown on hover: failing checks, action, drain reason


@dataclass(frozen=True)
class RackPower:
    """A rack's measured power and its budget, watts (``watts`` None: not measured)."""

    rack: str
    watts: float | None
    budget_w: float

    @property
    def ratio(self) -> float | None:
        """Measured power as a share of the budget."""
        if self.watts is None or self.budget_w <= 0:
            return None
        return self.watts / self.budget_w


def power_summary(power: Sequence[RackPower]) -> dict[str, Any]:
    """The power section's figures: racks measured, totals, over and near budget, the top."""
    measured = [p for p in power if p.ratio is not None]
    out: dict[str, Any] = {"racks": len(power), "measured": len(measured)}
    if not measured:
        return out
    total_w = sum(p.watts or 0 for p in measured)
    total_b = sum(p.budget_w for p in measured)
    out["head"] = (
        f"{total_w / 1000:.1f} kW of {total_b / 1000:.1f} kW budget ({total_w / total_b:.0%})"
    )
    out["over"] = sum(1 for p in measured if (p.ratio or 0) > 1)
    out["near"] = sum(1 for p in measured if POWER_WARN_RATIO <= (p.ratio or 0) <= 1)
    out["warn"] = f"{POWER_WARN_RATIO:.0%}"
    top = []
    for p in sorted(measured, key=lambda p: -(p.ratio or 0))[:POWER_TOP]:
        ratio = p.ratio or 0
        top.append(
            {
                "rack": p.rack,
                "kw": f"{(p.watts or 0) / 1000:.1f} / {p.budget_w / 1000:.1f} kW",
                "pct": f"{ratio:.0%}",
                "cls": "over" if ratio > 1 else "near" if ratio >= POWER_WARN_RATIO else "",
                "width": f"{min(ratio, 1.5) * 200:.0f}",
            }
        )
    out["top"] = top
    return out


def render_heatmap(
    title: str,
    cells: Sequence[Cell],
    *,
    subtitle: str = "",
    summary: Sequence[tuple[str, str]] = (),
    power: Sequence[RackPower] = (),
) -> str:
    """A self-contained HTML page: summary, rack power vs budget, node and leaf heat maps."""
    states = list(STATES)
    index = {s: i for i, s in enumerate(states)}
    hot = {p.rack for p in power if (p.ratio or 0) > 1}
    power_text = {
        p.rack: f"{(p.watts or 0) / 1000:.1f}/{p.budget_w / 1000:.1f} kW"
        for p in power
        if p.watts is not None
    }
    sus: dict[str, dict[str, list[list[Any]]]] = {}
    leaves: dict[str, list[int]] = {}
    for c in cells:
        if c.state not in index:
            raise ValueError(f"unknown cell state {c.state!r} (one of {', '.join(states)})")
        entry: list[Any] = [c.node, index[c.state]]
        if c.detail:
            entry.append(c.detail)
        sus.setdefault(c.su, {}).setdefault(c.rack, []).append(entry)
        if c.leaf:
            leaf_counts = leaves.setdefault(c.leaf, [0, 0])
            leaf_counts[0] += 1
            leaf_counts[1] += int(c.state != "pass")
    data = {
        "states": states,
        "colors": dict(STATES),
        "sus": [
            {
                "name": su,
                "nodes": sum(len(v) for v in racks.values()),
                "racks": [
                    {"name": r, "hot": r in hot, "power": power_text.get(r, ""), "cells": v}
                    for r, v in racks.items()
                ],
            }
            for su, racks in sus.items()
        ],
        "leaves": [[leaf, n, bad] for leaf, (n, bad) in sorted(leaves.items())],
    }
    by_state = Counter(c.state for c in cells)
    legend = [
        {"color": color, "text": _LEGEND.get(st, st), "count": by_state[st]}
        for st, color in STATES.items()
    ]
    # JSON inside <script>: "</" must not close the element early (and it is not HTML-escaped:
    # a script's text is not HTML).
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return render_page(
        "fleet.html.j2",
        title=title,
        subtitle=subtitle,
        summary=summary,
        power=power_summary(power),
        legend=legend,
        blob=Markup(blob),  # noqa: S704 - JSON with "</" escaped, inside a JSON script element
    )


def _cell_state(verdict: str, stale: bool, drained_by: str) -> str:
    if drained_by == "gpuforge":
        return "drained"
    if verdict == NO_RECORD:
        return NO_RECORD
    if stale:
        return "stale"
    return verdict


def fleet_cells(status: FleetStatus, fleet: Fleet) -> list[Cell]:
    """One cell per GPU node of ``status``, placed by the inventory's rack, SU and leaf."""
    out = []
    for n in status.nodes:
        place = fleet.placement.get(n.node, {})
        detail = " ".join(x for x in (n.checks, n.action, n.reason) if x)
        out.append(
            Cell(
                node=n.node,
                rack=str(place.get("rack") or "?"),
                su=f"SU {place.get('su')}" if place.get("su") else "SU ?",
                leaf=fleet.leaves.get(n.node, ""),
                state=_cell_state(n.verdict, n.stale, n.drained_by),
                detail=detail,
            )
        )
    return out


def render_fleet(status: FleetStatus, fleet: Fleet, power: Sequence[RackPower] = ()) -> str:
    """``gpuforge fleet status --html``: the fleet status as a heat map page."""
    verdicts = status.by_verdict()
    summary = [("GPU nodes", str(len(status.nodes)))]
    summary += [(f"verdict {v}", str(len(nodes))) for v, nodes in verdicts.items()]
    for action, nodes in sorted(status.by_action().items()):
        summary.append((f"action {action}", str(len(nodes))))
    if status.slurm_read:
        drained = status.drained()
        summary.append(("drained by gpuforge", str(len(drained["gpuforge"]))))
        summary.append(("drained by operators", str(len(drained["operator"]))))
    summary.append(("stale", str(len(status.stale))))
    over = [p.rack for p in power if (p.ratio or 0) > 1]
    if power:
        summary.append(("racks over power budget", str(len(over))))
    return render_heatmap(
        f"{status.cluster}: fleet status",
        fleet_cells(status, fleet),
        subtitle=f"health interval {status.interval_s:.0f} s; hover a square for the node",
        summary=summary,
        power=power,
    )


def write_page(
    path: Path, status: FleetStatus, fleet: Fleet, prometheus: str | None = None
) -> Path:
    """Write :func:`render_fleet`'s page to ``path`` atomically (power from ``prometheus``)."""
    power = rack_power_from_prometheus(prometheus, status.cluster) if prometheus else []
    text = render_fleet(status, fleet, power)
    return write_atomic(path, text, mode=0o600)


def rack_power_from_prometheus(
    base: str, cluster: str, timeout: float = PROMETHEUS_TIMEOUT_S
) -> list[RackPower]:
    """Every rack's budget and measured power from Prometheus's recording rules."""
    prometheus = Prometheus(base, timeout=timeout)
    sel = f'{{cluster="{cluster}"}}'
    budgets = {
        r["metric"].get("rack", "?"): float(r["value"][1])
        for r in prometheus.query(f"gpuforge:rack_power_budget_watts{sel}")
    }
    watts = {
        r["metric"].get("rack", "?"): float(r["value"][1])
        for r in prometheus.query(f"gpuforge:rack_power_watts{sel}")
    }
    return [RackPower(rack, watts.get(rack), budget) for rack, budget in sorted(budgets.items())]
