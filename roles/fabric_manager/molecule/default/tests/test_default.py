"""Verify the fabric_manager role on an NVSwitch node type: one fact per test."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_package_matches_driver_version(host):
    assert host.package("nvidia-fabricmanager-570").version == "570.133.20-1"


def test_package_held(host):
    assert (
        host.check_output("dpkg-query -W -f='${db:Status-Want}' nvidia-fabricmanager-570") == "hold"
    )


def test_pin_file(host):
    pref = host.file("/etc/apt/preferences.d/gpuforge-fabric-manager.pref").content_string
    assert "Pin: version 570.133.20-*" in pref


def test_service_enabled(host):
    assert host.service("nvidia-fabricmanager").is_enabled


def test_service_running(host):
    assert host.service("nvidia-fabricmanager").is_running


def test_config_setting_applied(host):
    assert (
        "LOG_LEVEL=3"
        in host.file("/usr/share/nvidia/nvswitch/fabricmanager.cfg").content_string.splitlines()
    )


def test_fabric_manager_reports_driver_version(host):
    assert "570.133.20" in host.check_output("nv-fabricmanager --version")
