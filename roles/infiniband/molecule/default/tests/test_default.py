"""Verify rdma + infiniband + nccl configure against the scenario's inventory variables."""

from __future__ import annotations

import configparser
import json
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

VARS = yaml.safe_load((Path(__file__).parents[1] / "molecule.yml").read_text())["provisioner"][
    "inventory"
]["group_vars"]["all"]
RAILS = VARS["gpu_node_type"]["rails"]
ADDRESSES = VARS["gpuforge_rail_addresses"]
LINKS = [dict(rail, address=address) for rail, address in zip(RAILS, ADDRESSES, strict=True)]
MTU = 4092  # datagram mode default
NETDEV_SYSCTLS = {"rp_filter": "2", "arp_ignore": "2", "arp_announce": "1"}
GC_THRESH = {"gc_thresh1": "4096", "gc_thresh2": "8192", "gc_thresh3": "16384"}


def _ini(host, path: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(host.file(path).content_string)
    return parser


def _keyvalues(host, path: str) -> dict[str, str]:
    out = {}
    for line in host.file(path).content_string.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def _json(host, path: str) -> dict:
    return json.loads(host.file(path).content_string)


@pytest.mark.parametrize(
    "name", ["rdma-core", "ibverbs-utils", "infiniband-diags", "perftest", "opensm"]
)
def test_package_installed(host, name):
    assert host.package(name).is_installed


@pytest.mark.parametrize("module", ["mlx5_core", "mlx5_ib", "ib_umad", "ib_uverbs", "rdma_ucm"])
def test_rdma_module_loaded_at_boot(host, module):
    lines = host.file("/etc/modules-load.d/gpuforge-rdma.conf").content_string.splitlines()
    assert module in lines


def test_ipoib_module_loaded_at_boot(host):
    lines = host.file("/etc/modules-load.d/gpuforge-infiniband.conf").content_string.splitlines()
    assert "ib_ipoib" in lines


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_memlock_unlimited_for_sessions(host, kind):
    content = host.file("/etc/security/limits.d/91-gpuforge-rdma.conf").content_string
    assert ["*", kind, "memlock", "unlimited"] in [line.split() for line in content.splitlines()]


def test_memlock_unlimited_for_services(host):
    conf = _ini(host, "/etc/systemd/system.conf.d/91-gpuforge-rdma.conf")
    assert conf["Manager"]["DefaultLimitMEMLOCK"] == "infinity"


def test_rdma_naming_keeps_kernel_names(host):
    content = host.file("/etc/udev/rules.d/60-rdma-persistent-naming.rules").content_string
    # The file's comments explain why NAME_FALLBACK is replaced; only its rules must not use it.
    rules = [line for line in content.splitlines() if line.strip() and not line.startswith("#")]
    assert any('PROGRAM="/lib/udev/rdma_rename %k NAME_KERNEL"' in rule for rule in rules)
    assert not [rule for rule in rules if "NAME_FALLBACK" in rule]


@pytest.mark.parametrize("link", LINKS, ids=[link["netdev"] for link in LINKS])
def test_ipoib_interface_rendered(host, link):
    conf = _ini(host, f"/etc/systemd/network/30-gpuforge-{link['netdev']}.network")
    assert conf["Match"]["Name"] == link["netdev"]
    assert conf["Network"]["Address"] == link["address"]
    assert conf["Link"]["MTUBytes"] == str(MTU)
    assert conf["IPoIB"]["Mode"] == "datagram"


def test_networkd_enabled(host):
    assert host.service("systemd-networkd").is_enabled


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (f"-net.ipv4.conf.{link['netdev']}.{name}", value)
        for link in LINKS
        for name, value in NETDEV_SYSCTLS.items()
    ]
    + [(f"net.ipv4.neigh.default.{name}", value) for name, value in GC_THRESH.items()],
)
def test_sysctl_rendered(host, key, value):
    assert _keyvalues(host, "/etc/sysctl.d/90-gpuforge-infiniband.conf")[key] == value


def test_opensm_master_priority(host):
    lines = host.file("/etc/opensm/opensm.conf").content_string.splitlines()
    assert "sm_priority 15" in lines


def test_opensm_binds_all_ports(host):
    assert 'PORTS="ALL"' in host.file("/etc/default/opensm").content_string.splitlines()


def test_opensm_enabled(host):
    assert host.service("opensm").is_enabled


def test_expected_rails(host):
    rails = _json(host, "/etc/gpuforge/expected/fabric.json")["rails"]
    assert rails == [
        {
            "rail": link["rail"],
            "device": link["device"],
            "netdev": link["netdev"],
            "address": link["address"],
            "rate_gbps": link["rate_gbps"],
            "mtu": MTU,
            "link_layer": "InfiniBand",
        }
        for link in LINKS
    ]


def test_expected_sysctls_match_file(host):
    expected = _json(host, "/etc/gpuforge/expected/fabric.json")["sysctls"]
    rendered = _keyvalues(host, "/etc/sysctl.d/90-gpuforge-infiniband.conf")
    assert {key.lstrip("-"): value for key, value in rendered.items()} == {
        key: str(value) for key, value in expected.items()
    }


def test_expected_devices(host):
    devices = _json(host, "/etc/gpuforge/expected/rdma.json")["devices"]
    assert [(d["device"], d["netdev"]) for d in devices] == [
        (r["device"], r["netdev"]) for r in RAILS
    ]


def test_nccl_conf_values(host):
    assert _keyvalues(host, "/etc/nccl.conf") == {
        "NCCL_IB_HCA": "=" + ",".join(rail["device"] for rail in RAILS),
        "NCCL_SOCKET_IFNAME": "=" + RAILS[0]["netdev"],
        "NCCL_IB_QPS_PER_CONNECTION": "1",
    }


def test_nccl_expectations_match_conf(host):
    expected = _json(host, "/etc/gpuforge/expected/nccl.json")["settings"]
    assert _keyvalues(host, "/etc/nccl.conf") == expected
