"""Verify the conformance_timer role on the Molecule instance: one fact per test."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.mark.parametrize("unit", ["gpuforge-conformance.service", "gpuforge-conformance.timer"])
def test_unit_is_valid(host, unit):
    # gpuforge itself is installed on the controller by the site, not by this role: the only
    # complaint allowed is that its command is absent from this instance.
    result = host.run(f"systemd-analyze verify /etc/systemd/system/{unit}")
    problems = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if line.strip() and "/gpuforge is not executable" not in line
    ]
    assert problems == []


def test_timer_enabled(host):
    assert host.service("gpuforge-conformance.timer").is_enabled


def test_timer_active(host):
    assert host.check_output("systemctl is-active gpuforge-conformance.timer") == "active"


def test_timer_calendar(host):
    out = host.check_output("systemctl show -p TimersCalendar gpuforge-conformance.timer")
    assert "01:30:00" in out


def test_service_runs_conformance(host):
    unit = host.file("/etc/systemd/system/gpuforge-conformance.service").content_string
    assert "conformance run --inventory /etc/gpuforge/cluster --level quick --via local" in unit


def test_expected_state_recorded(host):
    data = json.loads(
        host.file("/etc/gpuforge/expected/state/conformance_timer.json").content_string
    )
    assert data["services"] == {"gpuforge-conformance.timer": {"active": True, "enabled": True}}
