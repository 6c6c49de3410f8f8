"""The passive tier against the lab simulator: a clean node passes, each fault is named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.node.simnode import SimNode


def statuses(node: SimNode, tier: str = "passive") -> dict[str, Any]:
    out = node.run(tier)
    return {c.check: (c.status, c.action) for c in out.record.checks} | {"_record": out.record}


def test_clean_node_passes_every_check(tmp_path: Path) -> None:
    node = SimNode(tmp_path)
    out = node.run()
    bad = {
        c.check: (c.status, c.message)
        for c in out.record.checks
        if c.status not in ("pass", "skip")
    }
    assert bad == {}
    assert out.record.verdict == "pass"
    assert out.record.request is None
    assert out.exit_code == 0
    skipped = {c.check for c in out.record.checks if c.status == "skip"}
    # IB rails only; no collector in this run, so no clock to compare with.
    assert skipped == {"fabric.roce_pfc", "node.clock"}
    assert out.record.counters["ib/mlx5_0/1/symbol_error"] == 0
    # A pass carries no evidence: the record stays small (12,500 nodes every interval).
    assert all(c.evidence == "" for c in out.record.checks)
    assert len(out.record.to_json()) < 8000


#: Faults on distinct GPUs and rails, so one node run shows several; each maps to the check
#: that must flag it, with the status and the action.
NODE_A = [
    {"kind": "ecc_uncorrectable", "gpu": 1},
    {"kind": "row_remap_pending", "gpu": 2},
    {"kind": "xid", "gpu": 4, "code": 95},
    {"kind": "nvlink_down", "gpu": 5},
    {"kind": "throttle", "gpu": 6},
    {"kind": "pcie_downtrained", "gpu": 0},
    {"kind": "ib_port_down", "rail": 0},
    {"kind": "link_flap", "rail": 1, "count": 3, "hours": 2},
]
EXPECT_A = {
    "gpu.ecc_uncorrectable": ("fail", "reset_gpu"),
    "gpu.row_remap": ("fail", "reset_gpu"),
    "gpu.xid": ("fail", "reboot"),  # 95 (reset_gpu) and the 74 of nvlink_down (reboot)
    "gpu.nvlink": ("fail", "reboot"),
    "gpu.throttle": ("fail", "inspect"),
    "gpu.pcie_link": ("fail", "inspect"),
    "fabric.port": ("fail", "inspect"),
    "fabric.flaps": ("fail", "inspect"),
    "gpu.count": ("pass", ""),
    "fabric.counters": ("pass", ""),
    "software.versions": ("pass", ""),
}
NODE_B = [
    {"kind": "gpu_missing", "gpu": 3},
    {"kind": "ib_wrong_rate", "rail": 1},
    {"kind": "link_flap", "rail": 0, "count": 1, "hours": 2},
]
EXPECT_B = {
    "gpu.count": ("fail", "reboot"),
    "gpu.xid": ("fail", "reboot"),  # 79 and "fallen off the bus"
    "fabric.port": ("fail", "inspect"),
    "fabric.flaps": ("warn", "monitor"),
}
NODE_C = [{"kind": "row_remap_failure", "gpu": 2}, {"kind": "xid", "gpu": 4, "code": 13}]
EXPECT_C = {
    "gpu.row_remap": ("fail", "reset_gpu"),
    "gpu.xid": ("fail", "reset_gpu"),  # 13 alone warns; the remap failure's Xid 64 fails
    "gpu.count": ("pass", ""),
}


@pytest.mark.parametrize(
    ("faults", "expect"), [(NODE_A, EXPECT_A), (NODE_B, EXPECT_B), (NODE_C, EXPECT_C)]
)
def test_each_fault_fails_its_check_with_its_action(
    tmp_path: Path, faults: list[dict[str, Any]], expect: dict[str, tuple[str, str]]
) -> None:
    out = SimNode(tmp_path, faults).run()
    got = {c.check: (c.status, c.action) for c in out.record.checks}
    assert {k: got[k] for k in expect} == expect
    for c in out.record.checks:
        if c.status == "fail":
            assert c.evidence and len(c.evidence) <= 2000, c.check
    assert out.record.verdict == "fail"
    assert out.record.request is not None and out.record.request.op == "drain"


def test_an_application_xid_warns_and_does_not_drain(tmp_path: Path) -> None:
    out = SimNode(tmp_path, [{"kind": "xid", "gpu": 4, "code": 13}]).run()
    got = out.record.check("gpu.xid")
    assert got is not None
    assert (got.status, got.action) == ("warn", "monitor")
    assert out.record.verdict == "warn"
    assert out.record.request is None
    assert [(e.event, e.code, e.gpu) for e in out.record.events] == [("xid", 13, 4)]


def test_a_stopped_service_fails(tmp_path: Path) -> None:
    node = SimNode(tmp_path)
    node.services["nvidia-fabricmanager"] = "failed"
    node.write()
    got = node.run().record.check("software.services")
    assert got is not None
    assert (got.status, got.action) == ("fail", "reboot")
    assert "nvidia-fabricmanager failed" in got.message


def test_a_version_off_its_pin_and_a_missing_package_fail(tmp_path: Path) -> None:
    node = SimNode(tmp_path)
    node.packages["libnccl2"] = "2.21.5-1+cuda12.4"
    node.packages["nvidia-driver-cuda"] = "550.54.15-1"  # what nvidia-smi reports
    del node.packages["slurmd"]
    node.write()
    got = node.run().record.check("software.versions")
    assert got is not None
    assert got.status == "fail"
    assert "nccl 2.21.5-1+cuda12.4 != 2.26.2" in got.message
    assert "slurm absent != 22.05" in got.message
    assert "driver 550.54.15 != 570.133.20" in got.message


def test_mtu_below_the_declared_one_fails(tmp_path: Path) -> None:
    node = SimNode(tmp_path)
    node.only("fabric.mtu")
    node.set_mtu("ib1", 2044)
    got = node.run().record.check("fabric.mtu")
    assert got is not None
    assert (got.status, got.action) == ("fail", "quarantine")


def test_ipoib_datagram_mode_mtu_passes(tmp_path: Path) -> None:
    node = SimNode(tmp_path)
    node.only("fabric.mtu")
    node.set_mtu("ib0", 4092)  # 4096 less the IPoIB header: datagram mode
    node.set_mtu("ib1", 4092)
    got = node.run().record.check("fabric.mtu")
    assert got is not None
    assert got.status == "pass"


def test_counter_growth_over_the_window_fails_and_a_reset_restarts(tmp_path: Path) -> None:
    node = SimNode(tmp_path)
    node.only("fabric.counters")
    first = node.run().record.check("fabric.counters")
    assert first is not None and first.status == "pass"
    node.set_counter("mlx5_1", "symbol_error", 11)
    second = node.run().record
    got = second.check("fabric.counters")
    assert got is not None
    assert (got.status, got.action) == ("fail", "inspect")
    assert "ib/mlx5_1/1/symbol_error +11 > 10" in str(got.measured)
    assert second.counters["ib/mlx5_1/1/symbol_error"] == 11
    node.set_counter("mlx5_1", "symbol_error", 3)  # reset (driver reload) then 3 new errors
    third = node.run().record.check("fabric.counters")
    assert third is not None and third.status == "pass"


@pytest.mark.parametrize("tool", ["nvidia-smi", "ibstat", "dpkg-query"])
def test_a_missing_tool_is_error_never_fail(tmp_path: Path, tool: str) -> None:
    node = SimNode(tmp_path, [{"kind": "ib_port_down", "rail": 0}])
    node.remove_tool(tool)
    out = node.run()
    errors = {c.check for c in out.record.checks if c.status == "error"}
    assert errors, "a missing tool must show as ERROR"
    for c in out.record.checks:
        if c.status == "error":
            assert "not installed" in c.message
            assert c.action == ""
    if tool != "ibstat":
        assert out.record.check("fabric.port").status == "fail"  # type: ignore[union-attr]


def test_missing_counters_are_error(tmp_path: Path) -> None:
    node = SimNode(tmp_path)
    node.only("fabric.counters")
    node.counter_path("mlx5_0", "port_rcv_errors").unlink()
    got = node.run().record.check("fabric.counters")
    assert got is not None
    assert got.status == "error"
    assert "port_rcv_errors" in got.message


def test_a_hanging_tool_times_out_inside_the_budget(tmp_path: Path) -> None:
    node = SimNode(tmp_path)
    node.hang_tool("ibstat")
    node.extra["tiers"] = {"passive": {"timeout_s": 4}}
    # ibstat first: the time a loaded machine spends in the other tools is not what is tested.
    node.only("fabric.port")
    out = node.run()
    got = out.record.check("fabric.port")
    assert got is not None
    assert got.status == "error"
    assert "timed out" in got.message
    assert out.record.duration_s < 5


def test_roce_pause_frames_warn_in_shadow_and_ecn_is_reported(tmp_path: Path) -> None:
    node = SimNode(tmp_path)
    node.only("fabric.roce_pfc")
    data = node.config_data()
    node.extra["expect"] = dict(data["expect"])
    node.extra["expect"]["rails"] = [
        dict(r, link_layer="Ethernet") for r in data["expect"]["rails"]
    ]
    stats = tmp_path / "ethtool.txt"
    # mlx5's `ethtool -S` names (drivers/net/ethernet/mellanox/mlx5/core/en_stats.c)
    stats.write_text("NIC statistics:\n     rx_prio3_pause: 10\n     tx_prio3_pause: 5\n")
    node._script("ethtool", f"#!/bin/sh\nexec /bin/cat {stats}\n")
    hw = node.counter_path("mlx5_0", "x").parent.with_name("hw_counters")
    hw.mkdir()
    (hw / "np_ecn_marked_roce_packets").write_text("42\n")
    first = node.run().record
    got = first.check("fabric.roce_pfc")
    assert got is not None and got.status == "pass"
    assert first.counters["roce/ib0/pause_frames"] == 15
    assert first.counters["roce/mlx5_0/np_ecn_marked_roce_packets"] == 42
    stats.write_text("NIC statistics:\n     rx_prio3_pause: 2000010\n     tx_prio3_pause: 5\n")
    second = node.run().record
    got = second.check("fabric.roce_pfc")
    assert got is not None
    assert (got.status, got.action, got.shadow) == ("warn", "monitor", True)
    assert second.verdict == "pass"  # shadowed by default
