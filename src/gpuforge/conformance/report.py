"""What changed since the previous run, and the run's reports (JSON, JUnit, HTML, metrics).

Built for 12,500 nodes: one pass over the run's results and the previous run's, one query for
repeat offenders; the HTML shows changes and failures first, one heat-map cell per rack and one
line per healthy SU, never a row per healthy node (the JSON and JUnit files have every node).
"""

from __future__ import annotations

import html
import json
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuforge.atomic import write_atomic
from gpuforge.history.conformance import ConformanceHistory, NodeResult, Run

#: Failures within this many days that make a node a repeat offender (two or more).
REPEAT_DAYS = 7.0
REPEAT_MIN = 2
#: The checks that report link flaps and drops (docs/health.md).
FLAP_CHECKS = ("fabric.flaps",)
#: Rows of one HTML table before the rest is summarized.
HTML_ROWS = 300
_BAD = ("fail", "error")


@dataclass(frozen=True)
class Placement:
    """Where a node sits: scalable unit, rack, leaf switches (first rail's leaf first)."""

    su: str = ""
    rack: str = ""
    leaf: str = ""


@dataclass
class Changes:
    """One run against the previous one."""

    run: Run
    previous: Run | None
    results: Mapping[str, NodeResult]
    new_failures: list[str] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    still_failing: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)
    repeat_offenders: dict[str, int] = field(default_factory=dict)
    flapping: list[str] = field(default_factory=list)
    drift_by_kind: dict[str, int] = field(default_factory=dict)
    drift_new: dict[str, list[tuple[str, str, str, str]]] = field(default_factory=dict)
    drift_fixed: dict[str, list[tuple[str, str, str, str]]] = field(default_factory=dict)
    heat: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 every checked node passed; 1 a node failed or could not be judged; 2 the run was
        cut short (partial: results are missing)."""
        if self.run.state == "partial":
            return 2
        if any(r.outcome in _BAD for r in self.results.values()):
            return 1
        return 0

    def counts(self) -> dict[str, int]:
        """Nodes per outcome."""
        return dict(Counter(r.outcome for r in self.results.values()))

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (changes first; every node's result last)."""

        def items(d: Mapping[str, list[tuple[str, str, str, str]]]) -> dict[str, Any]:
            return {
                n: [{"kind": k, "item": i, "desired": w, "actual": a} for k, i, w, a in v]
                for n, v in sorted(d.items())
            }

        return {
            "schema": "gpuforge.conformance-report/1",
            "run": self.run.to_dict(),
            "previous": self.previous.to_dict() if self.previous else None,
            "exit_code": self.exit_code,
            "counts": self.counts(),
            "new_failures": self.new_failures,
            "cleared": self.cleared,
            "still_failing": self.still_failing,
            "errors": self.errors,
            "repeat_offenders": self.repeat_offenders,
            "flapping_links": self.flapping,
            "drift_by_kind": self.drift_by_kind,
            "drift_new": items(self.drift_new),
            "drift_fixed": items(self.drift_fixed),
            "not_checked": self.not_checked,
            "heat": self.heat,
            "nodes": {n: r.to_dict() for n, r in sorted(self.results.items())},
        }


def compare(
    history: ConformanceHistory,
    run: Run,
    placement: Mapping[str, Placement],
    *,
    previous: Run | None = None,
) -> Changes:
    """The :class:`Changes` of ``run`` against ``previous`` (default: the run before it)."""
    if previous is None:
        previous = next((r for r in history.runs(60) if r.id < run.id), None)
    now = history.results(run.id)
    before = history.results(previous.id) if previous else {}
    out = Changes(run, previous, now)
    for node in sorted(now):
        cur, old = now[node], before.get(node)
        if cur.outcome == "fail":
            (out.still_failing if old and old.outcome == "fail" else out.new_failures).append(node)
        elif cur.outcome == "error":
            out.errors.append(node)
        elif cur.outcome == "not_checked":
            out.not_checked.append(node)
        elif old is not None and old.outcome in _BAD:
            out.cleared.append(node)
        if any(c in FLAP_CHECKS and s in {"fail", "warn"} for c, s, _ in cur.failed):
            out.flapping.append(node)
        for item in cur.drift:
            out.drift_by_kind[item[0]] = out.drift_by_kind.get(item[0], 0) + 1
        if cur.outcome != "not_checked":
            old_drift = set(old.drift) if old and old.outcome != "not_checked" else set()
            added = [d for d in cur.drift if d not in old_drift]
            fixed = sorted(old_drift - set(cur.drift))
            if added:
                out.drift_new[node] = added
            if fixed:
                out.drift_fixed[node] = fixed
    offenders = history.failures_since(run.started - REPEAT_DAYS * 86400)
    out.repeat_offenders = {n: c for n, c in sorted(offenders.items()) if c >= REPEAT_MIN}
    out.heat = heat_map(now, placement)
    return out


