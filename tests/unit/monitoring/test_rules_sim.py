"""The rules on the simulated dcgm-exporter's own output: what the lab serves is what they read.

The lab simulator's dcgm-exporter (lab/sim/gpuforge_sim/dcgm_exporter.py) prints dcgm-exporter's
names and labels for a node's faults. Its ``/metrics`` text, with the file_sd labels a target gets,
becomes promtool input series; the alerts must name the faulted GPUs, and a healthy node must
raise none of the GPU alerts.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from gpuforge_sim.dcgm_exporter import COUNTERS_CSV
from gpuforge_sim.faults import load_fault_file, node_state

from gpuforge.monitoring import rules

from ..sim.conftest import EXAMPLES, VERSIONS, sim_env
from .test_rules import _promtool, _write_rules

#: The file_sd labels of gpu001 in examples/topologies/lab.yaml (gpuforge.monitoring.targets).
TARGET = {
    "cluster": "lab",
    "su": "1",
    "rack": "r001",
    "leaf": "leaf-su01-r0",
    "node_type": "h100-sxm",
    "phase": "1",
    "node": "gpu001",
    "instance": "gpu001:9400",
    "job": "dcgm",
}
SERIES = re.compile(r"^(DCGM_FI_\w+)\{(.*)\} (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
#: Alerts whose expression reads dcgm-exporter's series.
GPU_ALERTS = [
    a.name
    for a in rules.alerts()
    if "DCGM_FI_DEV" in a.expr or a.name in ("RackPowerOverBudget", "GpuPowerAboveLimit")
]


def _metrics(tmp_path: Path, faults: list[dict[str, Any]]) -> str:
    doc_path = tmp_path / "faults.yaml"
    doc_path.write_text(yaml.safe_dump({"version": 1, "time_scale": 0.0, "faults": faults}))
    info = json.loads((EXAMPLES / "cluster-info.json").read_text())
    state = tmp_path / "state.json"
    state.write_text(json.dumps(node_state(load_fault_file(doc_path), info, "gpu001")))
    csv = tmp_path / "counters.csv"
    csv.write_text(COUNTERS_CSV)
    proc = subprocess.run(
        [sys.executable, "-S", "-m", "gpuforge_sim", "dcgm-exporter", "-f", str(csv), "--once"],
        env=sim_env(state, tmp_path / "run", VERSIONS),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _series(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        m = SERIES.match(line)
        if m:
            labels = dict(LABEL.findall(m.group(2)))
            out.append((m.group(1), {**labels, **TARGET}, float(m.group(3))))
    assert out, text[:500]
    return out


def _selector(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _run_promtool(
    tmp_path: Path, series: list[tuple[str, dict[str, str], float]], cases: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    _write_rules(tmp_path)
    test = {
        "rule_files": [rules.ALERTS_FILE, rules.RECORDS_FILE],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": _selector(n, labels), "values": f"{v:g}x25"}
                    for n, labels, v in series
                ],
                "alert_rule_test": cases,
            }
        ],
    }
    (tmp_path / "sim.test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    return subprocess.run(
        [_promtool(), "test", "rules", "sim.test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _gpu_labels(series: list[tuple[str, dict[str, str], float]], gpu: str) -> dict[str, str]:
    return next(labels for n, labels, _ in series if n == "DCGM_FI_DEV_XID_ERRORS" and
                labels["gpu"] == gpu)  # fmt: skip


def _expect(name: str, labels: dict[str, str], summary: str, **extra: str) -> dict[str, Any]:
    alert = next(a for a in rules.alerts() if a.name == name)
    return {
        "exp_labels": {**labels, "severity": alert.severity, **alert.labels, **extra},
        "exp_annotations": {
            "summary": summary,
            "runbook_url": f"{rules.RUNBOOK_BASE}/{name}.md",
        },
    }


def test_faulted_gpus_raise_their_alerts(tmp_path: Path) -> None:
    series = _series(
        _metrics(
            tmp_path,
            [
                {"node": "gpu001", "kind": "xid", "gpu": 1, "code": 79},
                {"node": "gpu001", "kind": "throttle", "gpu": 0, "reason": "thermal"},
                {"node": "gpu001", "kind": "row_remap_pending", "gpu": 2},
                {"node": "gpu001", "kind": "power_high", "load": 0.98},
            ],
        )
    )
    gpu0, gpu1, gpu2 = (_gpu_labels(series, g) for g in "012")
    at = "20m"  # past the throttling alert's 15 minutes
    fired = {
        "GpuFellOffBus": [
            _expect(
                "GpuFellOffBus",
                gpu1,
                "GPU 1 on gpu001 (rack r001) fell off the bus (Xid 79) or is missing",
            )
        ],
        # the simulator logs Xid 63 for a pending remap: the catalogue answers reset_gpu
        "GpuXidResetGpu": [
            _expect(
                "GpuXidResetGpu", gpu2, "GPU 2 on gpu001 (rack r001) reported Xid 63: reset_gpu"
            )
        ],
        "GpuRowRemapPending": [
            _expect(
                "GpuRowRemapPending",
                gpu2,
                "GPU 2 on gpu001 (rack r001) has a memory row remap pending a GPU reset",
            )
        ],
        "GpuThermalThrottling": [
            _expect(
                "GpuThermalThrottling",
                gpu0,
                "GPU 0 on gpu001 (rack r001) has been thermally throttled for 15 minutes",
            )
        ],
        "GpuTemperatureHigh": [
            _expect("GpuTemperatureHigh", gpu0, "GPU 0 on gpu001 (rack r001) is at 91 °C")
        ],
    }
    # 98 % of the power limit is not above it, and one node is far from a 44 kW rack budget.
    cases = [
        {"eval_time": at, "alertname": name, "exp_alerts": fired.get(name, [])}
        for name in GPU_ALERTS
    ]
    result = _run_promtool(tmp_path, series, cases)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_a_healthy_node_raises_no_gpu_alert(tmp_path: Path) -> None:
    series = _series(_metrics(tmp_path, []))
    assert {labels["gpu"] for _, labels, _ in series} == {str(i) for i in range(8)}
    cases = [{"eval_time": "20m", "alertname": name, "exp_alerts": []} for name in GPU_ALERTS]
    result = _run_promtool(tmp_path, series, cases)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
