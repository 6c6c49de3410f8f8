"""Faults over time: injection stamps, clears_on, GPU reset, reboot, growing counters, sysfs,
the degrading ECC fault and the simulated dcgm-exporter."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from gpuforge_sim.faults import (
    FaultFileError,
    carry_over,
    node_state,
    validate_fault_doc,
)

from gpuforge.validate.parsers import PARSERS, perfquery

from .conftest import SIM_DIR, VERSIONS, sim_env

NOW = 1_800_000_000.0
BOOT = NOW - 7200.0


@pytest.fixture
def node(tmp_path: Path, cluster_info: dict[str, Any]) -> Any:
    """``node(faults, injected=..., boot=..., now=...)`` -> runner of tools on gpu001."""

    def make(faults: list[dict[str, Any]], injected: float = NOW - 600.0) -> Any:
        doc = validate_fault_doc({"faults": [{"node": "gpu001", **f} for f in faults]})
        state = tmp_path / "state.json"
        state.write_text(json.dumps(node_state(doc, cluster_info, "gpu001", now=injected)))

        def run(
            tool: str,
            *args: str,
            now: float = NOW,
            boot: float = BOOT,
            extra: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess[str]:
            env = sim_env(state, tmp_path / "run", VERSIONS)
            env["GPUFORGE_SIM_NOW"] = str(now)
            env["GPUFORGE_SIM_BOOT_TIME"] = str(boot)
            env["GPUFORGE_SIM_SYSFS"] = str(tmp_path / "sys")
            env.update(extra or {})
            return subprocess.run(
                [sys.executable, "-S", "-m", "gpuforge_sim", tool, *args],
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
                check=False,
            )

        return run

    return make


# ---- the fault file ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "clears"),
    [
        ({"kind": "xid", "gpu": 0, "code": 79}, "reboot"),
        ({"kind": "xid", "gpu": 0, "code": 13}, "reset"),
        ({"kind": "xid", "gpu": 0, "code": 64}, "never"),
        ({"kind": "row_remap_pending", "gpu": 0}, "reset"),
        ({"kind": "ecc_uncorrectable", "gpu": 0}, "reset"),
        ({"kind": "gpu_missing", "gpu": 0}, "never"),
        ({"kind": "ib_port_down", "rail": 0}, "never"),
        ({"kind": "fabricmanager_down"}, "reboot"),
        ({"kind": "gpu_missing", "gpu": 0, "clears_on": "reboot"}, "reboot"),
    ],
)
def test_clears_on_defaults_per_kind_and_override(fault: dict[str, Any], clears: str) -> None:
    doc = validate_fault_doc({"faults": [{"node": "n1", **fault}]})
    assert doc["faults"][0]["clears_on"] == clears


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ({"kind": "xid", "gpu": 0, "code": 79, "clears_on": "later"}, "clears_on must be one of"),
        ({"kind": "ib_errors", "rail": 0, "counter": "bogus"}, "counter must be one of"),
        ({"kind": "ecc_degrading", "gpu": 0, "speedup": 0}, "speedup must be >= 1"),
        ({"kind": "power_high", "load": 1.5}, "'load' must be a number in (0, 1]"),
    ],
)
def test_bad_new_fields_are_named(fault: dict[str, Any], message: str) -> None:
    with pytest.raises(FaultFileError, match=re.escape(message)) as err:
        validate_fault_doc({"faults": [{"node": "n1", **fault}]}, "f.yaml")
    assert "f.yaml: faults[0]" in str(err.value)


def test_leaf_faults_take_no_clears_on() -> None:
    with pytest.raises(FaultFileError, match="does not take clears_on"):
        validate_fault_doc({"faults": [{"leaf": "l", "kind": "slow_uplink", "clears_on": "never"}]})


def test_reloading_a_fault_keeps_its_injection_and_new_faults_get_now(
    cluster_info: dict[str, Any],
) -> None:
    xid = {"node": "gpu001", "kind": "xid", "gpu": 1, "code": 79}
    first = node_state(validate_fault_doc({"faults": [xid]}), cluster_info, "gpu001", now=100.0)
    both = validate_fault_doc(
        {"faults": [xid, {"node": "gpu001", "kind": "ib_port_down", "rail": 0}]}
    )
    second = carry_over(node_state(both, cluster_info, "gpu001", now=200.0), first)
    again, new = second["nodes"]["gpu001"]["faults"]
    assert again["injected_at"] == 100.0
    assert again["id"] == first["nodes"]["gpu001"]["faults"][0]["id"]
    assert new["injected_at"] == 200.0


# ---- kernel log ---------------------------------------------------------------------------------


def test_runtime_xid_is_logged_at_its_injection_not_before(node: Any) -> None:
    run = node([{"kind": "xid", "gpu": 2, "code": 79}], injected=NOW - 600.0)
    before = run("dmesg", now=NOW - 700.0).stdout
    assert "Xid" not in before
    out = run("dmesg").stdout
    (line,) = [x for x in out.splitlines() if "Xid" in x]
    stamp = float(line.split("]")[0].strip("[ "))
    assert stamp == pytest.approx(NOW - 600.0 - BOOT, abs=0.01)
    iso = run("dmesg", "--time-format", "iso").stdout
    events = PARSERS["xid"](iso)
    assert [e.xid for e in events.xids] == [79]


def test_a_reboot_empties_the_log_of_faults_it_cleared_and_relogs_lasting_ones(node: Any) -> None:
    run = node([{"kind": "xid", "gpu": 2, "code": 79}, {"kind": "gpu_missing", "gpu": 5}])
    rebooted = NOW - 60.0
    out = run("dmesg", boot=rebooted).stdout
    codes = re.findall(r"Xid \(PCI:[^)]*\): (\d+)", out)
    assert codes == ["79"]  # the missing GPU, found again at init; the cleared Xid is gone
    first = float(out.splitlines()[0].split("]")[0].strip("[ "))
    assert 0 < first < 10


# ---- GPU reset and reboot -----------------------------------------------------------------------


def test_gpu_reset_clears_that_gpus_reset_faults_only(node: Any) -> None:
    run = node(
        [
            {"kind": "row_remap_pending", "gpu": 1},
            {"kind": "row_remap_pending", "gpu": 4},
            {"kind": "nvlink_down", "gpu": 1, "clears_on": "never"},
        ]
    )
    reset = run("nvidia-smi", "-r", "-i", "1")
    assert reset.returncode == 0, reset.stdout
    assert reset.stdout.splitlines() == [
        "GPU 00000000:2A:00.0 was successfully reset.",
        "All done.",
    ]
    q = PARSERS["nvidia-smi-q"](run("nvidia-smi", "-q").stdout)
    pending = {g.minor_number: g.remapped_rows.pending for g in q.gpus}
    assert pending[1] is False and pending[4] is True
    nvlink = run("nvidia-smi", "nvlink", "-s", "-i", "1").stdout
    assert "inactive" in nvlink  # clears_on: never survives the reset


def test_a_lost_gpu_cannot_be_reset(node: Any) -> None:
    run = node([{"kind": "xid", "gpu": 3, "code": 79}])
    reset = run("nvidia-smi", "-r", "-i", "3")
    assert reset.returncode == 15
    assert "GPU is lost. Reboot the system to recover this GPU" in reset.stdout


def test_reboot_clears_reboot_and_reset_faults_but_not_never(node: Any) -> None:
    run = node(
        [
            {"kind": "fabricmanager_down"},
            {"kind": "row_remap_pending", "gpu": 0},
            {"kind": "pcie_downtrained", "gpu": 2, "clears_on": "never"},
        ]
    )
    csv = ("--query-gpu=index,remapped_rows.pending,pcie.link.gen.current,fabric.state",)
    fmt = "--format=csv,noheader"
    before = run("nvidia-smi", *csv, fmt).stdout.splitlines()
    assert before[0].split(", ")[1:] == ["Yes", "5", "In Progress"]
    after = run("nvidia-smi", *csv, fmt, boot=NOW - 30.0).stdout.splitlines()
    assert after[0].split(", ")[1:] == ["No", "5", "Completed"]
    assert after[2].split(", ")[2] == "4"


# ---- counters -----------------------------------------------------------------------------------


def test_ib_error_counters_grow_from_the_injection(node: Any) -> None:
    run = node([{"kind": "ib_errors", "rail": 0, "counter": "symbol_error", "per_hour": 3600}])

    def parse(text: str) -> int:
        return perfquery.parse(text).counters["SymbolErrorCounter"]

    first = parse(run("perfquery", "-C", "mlx5_0", "-P", "1").stdout)
    later = parse(run("perfquery", "-C", "mlx5_0", "-P", "1", now=NOW + 60).stdout)
    assert first == 600
    assert later == 660
    other = parse(run("perfquery", "-C", "mlx5_1", "-P", "1").stdout)
    assert other == 0


def test_sysfs_tree_has_the_kernels_files(node: Any, tmp_path: Path) -> None:
    run = node([{"kind": "ib_port_down", "rail": 1}, {"kind": "link_flap", "rail": 0, "count": 4}])
    done = run("gpuforge-sim-sysfs")
    assert done.returncode == 0, done.stderr
    port = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
    assert (port / "state").read_text() == "4: ACTIVE\n"
    assert (port / "phys_state").read_text() == "5: LinkUp\n"
    assert (port / "rate").read_text() == "400 Gb/sec (4X NDR)\n"
    assert (port / "counters/link_downed").read_text() == "4\n"
    assert int((port / "counters/port_xmit_data").read_text()) > 0
    down = tmp_path / "sys/class/infiniband/mlx5_1/ports/1"
    assert (down / "state").read_text() == "1: DOWN\n"
    assert (down / "phys_state").read_text() == "3: Disabled\n"
    assert (tmp_path / "sys/class/net").is_symlink()
    run("gpuforge-sim-sysfs", now=NOW + 100)
    assert int((port / "counters/port_xmit_data").read_text()) > 0


def test_degrading_ecc_rises_over_simulated_time(node: Any) -> None:
    run = node([{"kind": "ecc_degrading", "gpu": 6, "hours": 1, "peak_per_hour": 600, "rows": 6}])
    q = "--query-gpu=index,ecc.errors.corrected.volatile.total,remapped_rows.correctable"
    values = []
    for t in (NOW - 600 + 900, NOW - 600 + 1800, NOW - 600 + 3600, NOW - 600 + 7200):
        row = run("nvidia-smi", q, "--format=csv,noheader", now=t).stdout.splitlines()[6]
        values.append(tuple(int(x) for x in row.split(", ")[1:]))
    assert values == [(18, 1), (75, 3), (300, 6), (900, 6)]


# ---- dcgm-exporter ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_dcgm_exporter_serves_real_names_and_labels_from_the_faults(
    node: Any, tmp_path: Path
) -> None:
    from gpuforge_sim.dcgm_exporter import COUNTERS_CSV  # noqa: PLC0415

    csv = tmp_path / "counters.csv"
    csv.write_text(COUNTERS_CSV)
    node(
        [
            {"kind": "throttle", "gpu": 0, "reason": "thermal"},
            {"kind": "xid", "gpu": 1, "code": 79},
            {"kind": "power_high", "load": 0.98},
            {"kind": "gpu_missing", "gpu": 7},
        ]
    )
    port = _free_port()
    env = sim_env(tmp_path / "state.json", tmp_path / "run", VERSIONS)
    env.update({"GPUFORGE_SIM_NOW": str(NOW), "GPUFORGE_SIM_BOOT_TIME": str(BOOT)})
    proc = subprocess.Popen(
        [
            sys.executable,
            "-S",
            "-m",
            "gpuforge_sim",
            "dcgm-exporter",
            "-f",
            str(csv),
            "-a",
            f"127.0.0.1:{port}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        text = ""
        for _ in range(50):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
                break
            except OSError:
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert "# TYPE DCGM_FI_DEV_GPU_TEMP gauge" in text
    series = re.findall(
        r'^(DCGM_FI_\w+)\{gpu="(\d)",UUID="GPU-[0-9a-f-]+",pci_bus_id="[0-9A-F:.]+",'
        r'device="nvidia\d",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu001",'
        r'DCGM_FI_DRIVER_VERSION="570.133.20"\} (\S+)$',
        text,
        re.M,
    )
    values = {(name, int(gpu)): float(v) for name, gpu, v in series}
    assert values[("DCGM_FI_DEV_GPU_TEMP", 0)] == 91
    assert values[("DCGM_FI_DEV_XID_ERRORS", 1)] == 79
    assert values[("DCGM_FI_DEV_XID_ERRORS", 2)] == 0
    assert values[("DCGM_FI_DEV_POWER_USAGE", 3)] == pytest.approx(686.0)
    assert values[("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 0)] == 0x48
    assert ("DCGM_FI_DEV_GPU_TEMP", 7) not in values  # fell off the bus: no series
    assert len({gpu for _n, gpu in values}) == 7


def test_dcgm_exporter_refuses_an_unknown_field(node: Any, tmp_path: Path) -> None:
    csv = tmp_path / "c.csv"
    csv.write_text("# comment\nDCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_NOT_A_FIELD, gauge, x\n")
    out = node([])("dcgm-exporter", "-f", str(csv), "--once")
    assert out.returncode == 1
    assert f"{csv}:3: could not find DCGM field 'DCGM_FI_NOT_A_FIELD'" in out.stdout


def test_packages_ship_the_exporter_and_the_sysfs_ticker() -> None:
    sys.path.insert(0, str(SIM_DIR))
    from build_packages import all_packages  # noqa: PLC0415

    pkgs = {p.name: p for p in all_packages()}
    exporter = pkgs["datacenter-gpu-manager-exporter"]
    assert "/usr/bin/dcgm-exporter" in exporter.files
    assert "/etc/dcgm-exporter/default-counters.csv" in exporter.files
    common = pkgs["gpuforge-sim-common"]
    assert "/lib/systemd/system/gpuforge-sim-sysfs.service" in common.files
    assert "--every 5" in common.files["/lib/systemd/system/gpuforge-sim-sysfs.service"][0]
