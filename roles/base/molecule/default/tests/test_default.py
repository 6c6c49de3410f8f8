"""Verify the base role on the Molecule instance: one fact per test."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_chrony_installed(host):
    assert host.package("chrony").is_installed


def test_chrony_enabled(host):
    assert host.service("chrony").is_enabled


def test_chrony_uses_the_inventory_source(host):
    assert (
        "server ctl01.lab.gpuforge.test iburst"
        in host.file("/etc/chrony/chrony.conf").content_string
    )


@pytest.mark.parametrize("line", ["blacklist nouveau", "options nouveau modeset=0"])
def test_nouveau_blacklisted(host, line):
    assert line in host.file("/etc/modprobe.d/blacklist-nouveau.conf").content_string.splitlines()


@pytest.mark.parametrize(
    "line",
    [
        "*     soft  memlock  unlimited",
        "*     hard  memlock  unlimited",
        "*     soft  nofile   1048576",
        "*     hard  nofile   1048576",
    ],
)
def test_pam_limits(host, line):
    assert line in host.file("/etc/security/limits.d/90-gpuforge.conf").content_string.splitlines()


@pytest.mark.parametrize("limit", ["LimitMEMLOCK=infinity", "LimitNOFILE=1048576"])
def test_systemd_default_limits(host, limit):
    assert (
        f"Default{limit}"
        in host.file("/etc/systemd/system.conf.d/90-gpuforge-limits.conf").content_string
    )


@pytest.mark.parametrize("line", ["kernel.numa_balancing = 0", "vm.max_map_count = 1048576"])
def test_sysctl_file(host, line):
    assert line in host.file("/etc/sysctl.d/90-gpuforge.conf").content_string.splitlines()


def test_cpu_governor_unit_enabled(host):
    assert host.service("gpuforge-cpu-governor").is_enabled


def test_cpu_governor_unit_sets_performance(host):
    assert (
        "echo performance"
        in host.file("/etc/systemd/system/gpuforge-cpu-governor.service").content_string
    )


def test_gpudirect_kernel_args_absent_by_default(host):
    assert not host.file("/etc/default/grub.d/90-gpuforge.cfg").exists


@pytest.mark.parametrize(
    "line",
    [
        "10.0.0.1 ctl01.lab.gpuforge.test ctl01",
        "10.0.1.1 gpu01.lab.gpuforge.test gpu01",
        "10.0.1.2 gpu02.lab.gpuforge.test gpu02",
    ],
)
def test_hosts_block(host, line):
    assert line in host.file("/etc/hosts").content_string.splitlines()


def test_hosts_block_marked_once(host):
    assert host.file("/etc/hosts").content_string.count("# BEGIN gpuforge cluster hosts") == 1


def test_hosts_keeps_localhost(host):
    assert host.run("getent hosts localhost").rc == 0


def test_cluster_name_resolves(host):
    assert host.check_output("getent hosts gpu02").split()[0] == "10.0.1.2"


def test_not_marked_for_reboot(host):
    assert not host.file("/var/run/reboot-required").exists
