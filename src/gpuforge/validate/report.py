"""Writing a validation run down: JSON (stable schema), JUnit XML and a self-contained HTML page.

JSON is the machine contract (``schema_version``, docs/validation.md). JUnit has one testcase per
node x check so that any CI shows the failures (:mod:`gpuforge.reporting.junit`, the one JUnit
writer). The HTML page (``gpuforge/reporting/templates/validation.html.j2`` on the reports' one
layout) needs no JavaScript: the plots are inline SVG, their geometry computed here and their
markup written by ``charts.html.j2``. It is written for a batch of a thousand nodes: it opens with
the nodes that failed or are held, says each repeated warning once with the nodes it concerns, and
folds the admitted nodes into one line per rack.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hostlist

from gpuforge.atomic import write_atomic
from gpuforge.reporting import junit, render_page
from gpuforge.reporting.junit import Case, Suite
from gpuforge.validate.result import BatchSummary, CheckResult, NodeVerdict, Status, Verdict

COLORS = {
    "pass": "#2e7d32",
    "warn": "#f9a825",
    "fail": "#c62828",
    "error": "#6a1b9a",
    "skip": "#9e9e9e",
    "admit": "#2e7d32",
    "quarantine": "#c62828",
    "hold": "#6a1b9a",
}


def to_json(summary: BatchSummary, extra: Mapping[str, Any] | None = None) -> str:
    """The JSON report (sorted keys, so two runs diff cleanly)."""
    data = summary.to_dict()
    if extra:
        data.update(extra)
    return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"


# --- JUnit ------------------------------------------------------------------------------------


def _case_text(r: CheckResult) -> str:
    lines = [
        f"measured: {r.measured}",
        f"expected: {r.expected}",
    ]
    if r.message:
        lines.append(f"message: {r.message}")
    if r.evidence:
        lines += ["evidence:", r.evidence]
    return "\n".join(lines)


def to_junit(summary: BatchSummary) -> str:
    """JUnit XML: a testsuite per node, a testcase per check, plus a ``fabric`` suite."""
    outcome = {Status.FAIL: "failure", Status.ERROR: "error", Status.SKIP: "skipped"}
    suites = []
    for nv in summary.nodes:
        cases = []
        for r in nv.results:
            line = r.message or f"measured {r.measured}, expected {r.expected}"
            kind = outcome.get(r.status, "pass")
            text = _case_text(r)
            cases.append(
                Case(
                    classname=f"gpuforge.{nv.node}",
                    name=r.check,
                    outcome=kind,
                    message=(r.message or "not applicable") if kind == "skipped" else line,
                    kind={"failure": "fail", "error": "inconclusive"}.get(kind, ""),
                    text=f"{r.status.value.upper()}\n{text}" if kind == "pass" else text,
                    time_s=r.duration_s,
                )
            )
        suites.append(Suite(nv.node, cases))
    if summary.findings:
        fabric = [
            Case("gpuforge.fabric", f.subject, "failure", f.detail, f.kind, f.evidence)
            for f in summary.findings
        ]
        suites.append(Suite("fabric", fabric))
    return junit.to_junit("gpuforge-validate", suites)


# --- SVG plots --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """One bar of a chart."""

    label: str
    value: float
    status: str


def bar_chart(
    title: str, bars: Sequence[Bar], floor: float | None, unit: str
) -> dict[str, Any] | None:
    """A horizontal bar chart's geometry (one row per node, the floor as a dashed line), which
    ``charts.html.j2``'s ``bar_chart`` draws; None without bars."""
    if not bars:
        return None
    row, label_w, plot_w, pad = 16, 150, 520, 30
    top = max([b.value for b in bars] + [floor or 0.0]) * 1.1 or 1.0
    return {
        "title": title,
        "unit": unit,
        "width": label_w + plot_w + 80,
        "height": pad + row * len(bars) + pad,
        "label_w": label_w,
        "bar_h": row - 4,
        "pad": pad,
        "floor": floor,
        "floor_x": label_w + (floor or 0.0) / top * plot_w,
        "bars": [
            {
                "label": b.label,
                "value": b.value,
                "status": b.status,
                "color": COLORS.get(b.status, "#555"),
                "y": pad + i * row,
                "w": max(b.value / top * plot_w, 0.5),
            }
            for i, b in enumerate(bars)
        ],
    }


