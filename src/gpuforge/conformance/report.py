"""What changed since the previous run, and the run's reports (JSON, JUnit, HTML, metrics).

Built for 12,500 nodes: one pass over the run's results and the previous run's, one query for
repeat offenders; the HTML shows changes and failures first, one heat-map cell per rack and one
line per healthy SU, never a row per healthy node (the JSON and JUnit files have every node).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hostlist

from gpuforge.atomic import write_atomic
from gpuforge.history.conformance import ConformanceHistory, ConformanceRun, NodeResult
from gpuforge.node import filediff
from gpuforge.node.drift import CHECK as DRIFT_CHECK
from gpuforge.node.record import Drift
from gpuforge.reporting import render_page
from gpuforge.reporting.junit import Case, Suite, to_junit
from gpuforge.textfile import Family, render
from gpuforge.validate.result import Status

#: Failures within this many days that make a node a repeat offender (two or more).
REPEAT_DAYS = 7.0
REPEAT_MIN = 2
#: The checks that report link flaps and drops (docs/health.md).
FLAP_CHECKS = ("fabric.flaps",)
#: The statuses of a flap check that make a node flapping.
_FLAPPING = (Status.FAIL, Status.WARN)
#: Rows of one HTML table before the rest is summarized.
HTML_ROWS = 300
_BAD = ("fail", "error")
#: The run's meta key of the drifted files' diffs (:func:`file_diffs_meta`).
FILE_DIFFS_KEY = "file_diffs"
#: Distinct file diffs a run keeps (the most widespread first), and the HTML shows.
FILE_DIFFS_MAX = 50
#: Default share of the nodes a run sent a task to that it must judge (``--min-judged``, the
#: inventory's ``conformance_min_judged_fraction``); fewer, or none at all, exits 1.
MIN_JUDGED = 0.5
#: Outcomes that judged a node (``error``: it could not be judged; ``not_checked``: no result).
JUDGED = ("pass", "warn", "fail")


@dataclass(frozen=True)
class Placement:
    """Where a node sits: scalable unit, rack, leaf switches (first rail's leaf first)."""

    su: str = ""
    rack: str = ""
    leaf: str = ""


@dataclass
class Changes:
    """One run against the previous one."""

    run: ConformanceRun
    previous: ConformanceRun | None
    results: Mapping[str, NodeResult]
    new_failures: list[str] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    still_failing: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)
    repeat_offenders: dict[str, int] = field(default_factory=dict)
    flapping: list[str] = field(default_factory=list)
    drift_by_kind: dict[str, int] = field(default_factory=dict)
    drift_new: dict[str, list[Drift]] = field(default_factory=dict)
    drift_fixed: dict[str, list[Drift]] = field(default_factory=dict)
    heat: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    #: Drifted files' diffs against what their role rendered: ``{"diff", "nodes", "count"}``.
    file_diffs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 every checked node passed; 1 a node failed or could not be judged, or the run
        judged no node or fewer than its share (:attr:`short`); 2 the run was cut short
        (partial: results are missing)."""
        if self.run.state == "partial":
            return 2
        if any(r.outcome in _BAD for r in self.results.values()) or self.short:
            return 1
        return 0

    def judged(self) -> dict[str, Any]:
        """How many of the nodes sent a task were judged, against the run's share: ``{sent,
        judged, min_fraction, short}`` (``sent`` None: a run recorded before the rule)."""
        meta = self.run.meta or {}
        sent = meta.get("sent")
        share = float(meta.get("min_judged", MIN_JUDGED))
        judged = sum(1 for r in self.results.values() if r.outcome in JUDGED)
        out: dict[str, Any] = {"sent": sent, "judged": judged, "min_fraction": share}
        out["short"] = None if sent is None else _short(int(sent), judged, share, self.run.nodes)
        return out

    @property
    def short(self) -> str | None:
        """Why the run judged too few nodes (it exits 1), or None."""
        why = self.judged()["short"]
        return str(why) if why else None

    def counts(self) -> dict[str, int]:
        """Nodes per outcome."""
        return dict(Counter(r.outcome for r in self.results.values()))

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (changes first; every node's result last)."""

        def items(d: Mapping[str, list[Drift]]) -> dict[str, Any]:
            return {n: [x.to_dict() for x in v] for n, v in sorted(d.items())}

        return {
            "schema": "gpuforge.conformance-report/1",
            "run": self.run.to_dict(),
            "previous": self.previous.to_dict() if self.previous else None,
            "exit_code": self.exit_code,
            "judged": self.judged(),
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


def _short(sent: int, judged: int, share: float, fleet: int) -> str | None:
    option = "--min-judged or the inventory's conformance_min_judged_fraction"
    if sent == 0:
        return f"judged no node: none of the {fleet} GPU node(s) was idle to send a task to"
    if judged == 0:
        return (
            f"judged no node: none of the {sent} node(s) sent a task gave a result that could "
            "be judged (preempted, not started before the deadline, failed before reporting, "
            "or its record never reached the collector)"
        )
    if judged < share * sent:
        return (
            f"judged {judged} of the {sent} node(s) sent a task ({judged / sent:.0%}), fewer "
            f"than the required {share:.0%} ({option})"
        )
    return None


def compare(
    history: ConformanceHistory,
    run: ConformanceRun,
    placement: Mapping[str, Placement],
    *,
    previous: ConformanceRun | None = None,
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
        if any(c.check in FLAP_CHECKS and c.status in _FLAPPING for c in cur.failed):
            out.flapping.append(node)
        for item in cur.drift:
            out.drift_by_kind[item.kind] = out.drift_by_kind.get(item.kind, 0) + 1
        if cur.outcome != "not_checked":
            old_drift = set(old.drift) if old and old.outcome != "not_checked" else set()
            added = [d for d in cur.drift if d not in old_drift]
            fixed = sorted(old_drift - set(cur.drift), key=_drift_key)
            if added:
                out.drift_new[node] = added
            if fixed:
                out.drift_fixed[node] = fixed
    offenders = history.failures_since(run.started - REPEAT_DAYS * 86400)
    out.repeat_offenders = {n: c for n, c in sorted(offenders.items()) if c >= REPEAT_MIN}
    out.heat = heat_map(now, placement)
    out.file_diffs = list((run.meta or {}).get(FILE_DIFFS_KEY) or [])
    return out


def _drift_key(d: Drift) -> tuple[str, str, str, str]:
    return (d.kind, d.item, d.desired, d.actual)


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


def file_diffs_meta(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The drifted files' diffs the nodes' records carry (``conformance.drift`` evidence,
    :mod:`gpuforge.node.filediff`), each distinct diff once with the nodes that gave it, as the
    run meta to merge: ``{}`` when no record has one."""
    by_diff: dict[str, list[str]] = {}
    for node, rec in sorted(raw.items()):
        try:
            data = json.loads(rec) if isinstance(rec, str | bytes) else rec
            checks = data.get("checks") or [] if isinstance(data, Mapping) else []
        except ValueError:
            continue  # judged corrupt elsewhere
        for check in checks:
            if not isinstance(check, Mapping) or check.get("check") != DRIFT_CHECK:
                continue
            for block in str(check.get("evidence") or "").split("\n\n"):
                if block.startswith((filediff.DIFF_HEADER, "(no diff")):
                    by_diff.setdefault(block, []).append(str(node))
    groups = sorted(by_diff.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:FILE_DIFFS_MAX]
    if not groups:
        return {}
    rows = [{"diff": d, "nodes": hostlist.collect_hostlist(n), "count": len(n)} for d, n in groups]
    return {FILE_DIFFS_KEY: rows}


def diff_groups(rows: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The HTML's diffs: lines classed for colour, at most :data:`FILE_DIFFS_MAX`."""
    out = []
    for row in rows[:FILE_DIFFS_MAX]:
        lines = []
        for line in str(row.get("diff", "")).splitlines():
            cls = ""
            if line.startswith(("+++", "---")):
                cls = "file"
            elif line.startswith("@@"):
                cls = "hunk"
            elif line.startswith("+"):
                cls = "add"
            elif line.startswith("-"):
                cls = "del"
            lines.append({"cls": cls, "text": line})
        count = int(row.get("count", 0))
        out.append({"nodes": row.get("nodes", ""), "count": count, "lines": lines})
    return out, max(len(rows) - FILE_DIFFS_MAX, 0)


# -- files -------------------------------------------------------------------------------------


def junit(changes: Changes) -> str:
    """One test case per node: failures and errors with their checks and drift, not checked as
    skipped."""
    outcome = {"fail": "failure", "error": "error", "not_checked": "skipped"}
    default = {"fail": "failed", "error": "error", "not_checked": "not checked"}
    cases = []
    for node, r in sorted(changes.results.items()):
        body = "\n".join(
            [f"{c.check} {c.status.value} {c.action}".strip() for c in r.failed]
            + [
                f"drift {d.kind} {d.item}: desired {d.desired!r}, actual {d.actual!r}"
                for d in r.drift
            ]
        )
        kind = outcome.get(r.outcome, "pass")
        text = body if kind in ("failure", "error") else ""
        cases.append(Case("conformance", node, kind, r.why or default.get(r.outcome, ""), "", text))
    name = f"gpuforge conformance run {changes.run.id} ({changes.run.level})"
    short = changes.short
    if short:  # the run's own failure: it judged too few of the nodes it sent a task to
        cases.append(Case("conformance.run", "judged share", "failure", short, "judged", short))
    return to_junit("gpuforge-conformance", [Suite(name, cases)])


def _worst(cell: Mapping[str, int]) -> str:
    for outcome in ("fail", "error", "warn", "pass"):
        if cell.get(outcome):
            return outcome
    return "not_checked"


def _section(
    id_: str, title: str, header: Sequence[str], rows: Sequence[Sequence[object]], empty: str
) -> dict[str, Any]:
    return {"id": id_, "title": title, "header": header, "rows": rows, "empty": empty, "cls": ""}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def healthy_racks_text(racks: Mapping[str, Mapping[str, int]], shown: int = 40) -> str:
    """One sentence on the racks whose every node passed or warned (the rest are cells)."""
    healthy = [g for g, c in racks.items() if set(c) <= {"pass", "warn"}]
    if not racks:
        return "No rack to show: no node was placed in a rack."
    if not healthy:
        return f"No rack is all healthy (of {_plural(len(racks), 'rack')})."
    names = ", ".join(healthy[:shown])
    more = f" ... ({len(healthy) - shown} more)" if len(healthy) > shown else ""
    if len(healthy) == len(racks):
        lead = "The rack is all healthy" if len(racks) == 1 else f"All {len(racks)} racks healthy"
    else:
        lead = f"{len(healthy)} of {_plural(len(racks), 'rack')} all healthy"
    return f"{lead}: {names}{more}"


def render_html(changes: Changes) -> str:
    """The report page: changes, failures (with each changed file's diff), repeat offenders,
    drift, heat map by rack. An empty section says so in a sentence."""
    r = changes.results
    first = changes.previous is None
    failing = changes.new_failures + changes.still_failing
    sections = [
        _section(
            "changes",
            "What changed",
            ["change", "node", "checks", "drift"],
            [("new failure", n, r[n].why, len(r[n].drift)) for n in changes.new_failures]
            + [("cleared", n, "", len(changes.drift_fixed.get(n, []))) for n in changes.cleared]
            + [("error", n, r[n].why, "") for n in changes.errors],
            "First run: nothing to compare with."
            if first
            else "Nothing changed since the previous run: no new failure, error or clearance.",
        ),
        _section(
            "drift-fixed",
            "Drift fixed since the previous run",
            ["node", "kind", "item"],
            [(n, d.kind, d.item) for n, v in sorted(changes.drift_fixed.items()) for d in v],
            "First run: nothing to compare with."
            if first
            else "No drift was fixed since the previous run.",
        ),
        {
            **_section(
                "failures",
                "Failures",
                ["node", "checks", "kind", "item", "desired", "actual"],
                [
                    (n, r[n].why, *(_drift_key(d) if d is not None else ("", "", "", "")))
                    for n in failing
                    for d in (r[n].drift or (None,))
                ],
                "No node failed.",
            ),
            "cls": "failures",
        },
        _section(
            "repeat-offenders",
            f"Repeat offenders ({REPEAT_MIN} or more failures in {REPEAT_DAYS:g} days)",
            ["node", "failed runs"],
            sorted(changes.repeat_offenders.items()),
            f"No node failed {REPEAT_MIN} or more times in {REPEAT_DAYS:g} days.",
        ),
        _section(
            "flapping",
            "Flapping links",
            ["node"],
            [(n,) for n in changes.flapping],
            "No node reported a flapping link.",
        ),
        _section(
            "drift-kind",
            "Drift by kind",
            ["kind", "items"],
            sorted(changes.drift_by_kind.items()),
            "No item drifted.",
        ),
        _section("heat", "Heat map by rack", [], [], ""),
        _section(
            "not-checked",
            "Not checked",
            ["node", "why"],
            [(n, r[n].why) for n in changes.not_checked],
            "Every node was checked.",
        ),
    ]
    heat = changes.heat
    racks = heat.get("rack", {})
    cells = [
        {
            "group": g,
            "worst": _worst(c),
            "title": json.dumps(dict(c)),
            "text": " ".join(f"{k[0]}{v}" for k, v in sorted(c.items())),
        }
        for g, c in racks.items()
        if not set(c) <= {"pass", "warn"}
    ]
    diffs, diffs_more = diff_groups(changes.file_diffs)
    return render_page(
        "conformance.html.j2",
        run=changes.run,
        previous=changes.previous,
        counts=sorted(changes.counts().items()),
        sections=sections,
        limit=HTML_ROWS,
        cells=cells,
        healthy_text=healthy_racks_text(racks),
        heat_su={
            "header": ["SU", *_OUTCOMES],
            "rows": [(g, *(c.get(o, 0) for o in _OUTCOMES)) for g, c in heat.get("su", {}).items()],
        },
        heat_leaf={
            "header": ["leaf", *_OUTCOMES],
            "rows": [
                (g, *(c.get(o, 0) for o in _OUTCOMES))
                for g, c in heat.get("leaf", {}).items()
                if not set(c) <= {"pass", "warn"}
            ],
        },
        diffs=diffs,
        diffs_more=diffs_more,
    )


_OUTCOMES = ("pass", "warn", "fail", "error", "not_checked")


def metrics(changes: Changes, now: float | None = None) -> str:
    """Controller-side textfile metrics of the run (node_exporter's textfile collector)."""
    at = time.time() if now is None else now
    counts = changes.counts()
    return render(
        [
            Family(
                "gpuforge_conformance_fleet_nodes",
                "Nodes per outcome of the last conformance run.",
                "gauge",
                [({"outcome": o}, counts.get(o, 0)) for o in _OUTCOMES],
            ),
            Family(
                "gpuforge_conformance_fleet_drift_items",
                "Drifted items per kind, last run.",
                "gauge",
                [({"kind": k}, v) for k, v in sorted(changes.drift_by_kind.items())],
            ),
            Family.single(
                "gpuforge_conformance_fleet_run_partial",
                "1 when the last run was cut short.",
                int(changes.run.state == "partial"),
            ),
            Family.single(
                "gpuforge_conformance_fleet_last_run_timestamp_seconds",
                "End of the last run.",
                round(changes.run.finished or at),
            ),
        ]
    )


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
