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

from gpuforge.atomic import write_atomic
from gpuforge.reporting import render_page
from gpuforge.rollout.deploy import DeployOutcome
from gpuforge.rollout.state import StateStore
from gpuforge.topology.cluster import Cluster

REPORT_SCHEMA_VERSION = 1


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
    problems, racks = html_sections(data)
    return render_page("phase.html.j2", r=data, problems=problems, racks=racks)


def write_phase_report(
    store: StateStore, cluster: Cluster, outcome: DeployOutcome, run_dir: Path
) -> list[Path]:
    """Write ``phase.json`` and ``phase.html`` into ``run_dir``; return their paths."""
    data = phase_report(store, cluster, outcome, run_dir)
    json_path, html_path = run_dir / "phase.json", run_dir / "phase.html"
    write_atomic(json_path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode=0o600)
    write_atomic(html_path, phase_html(data), mode=0o600)
    return [json_path, html_path]
