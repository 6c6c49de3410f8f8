"""Verify the nccl role on the Molecule instance: one fact per test."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

VERSION = "2.26.2-1+cuda12.8"


@pytest.mark.parametrize("name", ["libnccl2", "libnccl-dev"])
def test_package_at_exact_version(host, name):
    assert host.package(name).version == VERSION


@pytest.mark.parametrize("name", ["libnccl2", "libnccl-dev", "nccl-tests"])
def test_package_held(host, name):
    assert host.check_output(f"dpkg-query -W -f='${{db:Status-Want}}' {name}") == "hold"


def test_pin_file(host):
    assert (
        f"Pin: version {VERSION}"
        in host.file("/etc/apt/preferences.d/gpuforge-nccl.pref").content_string
    )


@pytest.mark.parametrize("name", ["libnccl2", "libnccl-dev"])
def test_pin_sets_candidate(host, name):
    assert f"Candidate: {VERSION}" in host.check_output(f"apt-cache policy {name}")


def test_header_matches_version(host):
    assert "#define NCCL_MINOR 26" in host.file("/usr/include/nccl.h").content_string


@pytest.mark.parametrize(
    "binary", ["all_reduce_perf", "all_gather_perf", "alltoall_perf", "sendrecv_perf"]
)
def test_nccl_tests_binary(host, binary):
    assert host.file(f"/usr/bin/{binary}").mode & 0o111


def _nccl_conf(host):
    lines = host.file("/etc/nccl.conf").content_string.splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_nccl_conf_from_fabric(host):
    assert _nccl_conf(host) == {
        "NCCL_IB_HCA": "=mlx5_0,mlx5_1",
        "NCCL_SOCKET_IFNAME": "=ib0",
        "NCCL_IB_QPS_PER_CONNECTION": "1",
    }


def test_nccl_expectations_match_conf(host):
    expected = json.loads(host.file("/etc/gpuforge/expected/nccl.json").content_string)
    assert expected["settings"] == _nccl_conf(host)