def heat_map(
    results: Mapping[str, NodeResult], placement: Mapping[str, Placement]
) -> dict[str, dict[str, dict[str, int]]]:
    """``{"su"|"rack"|"leaf": {group: {outcome: nodes}}}``."""
    heat: dict[str, dict[str, dict[str, int]]] = {"su": {}, "rack": {}, "leaf": {}}
    for node, result in results.items():
        where = placement.get(node, Placement())
        for level, group in (("su", where.su), ("rack", where.rack), ("leaf", where.leaf)):
            cell = heat[level].setdefault(group or "(none)", {})
            cell[result.outcome] = cell.get(result.outcome, 0) + 1
    return {k: dict(sorted(v.items())) for k, v in heat.items()}


# -- files -------------------------------------------------------------------------------------


def junit(changes: Changes) -> str:
    """One test case per node: failures and errors with their checks and drift, not checked as
    skipped."""
    results = changes.results
    suite = ET.Element(
        "testsuite",
        name=f"gpuforge conformance run {changes.run.id} ({changes.run.level})",
        tests=str(len(results)),
        failures=str(sum(r.outcome == "fail" for r in results.values())),
        errors=str(sum(r.outcome == "error" for r in results.values())),
        skipped=str(sum(r.outcome == "not_checked" for r in results.values())),
    )
    for node, r in sorted(results.items()):
        case = ET.SubElement(suite, "testcase", classname="conformance", name=node)
        body = "\n".join(
            [f"{c} {s} {a}".strip() for c, s, a in r.failed]
            + [f"drift {k} {i}: desired {w!r}, actual {a!r}" for k, i, w, a in r.drift]
        )
        if r.outcome == "fail":
            ET.SubElement(case, "failure", message=r.why or "failed").text = body
        elif r.outcome == "error":
            ET.SubElement(case, "error", message=r.why or "error").text = body
        elif r.outcome == "not_checked":
            ET.SubElement(case, "skipped", message=r.why or "not checked")
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


_CSS = """body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:left}
.fail{background:#f8c4c4}.error{background:#e5c8f0}.warn{background:#fbe7b0}
.pass{background:#cdeccd}.not_checked{background:#ddd}.cell{display:inline-block;width:5.5em;
margin:1px;padding:2px;font-size:11px;border:1px solid #999}h2{margin-top:1.2em}"""


def _e(text: object) -> str:
    return html.escape(str(text))


def _rows(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows[:HTML_ROWS]
    )
    more = (
        f"<p>... and {len(rows) - HTML_ROWS} more (see the JSON report)</p>"
        if len(rows) > HTML_ROWS
        else ""
    )
    return f"<table><tr>{head}</tr>{body}</table>{more}"


def _worst(cell: Mapping[str, int]) -> str:
    for outcome in ("fail", "error", "warn", "pass"):
        if cell.get(outcome):
            return outcome
    return "not_checked"


def render_html(changes: Changes) -> str:
    """The report page: changes, failures, repeat offenders, drift, heat map by rack."""
    r = changes.results
    counts = changes.counts()
    parts = [
        f"<!doctype html><meta charset=utf-8><title>conformance run {changes.run.id}</title>",
        f"<style>{_CSS}</style>",
        f"<h1>Conformance run {changes.run.id} "
        f"({_e(changes.run.level)}, {_e(changes.run.state)})</h1>",
        "<p>"
        + ", ".join(f"{_e(k)} {v}" for k, v in sorted(counts.items()))
        + (f"; previous run {changes.previous.id}" if changes.previous else "; first run")
        + "</p>",
        "<h2>What changed</h2>",
        _rows(
            ["change", "node", "checks", "drift"],
            [("new failure", n, r[n].why, len(r[n].drift)) for n in changes.new_failures]
            + [("cleared", n, "", len(changes.drift_fixed.get(n, []))) for n in changes.cleared]
            + [("error", n, r[n].why, "") for n in changes.errors],
        ),
        "<h2>Drift fixed since the previous run</h2>",
        _rows(
            ["node", "kind", "item"],
            [(n, k, i) for n, v in sorted(changes.drift_fixed.items()) for k, i, _, _ in v],
        ),
        "<h2>Failures</h2>",
        _rows(
            ["node", "checks", "kind", "item", "desired", "actual"],
            [
                (n, r[n].why, *(d if d else ("", "", "", "")))
                for n in changes.new_failures + changes.still_failing
                for d in (r[n].drift or ((),))
            ],
        ),
        "<h2>Repeat offenders (2 or more failures in 7 days)</h2>",
        _rows(["node", "failed runs"], sorted(changes.repeat_offenders.items())),
        "<h2>Flapping links</h2>",
        _rows(["node"], [(n,) for n in changes.flapping]),
        "<h2>Drift by kind</h2>",
        _rows(["kind", "items"], sorted(changes.drift_by_kind.items())),
        "<h2>Heat map by rack</h2>",
        _heat_html(changes.heat),
        "<h2>Not checked</h2>",
        _rows(["node", "why"], [(n, r[n].why) for n in changes.not_checked]),
    ]
    return "\n".join(parts) + "\n"


