"""Verify the nccl role on the Molecule instance: one fact per test."""

from __future__ import annotations

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
