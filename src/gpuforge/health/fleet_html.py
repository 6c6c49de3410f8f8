"""The fleet at a glance: one self-contained HTML page with a rack/leaf heat map.

:func:`render_heatmap` is the reusable part (the conformance report uses it too): a summary first,
then rack power against the spec's budget, then one small square per node grouped by SU and rack,
and one per leaf coloured by its share of unhealthy nodes. The page carries its data as one JSON
object and draws the squares with a few lines of inline JavaScript, so 12,500 nodes stay a page
of a few hundred kilobytes, never a 12,500-row table. Nothing is loaded from the network.

:func:`render_fleet` fills it from ``gpuforge fleet status``'s :class:`FleetStatus`;
:func:`rack_power_from_prometheus` reads ``gpuforge:rack_power_watts`` and
``gpuforge:rack_power_budget_watts`` (the recording rules of :mod:`gpuforge.monitoring.rules`).
"""

from __future__ import annotations

import html
import json
import os
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuforge.health.fleet import NO_RECORD, Fleet, FleetStatus
from gpuforge.promclient import Prometheus

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


_CSS = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.2em 0 .4em}
.sub{color:#666;margin-bottom:1em}
table.sum{border-collapse:collapse}table.sum td{padding:2px 12px 2px 0}
.legend span{display:inline-block;margin-right:12px}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
.su{display:inline-block;vertical-align:top;margin:.3em 1.2em .3em 0}
.su b{display:block;margin-bottom:2px}
.rack{display:inline-block;vertical-align:top;margin:0 3px 3px 0;padding:2px;border:1px solid #ddd}
.rack.hot{border-color:#c0392b}
.c{display:block;width:9px;height:9px;margin:1px}
.rk{font-size:9px;color:#888;writing-mode:vertical-rl}
.leaf{display:inline-block;width:14px;height:14px;margin:1px}
.bar{display:inline-block;height:10px;background:#3aa655;vertical-align:middle}
.bar.over{background:#c0392b}.bar.near{background:#e8b730}
#tip{position:fixed;background:#222;color:#fff;padding:3px 6px;font-size:12px;display:none}
"""

_JS = """
(function(){
var D=JSON.parse(document.getElementById('data').textContent);
var color=D.colors, tip=document.getElementById('tip'), n=0;
function show(e,t){tip.textContent=t;tip.style.display='block';
 tip.style.left=(e.clientX+12)+'px';tip.style.top=(e.clientY+12)+'px';}
function hide(){tip.style.display='none';}
var map=document.getElementById('heatmap');
D.sus.forEach(function(su){
 var box=document.createElement('div');box.className='su';
 var h=document.createElement('b');h.textContent=su.name+' ('+su.nodes+' nodes)';box.appendChild(h);
 su.racks.forEach(function(r){
  var rk=document.createElement('div');rk.className='rack'+(r.hot?' hot':'');
  rk.title=r.name+(r.power?' '+r.power:'');
  r.cells.forEach(function(c){
   var d=document.createElement('i');d.className='c';d.style.background=color[D.states[c[1]]];
   var t=c[0]+' ('+r.name+'): '+D.states[c[1]]+(c[2]?' '+c[2]:'');
   d.onmouseenter=function(e){show(e,t);};d.onmouseleave=hide;rk.appendChild(d);n++;
  });
  box.appendChild(rk);
 });
 map.appendChild(box);
});
var lv=document.getElementById('leaves');
D.leaves.forEach(function(l){
 var d=document.createElement('i');d.className='leaf';
 var bad=l[2]/Math.max(l[1],1);
 d.style.background=bad==0?color.pass:(bad<0.1?color.warn:color.fail);
 var t=l[0]+': '+l[2]+' of '+l[1]+' nodes not passing';
 d.onmouseenter=function(e){show(e,t);};d.onmouseleave=hide;lv.appendChild(d);
});
var done=document.getElementById('rendered');
done.setAttribute('data-cells',String(n));done.textContent=n+' nodes drawn';
})();
"""


def _summary_rows(summary: Sequence[tuple[str, str]]) -> str:
    return "".join(
        f"<tr><td>{html.escape(k)}</td><td><b>{html.escape(v)}</b></td></tr>" for k, v in summary
    )


def _power_section(power: Sequence[RackPower]) -> str:
    measured = [p for p in power if p.ratio is not None]
    if not power:
        return "<p>No power data (give <code>--prometheus URL</code>).</p>"
    if not measured:
        return f"<p>{len(power)} racks with a budget; none measured.</p>"
    over = [p for p in measured if (p.ratio or 0) > 1]
    near = [p for p in measured if POWER_WARN_RATIO <= (p.ratio or 0) <= 1]
    total_w = sum(p.watts or 0 for p in measured)
    total_b = sum(p.budget_w for p in measured)
    head = (
        f"<p>{len(measured)} of {len(power)} racks measured: {total_w / 1000:.1f} kW of "
        f"{total_b / 1000:.1f} kW budget ({total_w / total_b:.0%}); <b>{len(over)} over "
        f"budget</b>, {len(near)} above {POWER_WARN_RATIO:.0%}.</p>"
    )
    top = sorted(measured, key=lambda p: -(p.ratio or 0))[:POWER_TOP]
    rows = []
    for p in top:
        ratio = p.ratio or 0
        cls = "over" if ratio > 1 else "near" if ratio >= POWER_WARN_RATIO else ""
        width = min(ratio, 1.5) * 200
        rows.append(
            f"<tr><td>{html.escape(p.rack)}</td><td>{(p.watts or 0) / 1000:.1f} / "
            f"{p.budget_w / 1000:.1f} kW</td><td>{ratio:.0%}</td>"
            f'<td><span class="bar {cls}" style="width:{width:.0f}px"></span></td></tr>'
        )
    return head + f'<table class="sum">{"".join(rows)}</table>'


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
    legend = "".join(
        f'<span><i class="sw" style="background:{color}"></i>'
        f"{html.escape(_LEGEND.get(s, s))} {by_state[s]}</span>"
        for s, color in STATES.items()
    )
    # JSON inside <script>: "</" must not close the element early.
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><div class=sub>{html.escape(subtitle)}</div>"
        f'<h2>Summary</h2><table class="sum">{_summary_rows(summary)}</table>'
        f"<h2>Rack power vs budget</h2>{_power_section(power)}"
        f'<h2>Nodes by SU and rack</h2><div class="legend">{legend}</div>'
        '<div id="heatmap"></div>'
        '<h2>Leaves (share of nodes not passing)</h2><div id="leaves"></div>'
        '<p id="rendered" data-cells="0">drawing needs JavaScript</p><div id="tip"></div>'
        f'<script id="data" type="application/json">{blob}</script>'
        f"<script>{_JS}</script></body></html>\n"
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
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


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