def heat_map(
    summary: BatchSummary, placement: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any] | None:
    """Nodes as squares, one row per rack, racks grouped by SU, coloured by verdict: the geometry
    ``charts.html.j2``'s ``verdict_map`` draws; None without placement."""
    if not placement:
        return None
    racks: dict[tuple[int, str], list[tuple[str, str]]] = {}
    verdicts = {n.node: n.verdict.value for n in summary.nodes}
    for node, where in placement.items():
        if node not in verdicts:
            continue
        key = (int(where.get("su") or 0), str(where.get("rack") or "?"))
        racks.setdefault(key, []).append((node, verdicts[node]))
    cell, label_w = 14, 110
    rows = [
        {
            "su": su,
            "rack": rack,
            "y": 20 + i * cell,
            "nodes": [
                {"node": node, "verdict": verdict, "color": COLORS[verdict]}
                for node, verdict in sorted(nodes)
            ],
        }
        for i, ((su, rack), nodes) in enumerate(sorted(racks.items()))
    ]
    return {
        "width": label_w + cell * max((len(v) for v in racks.values()), default=1) + 10,
        "height": 20 + cell * len(racks) + 10,
        "cell": cell,
        "label_w": label_w,
        "rows": rows,
    }


def metric_bars(summary: BatchSummary, check: str) -> list[Bar]:
    """Bars for every node's numeric ``measured`` value of ``check``."""
    bars = []
    for r in summary.results:
        if (
            r.check == check
            and isinstance(r.measured, int | float)
            and not isinstance(r.measured, bool)
        ):
            bars.append(Bar(r.node, float(r.measured), r.status.value))
    return sorted(bars, key=lambda b: b.label)


#: Most bars a chart draws; a larger batch shows its lowest values (the ones that matter).
CHART_MAX_BARS = 48

#: Charts the HTML page draws when the run has the data: check name -> (title, unit).
CHARTS = {
    "nccl.allreduce_nvlink": ("8-GPU all_reduce busbw per node", "GB/s"),
    "burnin.gpu_burn.min_gflops": ("gpu-burn slowest GPU per node", "Gflop/s"),
    "burnin.ib_write_bw.min": ("ib_write_bw slowest rail per node", "Gb/s"),
}


def lowest_bars(bars: Sequence[Bar], limit: int = CHART_MAX_BARS) -> tuple[list[Bar], str]:
    """At most ``limit`` bars, the lowest values first when there are more; and a caption."""
    if len(bars) <= limit:
        return list(bars), ""
    ordered = sorted(bars, key=lambda b: (b.value, b.label))
    values = [b.value for b in ordered]
    mid = len(values) // 2
    median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    return ordered[:limit], f"lowest {limit} of {len(bars)}, median {median:.1f}"


@dataclass(frozen=True)
class WarningGroup:
    """One warning (check and message) and every node that gave it."""

    check: str
    message: str
    nodes: str  # hostlist expression
    count: int
    measured: Any
    expected: Any
    evidence: str  # the first node's


def warning_groups(summary: BatchSummary) -> list[WarningGroup]:
    """Every ``warn`` result, once per check and message, the most widespread first."""
    grouped: dict[tuple[str, str], list[CheckResult]] = {}
    for r in summary.results:
        if r.status is Status.WARN:
            grouped.setdefault((r.check, r.message), []).append(r)
    groups = [
        WarningGroup(
            check,
            message,
            hostlist.collect_hostlist([r.node for r in results]),
            len(results),
            results[0].measured,
            results[0].expected,
            results[0].evidence,
        )
        for (check, message), results in grouped.items()
    ]
    return sorted(groups, key=lambda g: (-g.count, g.check, g.message))


