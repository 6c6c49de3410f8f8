"""The acceptance suite itself (validators/) on a simulated node: testinfra's local backend with
the lab simulator's nvidia-smi first on PATH, for the GPU facts issue 22 added."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from simlab import run_gpu_suite


def _suite(tmp_path: Path, faults: list[dict[str, object]], select: str) -> dict[str, dict]:
    out = run_gpu_suite(tmp_path, faults, select)
    return {r["check"]: r for r in json.loads(out.read_text())["results"]}


@pytest.mark.slow
def test_suite_fails_pcie_generation_and_power_cap_with_the_gpu_named(tmp_path: Path) -> None:
    faults = [
        {"node": "gpu001", "kind": "throttle", "gpu": 2, "reason": "power"},
        {"node": "gpu001", "kind": "pcie_downtrained", "gpu": 4, "gen": 3, "width": 16},
    ]
    got = _suite(tmp_path, faults, "pcie or power or throttle")
    assert got["gpu.pcie_link"]["status"] == "fail"
    assert got["gpu.pcie_link"]["message"] == "00000000:9A:00.0 gen3<gen5"
    assert got["gpu.pcie_link"]["evidence"].startswith(
        "00000000:9A:00.0: PCIe gen 3 (max 5) x16 (max x16)"
    )
    assert got["gpu.power_cap"]["status"] == "fail"
    assert got["gpu.power_cap"]["message"].startswith("GPU 2 (00000000:3A:00.0): SW Power Cap")
    assert got["gpu.throttle"]["status"] == "pass"  # a power cap alone stays benign there


@pytest.mark.slow
def test_suite_passes_a_healthy_node(tmp_path: Path) -> None:
    got = _suite(tmp_path, [], "pcie or power or throttle")
    assert {c: r["status"] for c, r in got.items()} == {
        "gpu.pcie_link": "pass",
        "gpu.throttle": "pass",
        "gpu.power_cap": "pass",
    }


@pytest.mark.slow
def test_suite_fails_a_fallen_gpu_with_the_catalogue_action(tmp_path: Path) -> None:
    got = _suite(tmp_path, [{"node": "gpu001", "kind": "xid", "gpu": 3, "code": 79}], "xid")
    xid = got["gpu.xid"]
    assert (xid["status"], xid["action"]) == ("fail", "reboot")
    assert xid["measured"].startswith("79@") and xid["measured"].endswith("=reboot")


@pytest.mark.slow
def test_suite_only_warns_on_an_application_xid(tmp_path: Path) -> None:
    got = _suite(tmp_path, [{"node": "gpu001", "kind": "xid", "gpu": 0, "code": 13}], "xid")
    xid = got["gpu.xid"]
    assert (xid["status"], xid["action"]) == ("warn", "monitor")
