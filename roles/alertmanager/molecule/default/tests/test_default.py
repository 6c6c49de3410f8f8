"""Verify the alertmanager role on the Molecule instance: one fact per test."""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SINK = "/var/lib/gpuforge/alerts/alerts.jsonl"


def test_package_installed(host):
    assert host.package("prometheus-alertmanager").is_installed


def test_config_passes_amtool(host):
    host.run_expect([0], "amtool check-config /etc/prometheus/alertmanager.yml")


@pytest.mark.parametrize("severity", ["critical", "warning", "info"])
def test_route_per_severity(host, severity):
    config = host.file("/etc/prometheus/alertmanager.yml").content_string
    assert f"matchers: ['severity=\"{severity}\"']" in config


@pytest.mark.parametrize("service", ["prometheus-alertmanager", "gpuforge-alert-sink"])
def test_service_running(host, service):
    assert host.service(service).is_running


def test_an_alert_reaches_the_sink_on_its_route(host):
    alert = [{"labels": {"alertname": "MoleculeProbe", "severity": "warning", "node": "node01"}}]
    host.run_expect(
        [0],
        "curl -sf --max-time 10 -X POST -H 'Content-Type: application/json' "
        f"-d '{json.dumps(alert)}' http://127.0.0.1:9093/api/v2/alerts",
    )
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline:
        text = host.run(f"cat {SINK}").stdout
        seen = [json.loads(line)["payload"] for line in text.splitlines() if line.strip()]
        if any(p["commonLabels"].get("alertname") == "MoleculeProbe" for p in seen):
            break
        time.sleep(2)
    probe = [p for p in seen if p["commonLabels"].get("alertname") == "MoleculeProbe"]
    assert probe, seen
    assert probe[0]["receiver"] == "warning"


def test_expected_state_records_the_config(host):
    data = json.loads(host.file("/etc/gpuforge/expected/state/alertmanager.json").content_string)
    assert "/etc/prometheus/alertmanager.yml" in data["files"]
