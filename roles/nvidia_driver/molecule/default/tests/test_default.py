"""Verify the nvidia_driver role on the Molecule instance: one fact per test."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

VERSION = "570.133.20"
PACKAGES = ["nvidia-driver-cuda", "nvidia-kernel-open-dkms"]
# Installed as dependencies of nvidia-driver-cuda at the same version; they match the role's
# pin patterns (nvidia-*), so they are held with the driver.
DEPENDENCIES = ["nvidia-modprobe", "nvidia-persistenced"]


def _dpkg(host, field, name):
    return host.check_output(f"dpkg-query -W -f='${{{field}}}' {name}")


@pytest.mark.parametrize("name", PACKAGES + DEPENDENCIES)
def test_package_at_exact_version(host, name):
    assert _dpkg(host, "Version", name).startswith(f"{VERSION}-")


@pytest.mark.parametrize("name", PACKAGES + DEPENDENCIES)
def test_package_held(host, name):
    assert _dpkg(host, "db:Status-Want", name) == "hold"


def test_previous_version_not_left_held(host):
    held = host.check_output("apt-mark showhold").split()
    assert sorted(held) == sorted(PACKAGES + DEPENDENCIES)


def test_every_held_package_is_at_the_pinned_version(host):
    held = host.check_output("apt-mark showhold").split()
    versions = {name: _dpkg(host, "Version", name).split("-")[0] for name in held}
    assert versions == dict.fromkeys(held, VERSION)


def test_pin_file(host):
    assert (
        f"Pin: version {VERSION}-*"
        in host.file("/etc/apt/preferences.d/gpuforge-nvidia-driver.pref").content_string
    )


@pytest.mark.parametrize("name", PACKAGES)
def test_pin_sets_candidate(host, name):
    policy = host.check_output(f"apt-cache policy {name}")
    assert f"Candidate: {VERSION}-1" in policy


@pytest.mark.parametrize("name", PACKAGES)
def test_pin_priority(host, name):
    policy = host.check_output(f"apt-cache policy {name}")
    assert f"{VERSION}-1 1001" in " ".join(policy.replace("*", " ").split())


def test_upgrade_leaves_driver_alone(host):
    simulated = host.check_output("apt-get -s -o Debug::NoLocking=1 dist-upgrade")
    assert not [line for line in simulated.splitlines() if line.startswith("Inst nvidia")]


def test_source_is_deb822_with_signed_by(host):
    content = host.file("/etc/apt/sources.list.d/nvidia-cuda.sources").content_string
    assert "Signed-By: /etc/apt/keyrings/nvidia-cuda.asc" in content.splitlines()


def test_keyring_is_the_mirror_key(host):
    assert (
        host.file("/etc/apt/keyrings/nvidia-cuda.asc").content_string
        == host.file("/srv/lab-mirror/gpuforge-lab.asc").content_string
    )


@pytest.mark.parametrize("module", ["nvidia", "nvidia_uvm", "nvidia_peermem"])
def test_module_loaded_at_boot(host, module):
    assert (
        module in host.file("/etc/modules-load.d/nvidia-gpuforge.conf").content_string.splitlines()
    )


def test_no_module_options_file_by_default(host):
    assert not host.file("/etc/modprobe.d/nvidia-gpuforge.conf").exists


def test_reboot_required_after_version_change(host):
    assert host.file("/var/run/reboot-required").exists


def test_reboot_reason_records_versions(host):
    assert (
        f"nvidia-driver 570.124.06 -> {VERSION}"
        in host.file("/var/run/reboot-required.pkgs").content_string
    )


def test_persistenced_enabled(host):
    assert host.service("nvidia-persistenced").is_enabled


def test_persistenced_running(host):
    assert host.service("nvidia-persistenced").is_running


def test_nvidia_smi_reports_pinned_driver(host):
    out = host.check_output("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert set(out.split()) == {VERSION}
