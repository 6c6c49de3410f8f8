"""The phase report's page: nodes not admitted first, admitted nodes one row per rack."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from rich.console import Console

from gpuforge.rollout.deploy import DeployRequest, deploy_phase
from gpuforge.rollout.report import REPORT_SCHEMA_VERSION, phase_html
from gpuforge.rollout.state import open_store

from .fakes import FakeSteps

QUARANTINED = {"gpu0042": "gpuforge: failed gpu.ecc_uncorrectable", "gpu0900": "gpuforge: x"}
UNREACHABLE = {"gpu0500": "preflight: ssh: connect to host gpu0500 port 22: No route to host"}


def _data(n: int) -> dict[str, Any]:
    nodes = []
    for i in range(n):
        name = f"gpu{i + 1:04d}"
        state, reason = "admitted", ""
        if name in QUARANTINED:
            state, reason = "quarantined", QUARANTINED[name]
        elif name in UNREACHABLE:
            state, reason = "unreachable", UNREACHABLE[name]
        nodes.append(
            {
                "hostname": name,
                "rack": f"r{i // 8 + 1:03d}",
                "su": i // 256 + 1,
                "state": state,
                "reason": reason,
            }
        )
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "cluster": "big",
        "phase": 1,
        "run_id": 7,
        "gate": {
            "passed": True,
            "admitted": n - 3,
            "total": n,
            "required_fraction": 0.95,
            "detail": f"{n - 3}/{n} admitted",
        },
        "stage_seconds": {"preflight": 5.0, "provision": 200.0},
        "nodes": nodes,
        "notes": [],
        "reports": ["validation/report.html"],
    }


def test_thousand_nodes_page_lists_failures_first_and_folds_racks() -> None:
    page = phase_html(_data(1000))
    assert len(page.encode()) < 60_000
    first = page.index("<h2", page.index("<h2>Stages</h2>") + 1)
    assert page[first:].startswith('<h2 id="not-admitted">')
    rows = re.findall(r"<tr><td>(gpu\d+)</td>", page)
    assert rows == ["gpu0042", "gpu0900", "gpu0500"]  # quarantined, then unreachable
    assert "No route to host" in page
    admitted = page[page.index('id="admitted"') :]
    assert admitted.count('<td class="admitted">') == 125
    assert "gpu[0001-0008] (8)" in admitted
    assert "gpu[0041,0043-0048] (7)" in admitted


def test_all_admitted_has_no_failure_table() -> None:
    data = _data(4)
    page = phase_html(data)
    assert 'id="not-admitted"' not in page
    assert "gpu[0001-0004] (4)" in page


def test_deploy_summary_table_folds_admitted_nodes(tmp_path: Path) -> None:
    from gpuforge.cli.deploy import _print_outcome  # noqa: PLC0415

    hosts = tuple(f"gpu{i:03d}" for i in range(1, 201))
    store = open_store(tmp_path / "rollout.db")
    steps = FakeSteps(unreachable={"gpu150"}, faulty={"gpu007": "gpu.row_remap"})
    request = DeployRequest(phase=1, hosts=hosts, gate_fraction=0.9, infra=(), operator="t")
    outcome = deploy_phase(store, steps, request, lock_path=tmp_path / "rollout.lock")
    out = io.StringIO()
    _print_outcome(Console(file=out, width=200), store, 1, outcome, [])
    text = out.getvalue()
    assert len(text.splitlines()) < 20, text
    assert text.index("gpu007") < text.index("gpu150") < text.index("(198)")
    assert "gpu[001-006,008-149,151-200] (198)" in text
