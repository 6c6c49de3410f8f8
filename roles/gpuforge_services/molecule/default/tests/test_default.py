"""Verify the gpuforge_services role on the Molecule instance: one fact per test."""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

VENV = "/opt/gpuforge/venv"
UNIT = "gpuforge-collector.service"
HEALTHZ = "http://127.0.0.1:9477/v1/healthz"


def _healthz(host) -> dict:
    body = host.check_output(
        f"{VENV}/bin/python -c 'import urllib.request,sys;"
        f'sys.stdout.write(urllib.request.urlopen("{HEALTHZ}", timeout=5).read().decode())\''
    )
    return json.loads(body)


def test_gpuforge_installed_in_its_environment(host):
    out = host.check_output(f"{VENV}/bin/gpuforge --help")
    assert "health" in out


def test_installed_without_an_index(host):
    config = host.run(f"{VENV}/bin/python -m pip config list").stdout
    assert "index-url" not in config
    wheels = host.run("ls /var/cache/gpuforge/wheelhouse").stdout.split()
    assert any(w.startswith("gpuforge-") for w in wheels), wheels


def test_cluster_directory_copied(host):
    assert host.file("/etc/gpuforge/cluster/generated/topology.json").is_file
    assert host.file("/etc/gpuforge/cluster/site/group_vars").is_directory


def test_collector_running_and_enabled(host):
    unit = host.service(UNIT)
    assert unit.is_running
    assert unit.is_enabled


def test_collector_answers_healthz(host):
    assert _healthz(host)["status"] == "ok"


def test_collector_keeps_its_history_under_var_lib(host):
    assert host.file("/var/lib/gpuforge/state").is_directory
    assert host.run("ls /var/lib/gpuforge/state/*/history.db").rc == 0


def test_collector_started_again_after_sigkill(host):
    pid = host.check_output(f"systemctl show --property=MainPID --value {UNIT}")
    host.run_test(f"kill -KILL {pid}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = host.check_output(f"systemctl show --property=MainPID --value {UNIT}")
        active = host.run(f"systemctl is-active {UNIT}").stdout.strip() == "active"
        if now not in ("0", pid) and active:
            break
        time.sleep(1)
    else:
        pytest.fail(f"{UNIT} was not started again after SIGKILL")
    assert _healthz(host)["status"] == "ok"


def test_nightly_ranking_timer_enabled_in_shadow(host):
    assert host.service("gpuforge-risk.timer").is_enabled
    unit = host.file("/etc/systemd/system/gpuforge-risk.service").content_string
    assert "--from-store --policy /etc/gpuforge/predict.yaml" in unit
    policy = host.file("/etc/gpuforge/predict.yaml").content_string
    assert "shadow: false" not in policy
