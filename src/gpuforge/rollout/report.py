"""The phase report: JSON for machines, one HTML page for people.

The JSON lists every node. The page lists the nodes that are not admitted first, one row each with
its reason, and folds the admitted ones into one row per rack, so that a batch of a thousand nodes
reads in a screen.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import hostlist
from jinja2 import Environment, select_autoescape

from gpuforge.atomic import write_atomic
from gpuforge.rollout.deploy import DeployOutcome
from gpuforge.rollout.state import StateStore
from gpuforge.topology.cluster import Cluster

REPORT_SCHEMA_VERSION = 1

_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>{{ r.cluster }} phase {{ r.phase }}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse}
td,th{padding:.25em .8em;border-bottom:1px solid #ddd;text-align:left}
.admitted{color:#1a7f37}.quarantined,.unreachable{color:#cf222e;font-weight:600}
.passed{color:#1a7f37}.failed{color:#cf222e}
</style></head><body>
<h1>{{ r.cluster }} — phase {{ r.phase }} (run {{ r.run_id }})</h1>
<p>Gate: <b class="{{ 'passed' if r.gate.passed else 'failed' }}">
{{ 'PASSED' if r.gate.passed else 'FAILED' }}</b> — {{ r.gate.detail }}</p>
<h2>Stages</h2>
<table><tr><th>stage</th><th>seconds</th><th>per node</th></tr>
{% for s, secs in r.stage_seconds.items() %}<tr><td>{{ s }}</td><td>{{ '%.1f' % secs }}</td>
<td>{{ '%.2f' % (secs / (r.nodes|length or 1)) }}</td></tr>{% endfor %}</table>
{% if problems %}<h2 id="not-admitted">Not admitted</h2>
<table><tr><th>node</th><th>rack</th><th>state</th><th>reason</th></tr>
{% for n in problems %}<tr><td>{{ n.hostname }}</td><td>{{ n.rack }}</td>
<td class="{{ n.state }}">{{ n.state }}</td><td>{{ n.reason }}</td></tr>{% endfor %}
</table>{% endif %}
{% if racks %}<h2 id="admitted">Admitted, by rack</h2>
<table><tr><th>SU</th><th>rack</th><th>nodes</th></tr>
{% for k in racks %}<tr><td>{{ k.su }}</td><td>{{ k.rack }}</td>
<td class="admitted">{{ k.nodes }} ({{ k.count }})</td></tr>{% endfor %}</table>{% endif %}
{% if r.notes %}<h2>Notes</h2><ul>{% for n in r.notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
{% if r.reports %}<h2>Validation reports</h2><ul>
{% for p in r.reports %}<li><a href="{{ p }}">{{ p }}</a></li>{% endfor %}</ul>{% endif %}
</body></html>
"""


def phase_report(
    store: StateStore, cluster: Cluster, outcome: DeployOutcome, run_dir: Path
) -> dict[str, Any]:
    """The report's content as plain data (the JSON file's schema)."""
    phase = outcome.gate.phase
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "cluster": cluster.name,
        "phase": phase,
        "run_id": outcome.run_id,
        "gate": {
            "passed": outcome.gate.passed,
            "admitted": outcome.gate.admitted,
            "total": outcome.gate.total,
            "required_fraction": outcome.gate.required,
            "detail": outcome.gate.detail,
        },
        "stage_seconds": {k: round(v, 3) for k, v in outcome.stage_seconds.items()},
        "nodes": [
            {
                "hostname": n.hostname,
                "rack": cluster.node(n.hostname).rack,
                "su": cluster.node(n.hostname).su,
                "state": n.state.value,
                "reason": n.reason,
            }
            for n in store.nodes(phase)
        ],
        "notes": list(outcome.notes),
        "reports": [os.path.relpath(p, run_dir) for p in outcome.report_paths],
    }


# Order of the rows of nodes that are not admitted: the failures first.
_STATE_ORDER = {"quarantined": 0, "unreachable": 1}


def html_sections(data: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The page's two node tables: nodes not admitted (failures first), admitted ones by rack."""
    nodes = data["nodes"]
    problems = sorted(
        (n for n in nodes if n["state"] != "admitted"),
        key=lambda n: (_STATE_ORDER.get(n["state"], 2), n["hostname"]),
    )
    racks: dict[tuple[int, str], list[str]] = {}
    for n in nodes:
        if n["state"] == "admitted":
            racks.setdefault((int(n["su"]), str(n["rack"])), []).append(n["hostname"])
    rows = [
        {"su": su, "rack": rack, "nodes": hostlist.collect_hostlist(names), "count": len(names)}
        for (su, rack), names in sorted(racks.items())
    ]
    return problems, rows


def phase_html(data: dict[str, Any]) -> str:
    """The page of a phase report (``data`` as :func:`phase_report` returns it)."""
    env = Environment(autoescape=select_autoescape(default=True))
    problems, racks = html_sections(data)
    return env.from_string(_HTML).render(r=data, problems=problems, racks=racks)


def write_phase_report(
    store: StateStore, cluster: Cluster, outcome: DeployOutcome, run_dir: Path
) -> list[Path]:
    """Write ``phase.json`` and ``phase.html`` into ``run_dir``; return their paths."""
    data = phase_report(store, cluster, outcome, run_dir)
    json_path, html_path = run_dir / "phase.json", run_dir / "phase.html"
    write_atomic(json_path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode=0o600)
    write_atomic(html_path, phase_html(data), mode=0o600)
    return [json_path, html_path]
