"""The fleet heat map page: summary first, small for 12,500 nodes, drawn by a real browser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpuforge.cli import main
from gpuforge.errors import OperationError
from gpuforge.generate import write_cluster_inventory
from gpuforge.health.fleet import Fleet, FleetStatus, NodeStatus
from gpuforge.health.fleet_html import (
    Cell,
    RackPower,
    rack_power_from_prometheus,
    render_fleet,
    render_heatmap,
)
from gpuforge.history import HistoryStore, history_path
from gpuforge.topology import load_cluster

from ..conftest import LAB
from ..history.records import T0, record

NODES = 12_500
PER_RACK = 4
PER_SU = 128


def _fleet(n: int = NODES) -> tuple[Fleet, FleetStatus]:
    names = tuple(f"gpu{i:05d}" for i in range(1, n + 1))
    placement = {
        name: {"rack": f"r{i // PER_RACK + 1:04d}", "su": i // PER_SU + 1}
        for i, name in enumerate(names)
    }
    leaves = {name: f"leaf-su{i // PER_SU + 1:03d}-r0" for i, name in enumerate(names)}
    fleet = Fleet("big", names, {}, leaves, placement)
    nodes = []
    for i, name in enumerate(names):
        if i % 997 == 0:
            nodes.append(
                NodeStatus(name, "fail", "gpu.xid", "reboot", age_s=60, stale=False,
                           drained_by="gpuforge", reason="gpuforge:gpu.xid:reboot")
            )  # fmt: skip
        elif i % 101 == 0:
            nodes.append(NodeStatus(name, "warn", "fabric.counters", "", age_s=60, stale=False))
        elif i % 5003 == 0:
            nodes.append(NodeStatus(name, "none"))
        else:
            nodes.append(NodeStatus(name, "pass", age_s=60, stale=False))
    return fleet, FleetStatus("big", 0.0, 300.0, tuple(nodes), True)


def _power(fleet: Fleet) -> list[RackPower]:
    racks = sorted({str(p["rack"]) for p in fleet.placement.values()})
    return [
        RackPower(r, 52_000.0 if i == 7 else 30_000.0 + i % 10 * 1000, 44_000.0)
        for i, r in enumerate(racks)
    ]


def test_summary_comes_first_and_counts_are_right() -> None:
    fleet, status = _fleet()
    page = render_fleet(status, fleet, _power(fleet))
    assert page.index("<h2>Summary") < page.index('id="heatmap"')
    fails = sum(1 for n in status.nodes if n.verdict == "fail")
    assert f"<td>verdict fail</td><td><b>{fails}</b>" in page
    assert "<td>racks over power budget</td><td><b>1</b>" in page
    assert "<td>drained by gpuforge</td><td><b>" + str(fails) in page
    # No per-node table: the nodes live in one JSON blob the script draws.
    assert page.count("<tr>") < 60


def test_page_is_small_and_self_contained() -> None:
    fleet, status = _fleet()
    page = render_fleet(status, fleet, _power(fleet))
    assert len(page.encode()) < 700_000, len(page)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page


def test_data_blob_places_every_node() -> None:
    fleet, status = _fleet(1000)
    page = render_fleet(status, fleet)
    blob = re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S)
    assert blob
    data: dict[str, Any] = json.loads(blob.group(1))
    cells = [c for su in data["sus"] for r in su["racks"] for c in r["cells"]]
    assert len(cells) == 1000
    drained = data["states"].index("drained")
    assert ["gpu00001", drained, "gpu.xid reboot gpuforge:gpu.xid:reboot"] in cells
    assert [r["name"] for r in data["sus"][0]["racks"]][:2] == ["r0001", "r0002"]


def test_a_node_name_cannot_close_the_script() -> None:
    page = render_heatmap("t", [Cell("</script><b>x", "r1", "SU 1", "", "pass")])
    assert "</script><b>x" not in page


def test_unknown_state_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown cell state"):
        render_heatmap("t", [Cell("n", "r1", "SU 1", "", "broken")])


def _chromium() -> str:
    path = shutil.which("chromium")
    assert path, "chromium not found: run make system-deps"
    return path


def test_chromium_draws_12500_nodes(tmp_path: Path) -> None:
    fleet, status = _fleet()
    page = tmp_path / "fleet.html"
    page.write_text(render_fleet(status, fleet, _power(fleet)), encoding="utf-8")
    cmd = [
        _chromium(),
        "--headless",
        "--no-sandbox",  # the tests run as root in a container
        "--disable-gpu",
        "--no-first-run",
        "--proxy-server=127.0.0.1:9",  # no network, should the page try to reach one
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=10000",
        "--dump-dom",
        page.as_uri(),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    # Drawn by the page's script: the count it wrote, and one element per node.
    assert f'data-cells="{NODES}"' in dom, dom[-2000:]
    assert dom.count('class="c"') == NODES
    assert dom.count('class="leaf"') == len(set(fleet.leaves.values()))
    assert 'class="rack hot"' in dom


class _Prometheus(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        query = self.path
        if "budget" in query:
            result = [
                {"metric": {"rack": "r001"}, "value": [0, "44000"]},
                {"metric": {"rack": "r002"}, "value": [0, "44000"]},
            ]
        else:
            result = [{"metric": {"rack": "r001"}, "value": [0, "50400"]}]
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Prometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_rack_power_from_prometheus(prometheus: str) -> None:
    power = rack_power_from_prometheus(prometheus, "lab")
    assert power == [RackPower("r001", 50400.0, 44000.0), RackPower("r002", None, 44000.0)]
    assert power[0].ratio == pytest.approx(50400 / 44000)


def test_prometheus_unreachable_is_one_error() -> None:
    with pytest.raises(OperationError, match=r"Prometheus http://127.0.0.1:9: gpuforge:rack"):
        rack_power_from_prometheus("http://127.0.0.1:9", "lab", timeout=2)


def test_fleet_status_html_through_the_cli(tmp_path: Path, prometheus: str) -> None:
    root = tmp_path / "lab"
    write_cluster_inventory(load_cluster(LAB), root)
    with HistoryStore.open(history_path(tmp_path, "lab")) as store:
        store.ingest([record("gpu01", at=T0)])
        store.ingest([record("gpu03", at=T0, verdict="fail", failed=(("gpu.xid", "reboot"),))])
    out = tmp_path / "out" / "fleet.html"
    args = ["fleet", "status", "--inventory", str(root), "--state-dir", str(tmp_path)]
    result = CliRunner().invoke(
        main, [*args, "--no-slurm", "--html", str(out), "--prometheus", prometheus]
    )
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert "<td>verdict fail</td><td><b>1</b>" in page
    assert "r001" in page and "50.4 / 44.0 kW" in page
    assert '"gpu03",' in page
    result = CliRunner().invoke(
        main, [*args, "--no-slurm", "--html", str(out), "--prometheus", "http://127.0.0.1:9"]
    )
    assert result.exit_code == 1
    assert "Prometheus http://127.0.0.1:9" in result.output and "Traceback" not in result.output
