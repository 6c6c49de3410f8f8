"""Verify the dcgm_exporter role on the Molecule instance: one fact per test."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

COUNTERS = "/etc/dcgm-exporter/gpuforge-counters.csv"
DROPIN = "/etc/systemd/system/nvidia-dcgm-exporter.service.d/gpuforge.conf"


def test_package_installed(host):
    assert host.package("datacenter-gpu-manager-exporter").is_installed


def test_package_held(host):
    package = "datacenter-gpu-manager-exporter"
    status = host.check_output(f"dpkg-query -W -f='${{db:Status-Want}}' {package}")
    assert status == "hold"


@pytest.mark.parametrize(
    "field",
    [
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
    ],
)
def test_counter_listed(host, field):
    rows = [line.split(",")[0] for line in host.file(COUNTERS).content_string.splitlines()]
    assert field in rows


def test_dropin_runs_the_counters_file_on_9400(host):
    lines = host.file(DROPIN).content_string.splitlines()
    assert f"ExecStart=/usr/bin/dcgm-exporter -f {COUNTERS} -a :9400 -c 30000" in lines


def test_service_running(host):
    assert host.service("nvidia-dcgm-exporter").is_running


def test_metrics_page_answers(host):
    code = host.check_output(
        "curl -s -o /dev/null -w '%{http_code}' --max-time 10 http://127.0.0.1:9400/metrics"
    )
    assert code == "200"