def _heat_html(heat: Mapping[str, Mapping[str, Mapping[str, int]]]) -> str:
    racks = heat.get("rack", {})
    healthy = [g for g, c in racks.items() if set(c) <= {"pass", "warn"}]
    cells = "".join(
        f'<span class="cell {_worst(c)}" title="{_e(json.dumps(dict(c)))}">{_e(g)}<br>'
        + " ".join(f"{k[0]}{v}" for k, v in sorted(c.items()))
        + "</span>"
        for g, c in racks.items()
        if g not in healthy
    )
    summary = (
        f"<p>{len(healthy)} rack(s) all healthy: {_e(', '.join(healthy[:40]))}"
        + (f" ... ({len(healthy) - 40} more)" if len(healthy) > 40 else "")
        + "</p>"
    )
    leaf = _rows(
        ["leaf", *_OUTCOMES],
        [
            (g, *(c.get(o, 0) for o in _OUTCOMES))
            for g, c in heat.get("leaf", {}).items()
            if not set(c) <= {"pass", "warn"}
        ],
    )
    su = _rows(
        ["SU", *_OUTCOMES],
        [(g, *(c.get(o, 0) for o in _OUTCOMES)) for g, c in heat.get("su", {}).items()],
    )
    return f"<div>{cells}</div>{summary}<h3>By SU</h3>{su}<h3>Leaves with failures</h3>{leaf}"


_OUTCOMES = ("pass", "warn", "fail", "error", "not_checked")


def metrics(changes: Changes, now: float | None = None) -> str:
    """Controller-side textfile metrics of the run (node_exporter's textfile collector)."""
    at = time.time() if now is None else now
    counts = changes.counts()
    lines = [
        "# HELP gpuforge_conformance_fleet_nodes Nodes per outcome of the last conformance run.",
        "# TYPE gpuforge_conformance_fleet_nodes gauge",
        *(
            f'gpuforge_conformance_fleet_nodes{{outcome="{o}"}} {counts.get(o, 0)}'
            for o in _OUTCOMES
        ),
        "# HELP gpuforge_conformance_fleet_drift_items Drifted items per kind, last run.",
        "# TYPE gpuforge_conformance_fleet_drift_items gauge",
        *(
            f'gpuforge_conformance_fleet_drift_items{{kind="{k}"}} {v}'
            for k, v in sorted(changes.drift_by_kind.items())
        ),
        "# HELP gpuforge_conformance_fleet_run_partial 1 when the last run was cut short.",
        "# TYPE gpuforge_conformance_fleet_run_partial gauge",
        f"gpuforge_conformance_fleet_run_partial {int(changes.run.state == 'partial')}",
        "# HELP gpuforge_conformance_fleet_last_run_timestamp_seconds End of the last run.",
        "# TYPE gpuforge_conformance_fleet_last_run_timestamp_seconds gauge",
        f"gpuforge_conformance_fleet_last_run_timestamp_seconds {changes.run.finished or at:.0f}",
    ]
    return "\n".join(lines) + "\n"


def write(changes: Changes, out_dir: Path, *, textfile: Path | None = None) -> dict[str, Path]:
    """Write conformance.json, junit.xml, report.html (atomically) and, when asked, the metrics."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "json": (out_dir / "conformance.json", json.dumps(changes.to_dict(), indent=1) + "\n"),
        "junit": (out_dir / "junit.xml", junit(changes)),
        "html": (out_dir / "report.html", render_html(changes)),
    }
    if textfile is not None:
        files["metrics"] = (textfile, metrics(changes))
    for path, text in files.values():
        write_atomic(path, text, mode=None)
    return {k: p for k, (p, _) in files.items()}