@dataclass(frozen=True)
class RackGroup:
    """The admitted nodes of one rack, as one line."""

    su: int
    rack: str
    nodes: str  # hostlist expression
    count: int
    passed: int  # passing checks over those nodes
    warned: int  # nodes among them with a warning


def admitted_by_rack(
    summary: BatchSummary, placement: Mapping[str, Mapping[str, Any]]
) -> list[RackGroup]:
    """Admitted nodes folded into one line per rack (SU order, then rack)."""
    racks: dict[tuple[int, str], list[NodeVerdict]] = {}
    for nv in summary.by_verdict(Verdict.ADMIT):
        where = placement.get(nv.node) or {}
        key = (int(where.get("su") or 0), str(where.get("rack") or "-"))
        racks.setdefault(key, []).append(nv)
    return [
        RackGroup(
            su,
            rack,
            hostlist.collect_hostlist([n.node for n in nodes]),
            len(nodes),
            sum(1 for n in nodes for r in n.results if r.status is Status.PASS),
            sum(1 for n in nodes if n.warnings),
        )
        for (su, rack), nodes in sorted(racks.items())
    ]


def action_groups(actions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Slurm actions, one line per action, outcome, reason and detail with the nodes concerned."""
    grouped: dict[tuple[str, bool, str, str], list[str]] = {}
    for a in actions:
        key = (
            str(a.get("action", "")),
            bool(a.get("changed")),
            str(a.get("reason", "")),
            str(a.get("detail", "")),
        )
        grouped.setdefault(key, []).append(str(a.get("node", "")))
    rows = [
        {
            "action": action,
            "changed": changed,
            "reason": reason,
            "detail": detail,
            "nodes": hostlist.collect_hostlist(nodes),
            "count": len(nodes),
        }
        for (action, changed, reason, detail), nodes in grouped.items()
    ]
    # What took nodes out first; then what left them as they were.
    return sorted(rows, key=lambda a: (a["action"] != "drain", not a["changed"], a["action"]))


def to_html(summary: BatchSummary, *, actions: Sequence[Mapping[str, Any]] = ()) -> str:
    """The HTML report: failures and held nodes first, warnings once, admitted nodes by rack."""
    floors: Mapping[str, float] = summary.meta.get("floors", {})
    charts = []
    for check, (title, unit) in CHARTS.items():
        bars, caption = lowest_bars(metric_bars(summary, check))
        if bars:
            full = f"{title} ({caption})" if caption else title
            charts.append(bar_chart(full, bars, floors.get(check), unit))
    placement = summary.meta.get("placement", {})
    order = {Verdict.QUARANTINE: 0, Verdict.HOLD: 1}
    problems = sorted(
        (n for n in summary.nodes if n.verdict is not Verdict.ADMIT),
        key=lambda n: (order[n.verdict], n.node),
    )
    return render_page(
        "validation.html.j2",
        summary=summary,
        problems=problems,
        racks=admitted_by_rack(summary, placement),
        warnings=warning_groups(summary),
        counts=summary.counts(),
        charts=charts,
        heat=heat_map(summary, placement),
        colors=COLORS,
        actions=action_groups(actions),
        Status=Status,
    )


def write_reports(
    summary: BatchSummary,
    out_dir: Path,
    *,
    actions: Sequence[Mapping[str, Any]] = (),
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Path]:
    """Write ``validation.json``, ``junit.xml`` and ``report.html`` into ``out_dir``."""
    paths = {
        "json": out_dir / "validation.json",
        "junit": out_dir / "junit.xml",
        "html": out_dir / "report.html",
    }
    merged = dict(extra or {})
    if actions:
        merged["slurm_actions"] = list(actions)
    write_atomic(paths["json"], to_json(summary, merged), mode=0o600)
    write_atomic(paths["junit"], to_junit(summary), mode=0o600)
    write_atomic(paths["html"], to_html(summary, actions=actions), mode=0o600)
    return paths
