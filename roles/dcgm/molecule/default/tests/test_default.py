"""Verify the dcgm role on the Molecule instance: one fact per test."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PACKAGES = ["datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda12"]


@pytest.mark.parametrize("name", PACKAGES)
def test_package_at_exact_version(host, name):
    assert host.package(name).version == "1:4.2.3-1"


@pytest.mark.parametrize("name", PACKAGES)
def test_package_held(host, name):
    assert host.check_output(f"dpkg-query -W -f='${{db:Status-Want}}' {name}") == "hold"


def test_pin_file(host):
    assert (
        "Pin: version 1:4.2.3-1"
        in host.file("/etc/apt/preferences.d/gpuforge-dcgm.pref").content_string
    )


def test_hostengine_enabled(host):
    assert host.service("nvidia-dcgm").is_enabled


def test_hostengine_running(host):
    assert host.service("nvidia-dcgm").is_running


@pytest.mark.parametrize(
    ("phase", "level"),
    [("preflight", 1), ("conformance", 2), ("acceptance", 3), ("burnin", 4), ("prolog", 1)],
)
def test_diag_level_per_phase(host, phase, level):
    assert (
        f"  {phase}: {level}"
        in host.file("/etc/gpuforge/dcgm-diag.yml").content_string.splitlines()
    )


def test_diag_config_records_version(host):
    assert (
        'dcgm_version: "4.2.3"'
        in host.file("/etc/gpuforge/dcgm-diag.yml").content_string.splitlines()
    )
