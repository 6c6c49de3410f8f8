"""Verify rdma + roce + nccl configure against the scenario's inventory variables."""

from __future__ import annotations

import configparser
import ipaddress
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
IDS = [link["netdev"] for link in LINKS]
MTU = 9000
PRIORITY, DSCP, CNP_PRIORITY, CNP_DSCP = 3, 26, 6, 48
TOS = DSCP << 2 | 2  # ECT(0)
GID_INDEX = 3
SCRIPT = "/usr/local/sbin/gpuforge-roce-qos"
NETDEV_SYSCTLS = {"rp_filter": "2", "arp_ignore": "2", "arp_announce": "1"}


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


@pytest.fixture(scope="module")
def qos_plan(host) -> list[str]:
    """The actions the boot-time QoS script takes, as it prints them with --dry-run."""
    result = host.run(f"{SCRIPT} --dry-run")
    assert result.rc == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.parametrize("name", ["rdma-core", "ibverbs-utils", "perftest", "iproute2"])
def test_package_installed(host, name):
    assert host.package(name).is_installed


def test_dcb_tool_available(host):
    assert host.run("dcb help").rc in (0, 255)


@pytest.mark.parametrize("link", LINKS, ids=IDS)
def test_rail_interface_rendered(host, link):
    conf = _ini(host, f"/etc/systemd/network/30-gpuforge-{link['netdev']}.network")
    assert conf["Match"]["Name"] == link["netdev"]
    assert conf["Network"]["Address"] == link["address"]
    assert conf["Link"]["MTUBytes"] == str(MTU)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (f"-net.ipv4.conf.{link['netdev']}.{name}", value)
        for link in LINKS
        for name, value in NETDEV_SYSCTLS.items()
    ],
)
def test_sysctl_rendered(host, key, value):
    assert _keyvalues(host, "/etc/sysctl.d/90-gpuforge-roce.conf")[key] == value


@pytest.mark.parametrize("link", LINKS, ids=IDS)
def test_pfc_only_on_roce_priority(qos_plan, link):
    assert f"run: dcb pfc set dev {link['netdev']} prio-pfc all:off {PRIORITY}:on" in qos_plan


@pytest.mark.parametrize("link", LINKS, ids=IDS)
def test_dscp_trusted_and_mapped(qos_plan, link):
    line = (
        f"run: dcb app replace dev {link['netdev']} dscp-prio "
        f"{DSCP}:{PRIORITY} {CNP_DSCP}:{CNP_PRIORITY}"
    )
    assert line in qos_plan


@pytest.mark.parametrize("link", LINKS, ids=IDS)
@pytest.mark.parametrize("point", ["roce_np", "roce_rp"])
def test_ecn_enabled_on_roce_priority(qos_plan, link, point):
    path = f"/sys/class/net/{link['netdev']}/ecn/{point}/enable/{PRIORITY}"
    assert f"write-if-present: {path} = 1" in qos_plan


@pytest.mark.parametrize("link", LINKS, ids=IDS)
def test_rdma_cm_tos(qos_plan, link):
    path = f"/sys/kernel/config/rdma_cm/{link['device']}/ports/1/default_roce_tos"
    assert f"write: {path} = {TOS}" in qos_plan


@pytest.mark.parametrize("link", LINKS, ids=IDS)
def test_rdma_cm_roce_v2(qos_plan, link):
    path = f"/sys/kernel/config/rdma_cm/{link['device']}/ports/1/default_roce_mode"
    assert f"write: {path} = RoCE v2" in qos_plan


@pytest.mark.parametrize("link", LINKS, ids=IDS)
def test_gid_index_checked_against_rail_address(qos_plan, link):
    packed = ipaddress.IPv4Interface(link["address"]).ip.packed.hex()
    gid = f"0000:0000:0000:0000:0000:ffff:{packed[:4]}:{packed[4:]}"
    path = f"/sys/class/infiniband/{link['device']}/ports/1/gids/{GID_INDEX}"
    assert f"check: {path} = {gid} (RoCE v2)" in qos_plan


def test_qos_unit_enabled(host):
    assert host.service("gpuforge-roce-qos").is_enabled


def test_qos_unit_skipped_without_rdma_devices(host):
    conf = _ini(host, "/etc/systemd/system/gpuforge-roce-qos.service")
    assert conf["Unit"]["ConditionPathIsDirectory"] == "/sys/class/infiniband"
    assert conf["Service"]["ExecStart"] == SCRIPT


def test_expected_rails(host):
    rails = _json(host, "/etc/gpuforge/expected/fabric.json")["rails"]
    assert [(r["netdev"], r["address"], r["mtu"], r["link_layer"]) for r in rails] == [
        (link["netdev"], link["address"], MTU, "Ethernet") for link in LINKS
    ]


def test_expected_qos(host):
    qos = _json(host, "/etc/gpuforge/expected/fabric.json")["qos"]
    assert (qos["trust"], qos["pfc_priorities"], qos["dscp"], qos["traffic_class"]) == (
        "dscp",
        [PRIORITY],
        DSCP,
        TOS,
    )


def test_nccl_conf_values(host):
    assert _keyvalues(host, "/etc/nccl.conf") == {
        "NCCL_IB_HCA": "=" + ",".join(rail["device"] for rail in RAILS),
        "NCCL_SOCKET_IFNAME": "=" + RAILS[0]["netdev"],
        "NCCL_IB_QPS_PER_CONNECTION": "4",
        "NCCL_IB_GID_INDEX": str(GID_INDEX),
        "NCCL_IB_TC": str(TOS),
    }


def test_nccl_agrees_with_fabric(host):
    nccl = _keyvalues(host, "/etc/nccl.conf")
    qos = _json(host, "/etc/gpuforge/expected/fabric.json")["qos"]
    assert (nccl["NCCL_IB_GID_INDEX"], nccl["NCCL_IB_TC"]) == (
        str(qos["gid_index"]),
        str(qos["traffic_class"]),
    )


@pytest.mark.parametrize("link", LINKS, ids=IDS)
def test_expected_state_records_the_rail_file(host, link):
    data = _json(host, "/etc/gpuforge/expected/state/roce.json")
    assert f"/etc/systemd/network/30-gpuforge-{link['netdev']}.network" in data["files"]
