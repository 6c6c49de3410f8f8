"""Verify the prometheus role on the Molecule instance: one fact per test."""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _api(host, path):
    return json.loads(host.check_output(f"curl -sf --max-time 10 http://127.0.0.1:9090{path}"))


def test_package_installed(host):
    assert host.package("prometheus").is_installed


@pytest.mark.parametrize(
    "path", ["/etc/prometheus/file_sd/node.json", "/etc/prometheus/file_sd/dcgm.json"]
)
def test_file_sd_copied(host, path):
    assert host.file(path).is_file


def test_shipped_rules_installed(host):
    assert host.file("/etc/prometheus/rules/gpuforge-alerts.yml").is_file


def test_config_passes_promtool(host):
    host.run_expect([0], "promtool check config /etc/prometheus/prometheus.yml")


def test_retention_argument(host):
    args = host.file("/etc/default/prometheus").content_string
    assert "--storage.tsdb.retention.time=15d" in args


def test_service_running(host):
    assert host.service("prometheus").is_running


def test_node_target_carries_topology_labels(host):
    deadline = time.monotonic() + 60
    while True:
        targets = _api(host, "/api/v1/targets")["data"]["activeTargets"]
        node = [t for t in targets if t["labels"]["job"] == "node"]
        if node or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert node[0]["labels"]["instance"] == "node01:9100"
    assert node[0]["labels"]["rack"] == "r001"


def test_alert_rules_loaded(host):
    groups = _api(host, "/api/v1/rules")["data"]["groups"]
    assert any(r["type"] == "alerting" for g in groups for r in g["rules"])


def test_expected_state_records_the_service(host):
    data = json.loads(host.file("/etc/gpuforge/expected/state/prometheus.json").content_string)
    assert data["services"] == {"prometheus": {"active": True, "enabled": True}}
