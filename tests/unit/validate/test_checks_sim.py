"""The node checks against the lab simulator's output for every GPU fault class.

The simulator (lab/sim) prints the real tools' formats from a fault file; this runs the tools as
each node of lab/sim/examples with faults-all.yaml and asserts that the checks flag exactly the
faulty nodes, for the right reason. It is the unit-level half of the lab accuracy test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpuforge_sim.faults import load_fault_file, node_state

from gpuforge.validate import checks
from gpuforge.validate.parsers import ibstat, nvidia_smi_csv, nvidia_smi_xml, nvlink

ROOT = Path(__file__).resolve().parents[3]
SIM = ROOT / "lab" / "sim"
EXAMPLES = SIM / "examples"
NODES = ["gpu001", "gpu002", "gpu003", "gpu004", "gpu005"]
VERSIONS = {  # what the lab installs, as dpkg would report it
    "nvidia-driver-cuda": "570.133.20-1",
    "nvidia-kernel-open-dkms": "570.133.20-1",
    "libnccl2": "2.26.2-1+cuda12.8",
    "datacenter-gpu-manager-4-core": "1:4.2.3-1",
}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    info = json.loads((EXAMPLES / "cluster-info.json").read_text())
    doc = load_fault_file(EXAMPLES / "faults-all.yaml")
    doc["time_scale"] = 0.0
    tmp = tmp_path_factory.mktemp("sim")
    script = (
        "import sys\nfrom gpuforge_sim.cli import run\n"
        "for spec in sys.argv[1:]:\n"
        "    tool, *args = spec.split(' ')\n"
        "    print('@@@' + spec, flush=True)\n"
        "    try:\n        run(tool, args)\n    except SystemExit:\n        pass\n"
    )
    tools = [
        f"nvidia-smi --query-gpu={checks.GPU_QUERY} --format=csv",
        "nvidia-smi -q -x",
        "nvidia-smi nvlink -s",
        "ibstat",
        "dmesg",
    ]
    out: dict[str, dict[str, str]] = {}
    for host in NODES:
        state = tmp / f"{host}.json"
        state.write_text(json.dumps(node_state(doc, info, host)))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NCCL_"))}
        env.update(
            PYTHONPATH=str(SIM),
            GPUFORGE_SIM_STATE=str(state),
            GPUFORGE_SIM_RUN=str(tmp / "run"),
            GPUFORGE_SIM_REAL_DMESG="/nonexistent",
            GPUFORGE_SIM_VERSIONS=json.dumps(VERSIONS),
        )
        proc = subprocess.run(
            [sys.executable, "-S", "-c", script, *tools],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            check=False,
        )
        parts = proc.stdout.split("@@@")[1:]
        out[host] = {p.split("\n", 1)[0]: p.split("\n", 1)[1] for p in parts}
    return out


def verdicts(o: dict[str, str]) -> dict[str, bool]:
    csv = nvidia_smi_csv.parse(o[f"nvidia-smi --query-gpu={checks.GPU_QUERY} --format=csv"])
    xml = nvidia_smi_xml.parse(o["nvidia-smi -q -x"])
    rails = [{"device": f"mlx5_{r}", "rate_gbps": 400} for r in range(8)]
    ports = checks.ib_ports(
        ibstat.parse(o["ibstat"]), rails, rate_gbps=400, link_layer="InfiniBand"
    )
    return {
        "count": checks.gpu_count(csv, 8).ok,
        "model": checks.gpu_models(csv, "H100-SXM-80GB").ok,
        "ecc_enabled": checks.ecc_enabled(xml).ok,
        "ecc_unc": checks.no_uncorrectable_ecc(xml).ok,
        "remap": checks.row_remap_healthy(xml).ok,
        "persistence": checks.persistence_enabled(xml).ok,
        "pcie": checks.pcie_link(xml).ok,
        "throttle": checks.no_throttling(xml).ok,
        "nvlink": checks.nvlink_all_up(nvlink.parse(o["nvidia-smi nvlink -s"]), gpus=8).ok,
        "xid": checks.no_hardware_xids(o["dmesg"]).ok,
        "ib": all(outcome.ok for _, outcome in ports),
    }


def failing(o: dict[str, str]) -> set[str]:
    return {k for k, ok in verdicts(o).items() if not ok}


def test_healthy_node_passes_everything(outputs: dict[str, dict[str, str]]) -> None:
    assert failing(outputs["gpu001"]) == set()


def test_gpu_missing(outputs: dict[str, dict[str, str]]) -> None:
    bad = failing(outputs["gpu002"])
    assert "count" in bad
    assert "xid" in bad  # Xid 79


def test_ecc_and_row_remap(outputs: dict[str, dict[str, str]]) -> None:
    bad = failing(outputs["gpu003"])
    assert {"ecc_unc", "remap", "xid"} <= bad
    assert "ib" not in bad


def test_xid_nvlink_throttle_pcie(outputs: dict[str, dict[str, str]]) -> None:
    bad = failing(outputs["gpu004"])
    assert {"xid", "nvlink", "throttle", "pcie"} <= bad
    assert "count" not in bad


def test_ib_port_faults(outputs: dict[str, dict[str, str]]) -> None:
    bad = failing(outputs["gpu005"])
    assert bad == {"ib"}
    rails = [{"device": f"mlx5_{r}", "rate_gbps": 400} for r in range(8)]
    ports = dict(
        checks.ib_ports(
            ibstat.parse(outputs["gpu005"]["ibstat"]), rails, rate_gbps=400, link_layer="InfiniBand"
        )
    )
    assert not ports["mlx5_0"].ok  # down
    assert not ports["mlx5_1"].ok  # polling
    assert not ports["mlx5_2"].ok  # 200 Gb/s
    assert ports["mlx5_4"].ok


# --- PCIe generation, power cap (issue 22: faults only DCGM used to see) ---------------------


def _xml_of(tmp_path: Path, faults: list[dict[str, object]]) -> nvidia_smi_xml.NvidiaSmiReport:
    from simlab import run_tool, state  # noqa: PLC0415

    proc = run_tool(state(faults, "gpu001", tmp_path), "nvidia-smi", "-q", "-x")
    return nvidia_smi_xml.parse(proc.stdout)


def test_pcie_generation_below_the_node_type_fails(tmp_path: Path) -> None:
    fault = {"node": "gpu001", "kind": "pcie_downtrained", "gpu": 2, "gen": 3, "width": 16}
    report = _xml_of(tmp_path, [fault])
    # before, only the width was compared, so gen 3 x16 passed; now the generation counts too,
    # against the node type's, or (without one) the device's maximum
    assert not checks.pcie_link(report).ok
    outcome = checks.pcie_link(report, gen=5, width=16)
    assert not outcome.ok
    assert not outcome.warn_only
    assert "00000000:3A:00.0 gen3<gen5" in outcome.detail
    assert checks.pcie_link(_xml_of(tmp_path, []), gen=5, width=16).ok


def test_pcie_width_below_the_node_type_fails(tmp_path: Path) -> None:
    fault = {"node": "gpu001", "kind": "pcie_downtrained", "gpu": 0, "gen": 5, "width": 8}
    outcome = checks.pcie_link(_xml_of(tmp_path, [fault]), gen=5, width=16)
    assert not outcome.ok
    assert "x8<x16" in outcome.detail


def _power_samples(tmp_path: Path, faults: list[dict[str, object]], n: int = 3) -> list[object]:
    from simlab import run_tool, state  # noqa: PLC0415

    st = state(faults, "gpu001", tmp_path)
    text = "".join(
        run_tool(st, "nvidia-smi", f"--query-gpu={checks.POWER_QUERY}", "--format=csv").stdout
        for _ in range(n)
    )
    return [nvidia_smi_csv.parse(block) for block in checks.split_csv_samples(text)]


def test_gpu_held_at_its_power_cap_is_a_finding(tmp_path: Path) -> None:
    fault = {"node": "gpu001", "kind": "throttle", "gpu": 4, "reason": "power"}
    samples = _power_samples(tmp_path, [fault])
    assert len(samples) == 3
    outcome = checks.power_cap_held(samples)  # type: ignore[arg-type]
    assert not outcome.ok
    assert outcome.detail.startswith("GPU 4 (00000000:9A:00.0): SW Power Cap in 3/3 samples")
    # the throttle check alone still calls a power cap benign
    xml = _xml_of(tmp_path, [fault])
    assert checks.no_throttling(xml).ok


def test_healthy_gpus_are_not_held_at_a_power_cap(tmp_path: Path) -> None:
    assert checks.power_cap_held(_power_samples(tmp_path, [])).ok  # type: ignore[arg-type]


def test_idle_gpu_below_its_generation_is_only_a_warning(tmp_path: Path) -> None:
    from dataclasses import replace  # noqa: PLC0415

    fault = {"node": "gpu001", "kind": "pcie_downtrained", "gpu": 2, "gen": 3, "width": 16}
    report = _xml_of(tmp_path, [fault])
    idle = replace(
        report,
        gpus=tuple(replace(g, clocks_event_reasons_active=("gpu_idle",)) for g in report.gpus),
    )
    outcome = checks.pcie_link(idle, gen=5, width=16)
    assert not outcome.ok
    assert outcome.warn_only
    assert "while idle" in outcome.detail
    # a link that cannot reach the generation at all fails even when idle
    capped = replace(idle, gpus=tuple(replace(g, pcie_gen_max=4) for g in idle.gpus))
    assert not checks.pcie_link(capped, gen=5, width=16).warn_only
