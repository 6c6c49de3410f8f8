"""Verify the cuda_toolkit role on the Molecule instance: one fact per test."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_toolkit_at_exact_version(host):
    assert host.package("cuda-toolkit-12-8").version == "12.8.1-1"


def test_toolkit_held(host):
    assert host.check_output("dpkg-query -W -f='${db:Status-Want}' cuda-toolkit-12-8") == "hold"


def test_pin_file(host):
    assert (
        "Pin: version 12.8.1-1"
        in host.file("/etc/apt/preferences.d/gpuforge-cuda-toolkit.pref").content_string
    )


def test_usr_local_cuda_points_at_12_8(host):
    assert host.file("/usr/local/cuda").linked_to == "/usr/local/cuda-12.8"


def test_alternative_selected(host):
    assert "link currently points to /usr/local/cuda-12.8" in host.check_output(
        "update-alternatives --display cuda"
    )


def test_nvcc_on_login_path(host):
    out = host.check_output("bash -lc 'command -v nvcc'")
    assert out == "/usr/local/cuda/bin/nvcc"


def test_nvcc_reports_version(host):
    assert "release 12.8" in host.check_output("bash -lc 'nvcc --version'")


@pytest.mark.parametrize("line", ["export CUDA_HOME=/usr/local/cuda"])
def test_profile_environment(host, line):
    assert line in host.file("/etc/profile.d/cuda.sh").content_string.splitlines()


def test_cuda_home_in_login_shell(host):
    assert host.check_output("bash -lc 'echo $CUDA_HOME'") == "/usr/local/cuda"


def test_linker_path(host):
    assert (
        "/usr/local/cuda/lib64"
        in host.file("/etc/ld.so.conf.d/gpuforge-cuda.conf").content_string.splitlines()
    )


def test_gpu_burn_installed_and_held(host):
    pkg = host.package("gpu-burn")
    assert pkg.is_installed
    assert "hold" in host.check_output("dpkg-query -W -f='${db:Status-Want}' gpu-burn")
    assert host.exists("gpu_burn")
