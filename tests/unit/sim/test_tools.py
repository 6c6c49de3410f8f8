"""The simulated tools, run as subprocesses: healthy output, each fault, and the real parsers.

Node roles in examples/faults-all.yaml: gpu001 healthy, gpu002 GPU 3 missing, gpu003 memory
faults, gpu004 assorted GPU faults, gpu005 IB port faults, gpu006 slow NIC on rail 0,
gpu007 software faults, gpu008 fabric manager down.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuforge.validate.parsers import PARSERS

from .conftest import SIM_DIR, VERSIONS, Runner, real, sim_env


def parse(kind: str, text: str) -> Any:
    return PARSERS[kind](text)


def same_shape(sim: Any, ref: Any, skip: frozenset[str] = frozenset()) -> None:
    """Every field the real sample fills is filled by the simulator too, with the same type."""
    for f in dataclasses.fields(ref):
        if f.name in skip:
            continue
        a, b = getattr(sim, f.name), getattr(ref, f.name)
        if b is not None:
            assert a is not None, f.name
            assert type(a) is type(b), f.name


# ---- nvidia-smi ----------------------------------------------------------------------------


def test_nvidia_smi_q_healthy_matches_real_h100(sim: Runner) -> None:
    out = sim("gpu001", "nvidia-smi", "-q")
    assert out.returncode == 0, out.stdout
    mine = parse("nvidia-smi-q", out.stdout)
    ref = parse("nvidia-smi-q", real("nvidia-smi/gpud-h100-8gpu-q-535.161.08.txt"))
    assert mine.driver_version == "570.133.20"
    assert mine.cuda_version == "12.8"
    assert mine.attached_gpus == len(mine.gpus) == ref.attached_gpus == 8
    assert not mine.warnings
    for g, r in zip(mine.gpus, ref.gpus, strict=True):
        same_shape(g, r, frozenset({"fields"}))
        assert g.product_name == r.product_name
        assert g.memory_total_mib == r.memory_total_mib
        assert g.pcie_gen_current == r.pcie_gen_current == 5
        assert g.remapped_rows.bank_availability == r.remapped_rows.bank_availability
        assert g.clocks_event_reasons_active == ()


def test_nvidia_smi_xml_matches_real_layout(sim: Runner) -> None:
    out = sim("gpu003", "nvidia-smi", "-q", "-x")
    assert out.returncode == 0
    mine = parse("nvidia-smi-xml", out.stdout)
    ref = parse("nvidia-smi-xml", real("nvidia-smi/telegraf-a100-sxm4-80gb-mig-q-x.xml.txt"))
    same_shape(mine.gpus[0], ref.gpus[0], frozenset({"fields"}))
    by_minor = {g.minor_number: g for g in mine.gpus}
    assert by_minor[1].ecc_volatile.dram_uncorrectable == 2
    assert by_minor[2].remapped_rows.pending is True
    assert by_minor[4].remapped_rows.failure_occurred is True
    assert by_minor[0].remapped_rows.pending is False


def test_query_gpu_csv_every_real_field(sim: Runner) -> None:
    ref_text = real("nvidia-smi/nge-h100-80gb-hbm3-query-gpu-csv-load.txt")
    fields = ",".join(c.split(" [")[0] for c in ref_text.splitlines()[0].split(", "))
    out = sim("gpu004", "nvidia-smi", f"--query-gpu={fields}", "--format=csv")
    assert out.returncode == 0, out.stdout
    mine = parse("nvidia-smi-csv", out.stdout)
    ref = parse("nvidia-smi-csv", ref_text)
    assert [c.name for c in mine.columns] == [c.name for c in ref.columns]
    assert out.stdout.splitlines()[0] == ref_text.splitlines()[0]


def test_query_gpu_csv_faults(sim: Runner) -> None:
    out = sim(
        "gpu004",
        "nvidia-smi",
        "--query-gpu=index,pcie.link.gen.current,pcie.link.width.current,"
        "clocks_throttle_reasons.hw_thermal_slowdown,temperature.gpu",
        "--format=csv,noheader,nounits",
    )
    rows = [r.split(", ") for r in out.stdout.splitlines()]
    assert rows[0][3] == "Active" and int(rows[0][4]) > 85
    assert rows[1][1:3] == ["4", "8"]
    assert rows[2][1:4] == ["5", "16", "Not Active"]


def test_query_gpu_rejects_unknown_field(sim: Runner) -> None:
    out = sim("gpu001", "nvidia-smi", "--query-gpu=bogus.field", "--format=csv")
    assert out.returncode == 2
    assert 'Field "bogus.field" is not a valid field to query.' in out.stdout


def test_gpu_missing_shows_fewer_gpus(sim: Runner) -> None:
    listing = sim("gpu002", "nvidia-smi", "-L")
    lines = listing.stdout.splitlines()
    assert lines[0] == "Unable to determine the device handle for GPU0000:5D:00.0: Unknown Error"
    assert len([ln for ln in lines if ln.startswith("GPU ")]) == 7
    report = parse("nvidia-smi-xml", sim("gpu002", "nvidia-smi", "-q", "-x").stdout)
    assert report.attached_gpus == 7
    assert "00000000:5D:00.0" not in {g.pci_bus_id for g in report.gpus}


def test_throttle_and_pcie_in_q(sim: Runner) -> None:
    report = parse("nvidia-smi-q", sim("gpu004", "nvidia-smi", "-q").stdout)
    g0, g1 = report.gpus[0], report.gpus[1]
    assert any("Thermal" in r for r in g0.clocks_event_reasons_active)
    assert (g1.pcie_gen_current, g1.pcie_width_current) == (4, 8)
    assert (g1.pcie_gen_max, g1.pcie_width_max) == (5, 16)


def test_fabric_state_when_fabric_manager_is_down(sim: Runner) -> None:
    report = parse("nvidia-smi-q", sim("gpu008", "nvidia-smi", "-q").stdout)
    assert {g.fabric_state for g in report.gpus} == {"In Progress"}


def test_topo_and_nvlink_show_a_down_link(sim: Runner) -> None:
    topo = sim("gpu004", "nvidia-smi", "topo", "-m").stdout
    assert topo.startswith("\t\x1b[4mGPU0\t")
    parsed = parse("nvidia-smi-topo", topo)
    assert len(parsed.gpus) == 8
    assert "NV17" in topo and "NIC Legend:" in topo
    nvl = parse("nvlink", sim("gpu004", "nvidia-smi", "nvlink", "-s").stdout)
    g6 = nvl.gpus[6]
    assert [ln.link for ln in g6.links if not ln.active] == [4]
    assert all(ln.active for ln in nvl.gpus[0].links)


def test_driver_version_comes_from_the_installed_package(sim: Runner) -> None:
    old = dict(VERSIONS, **{"nvidia-driver-cuda": "570.124.06-1"})
    old["nvidia-kernel-open-dkms"] = "570.124.06-1"
    assert (
        "DRIVER version      : 570.124.06"
        in sim("gpu001", "nvidia-smi", "--version", versions=old).stdout
    )
    mismatch = dict(VERSIONS, **{"nvidia-kernel-open-dkms": "570.124.06-1"})
    out = sim("gpu001", "nvidia-smi", "-L", versions=mismatch)
    assert out.returncode != 0
    assert "Driver/library version mismatch" in out.stdout
    none = {k: v for k, v in VERSIONS.items() if not k.startswith("nvidia")}
    out = sim("gpu001", "nvidia-smi", versions=none)
    assert "couldn't communicate with the NVIDIA driver" in out.stdout


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("nvidia-smi", ["--version"]),
        ("nvidia-smi", ["-h"]),
        ("dcgmi", ["--version"]),
        ("ibstat", ["-V"]),
        ("ib_write_bw", ["--version"]),
        ("all_reduce_perf", ["-h"]),
        ("gpu_burn", ["-h"]),
        ("nv-fabricmanager", ["--version"]),
    ],
)
def test_every_tool_says_it_is_simulated(sim: Runner, tool: str, args: list[str]) -> None:
    assert "gpuforge lab simulator, not NVIDIA" in sim("gpu001", tool, *args).stdout


# ---- dcgmi -------------------------------------------------------------------------------


def test_dcgmi_r2_healthy_matches_real_layout(sim: Runner) -> None:
    out = sim("gpu001", "dcgmi", "diag", "-r", "2")
    assert out.returncode == 0
    mine = parse("dcgmi", out.stdout)
    ref = parse("dcgmi", real("dcgmi/awsome-p4de-a100-80gb-dcgmi-diag-r2-pass.txt"))
    assert [(t.category, t.name) for t in mine.tests] == [(t.category, t.name) for t in ref.tests]
    assert {t.status for t in mine.tests} == {"Pass"}
    assert mine.driver_version == "570.133.20"
    assert mine.gpu_device_ids == ("2330",) * 8
    assert all(len(line) == 78 for line in out.stdout.splitlines()[1:])


def test_dcgmi_row_remap_pending_fails_deployment(sim: Runner) -> None:
    out = sim("gpu003", "dcgmi", "diag", "-r", "2", "-j")
    assert out.returncode == 1
    diag = parse("dcgmi", out.stdout)
    remap = next(t for t in diag.tests if t.name == "Page Retirement/Row Remap")
    assert remap.status == "Fail"
    assert any("row remappings are pending" in w for w in (*remap.warnings, *remap.errors))


def test_dcgmi_r3_json_faults(sim: Runner) -> None:
    diag = parse("dcgmi", sim("gpu004", "dcgmi", "diag", "-r", "3", "-j").stdout)
    status = {t.name: {r.gpu: r.status for r in t.results} for t in diag.tests}
    assert status["Memory Bandwidth"][2] == "Fail"
    assert status["Memory Bandwidth"][0] == "Pass"
    assert status["PCIe"][1] == status["PCIe"][6] == "Fail"
    assert status["Targeted Stress"][0] == "Fail"
    assert status["Diagnostic"][7] == "Fail"
    assert diag.gpu_device_ids == ("2330",) * 8


# ---- InfiniBand ------------------------------------------------------------------------------


def test_ibstat_healthy_matches_real_cx7(sim: Runner) -> None:
    mine = parse("ibstat", sim("gpu001", "ibstat").stdout)
    ref = parse("ibstat", real("ib/gpud-ibstat-h100-node-cx7-ndr400-ib-bf3-bond.txt"))
    assert len(mine.cas) == 8
    same_shape(mine.cas[0].ports[0], ref.cas[0].ports[0])
    assert {(p.state, p.physical_state, p.rate_gbps) for ca in mine.cas for p in ca.ports} == {
        ("Active", "LinkUp", 400.0)
    }


def test_ibstat_port_faults(sim: Runner) -> None:
    cas = {ca.name: ca.ports[0] for ca in parse("ibstat", sim("gpu005", "ibstat").stdout).cas}
    assert (cas["mlx5_0"].state, cas["mlx5_0"].physical_state) == ("Down", "Disabled")
    assert (cas["mlx5_1"].state, cas["mlx5_1"].physical_state) == ("Down", "Polling")
    assert (cas["mlx5_2"].state, cas["mlx5_2"].rate_gbps) == ("Active", 200.0)
    missing = sim("gpu005", "ibstat", "mlx5_9")
    assert missing.returncode == 255 and "ibpanic" in missing.stderr


def test_ibv_devinfo_port_down(sim: Runner) -> None:
    hcas = parse("ibv_devinfo", sim("gpu005", "ibv_devinfo").stdout).hcas
    assert [h.ports[0].state for h in hcas[:3]] == ["Down", "Down", "Active"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_bw(state_dir: Any, tmp_path: Any, server: str, client: str) -> tuple[str, str]:
    port = str(_free_port())
    run = tmp_path / "run"
    srv = subprocess.Popen(
        [
            sys.executable,
            "-S",
            "-m",
            "gpuforge_sim",
            "ib_write_bw",
            "-d",
            "mlx5_0",
            "-p",
            port,
            "--report_gbits",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=sim_env(state_dir / f"{server}.json", run),
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            cli = subprocess.run(
                [
                    sys.executable,
                    "-S",
                    "-m",
                    "gpuforge_sim",
                    "ib_write_bw",
                    "-d",
                    "mlx5_0",
                    "-p",
                    port,
                    "--report_gbits",
                    "127.0.0.1",
                ],
                capture_output=True,
                text=True,
                timeout=60,
                env=sim_env(state_dir / f"{client}.json", run),
                check=False,
            )
            if cli.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        out, _ = srv.communicate(timeout=60)
    finally:
        srv.kill()
    assert cli.returncode == 0, cli.stderr
    return out, cli.stdout


def test_ib_write_bw_healthy_and_slow_nic(state_dir: Any, tmp_path: Any) -> None:
    server_out, client_out = _write_bw(state_dir, tmp_path, "gpu001", "gpu003")
    assert "Waiting for client to connect" in server_out
    healthy = parse("ib_write_bw", client_out)
    ref = parse("ib_write_bw", real("ib/superbench-ib_write_bw-loopback-8M.txt"))
    same_shape(healthy, ref, frozenset({"rows", "sides", "unit"}))
    assert parse("ib_write_bw", server_out).rows
    bw = healthy.max_bw_average_gbps
    assert 380 <= bw <= 400  # ~ 390 Gb/s on NDR 400G
    _, slow_out = _write_bw(state_dir, tmp_path, "gpu006", "gpu001")
    slow = parse("ib_write_bw", slow_out)
    assert slow.max_bw_average_gbps == pytest.approx(bw / 2, rel=0.05)


def test_ib_write_bw_client_without_server(sim: Runner) -> None:
    out = sim("gpu001", "ib_write_bw", "-d", "mlx5_0", "-p", str(_free_port()), "127.0.0.1")
    assert out.returncode == 1
    assert "Couldn't connect to 127.0.0.1" in out.stderr


def test_ib_write_bw_on_a_down_port(sim: Runner) -> None:
    out = sim("gpu005", "ib_write_bw", "-d", "mlx5_0", "127.0.0.1")
    assert out.returncode == 1 and "state is Down" in out.stderr


# ---- gpu-burn, kernel log, modules, fabric manager ----------------------------------------


def test_gpu_burn_faulty_exits_zero(sim: Runner) -> None:
    out = sim("gpu004", "gpu_burn", "5")
    assert out.returncode == 0  # as the real one (wilicc/gpu-burn #12)
    burn = parse("gpu-burn", out.stdout)
    assert burn.tested == 8
    assert {g.index: g.verdict for g in burn.gpus}[7] == "FAULTY"
    assert {g.verdict for g in burn.gpus if g.index != 7} == {"OK"}


def test_dmesg_shows_xids(sim: Runner) -> None:
    lost = parse("xid", sim("gpu002", "dmesg").stdout)
    assert [(x.xid, x.pci) for x in lost.xids] == [(79, "0000:5d:00")]
    mem = parse("xid", sim("gpu003", "dmesg", "-x", "--time-format", "iso").stdout)
    assert sorted(x.xid for x in mem.xids) == [48, 63, 64]
    assert sim("gpu001", "dmesg").stdout == ""
    flaps = sim("gpu005", "dmesg", "-T").stdout
    assert flaps.count("ib3: Link down") == 3


def test_lsmod_and_modprobe_peermem(sim: Runner) -> None:
    assert "nvidia_peermem" not in sim("gpu001", "lsmod").stdout
    assert sim("gpu001", "modprobe", "nvidia-peermem").returncode == 0
    mods = sim("gpu001", "lsmod").stdout
    assert "\nnvidia_peermem " in mods and "\nnvidia " in mods
    failed = sim("gpu007", "modprobe", "nvidia_peermem")
    assert failed.returncode == 1 and "could not insert" in failed.stdout
    assert "nvidia_peermem" not in sim("gpu007", "lsmod").stdout


def test_fabric_manager_fault(sim: Runner) -> None:
    out = sim("gpu008", "nv-fabricmanager")
    assert out.returncode == 1
    nccl = sim("gpu008", "all_reduce_perf", "-g", "8")
    assert nccl.returncode == 1
    assert "system not yet initialized" in nccl.stdout


def test_fabric_manager_fault_stops_a_running_daemon(
    state_dir: Any, tmp_path: Path, cluster_info: dict[str, Any]
) -> None:
    """A fault loaded while FM runs makes it exit 1 (unit failed) without a restart."""
    from gpuforge_sim.faults import node_state, validate_fault_doc  # noqa: PLC0415

    state = tmp_path / "gpu001.json"
    state.write_text((state_dir / "gpu001.json").read_text())
    env = sim_env(state, tmp_path / "run")
    env["GPUFORGE_SIM_FM_POLL"] = "0.1"
    proc = subprocess.Popen(
        [sys.executable, "-S", "-m", "gpuforge_sim", "nv-fabricmanager"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        # Running once it says so (its start-up check is past): a fixed sleep raced a slow start.
        assert proc.stdout is not None
        assert "Successfully configured" in proc.stdout.readline()
        time.sleep(0.3)  # a few polls
        assert proc.poll() is None  # healthy: it keeps running
        doc = validate_fault_doc(
            {"faults": [{"node": "gpu001", "kind": "fabricmanager_down"}], "time_scale": 0}
        )
        state.write_text(json.dumps(node_state(doc, cluster_info, "gpu001")))
        _out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "Fabric Manager is exiting" in err


# ---- nccl-tests ----------------------------------------------------------------------------


def test_all_reduce_single_node_healthy_h100(sim: Runner) -> None:
    out = sim("gpu001", "all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "8")
    assert out.returncode == 0
    mine = parse("nccl-tests", out.stdout)
    ref = parse("nccl-tests", real("nccl-tests/a3mega-h100-2node-16gpu-all_reduce_perf.txt"))
    assert mine.layout == ref.layout
    assert len(mine.ranks) == 8 and mine.hosts == ("gpu001",)
    assert mine.rows[0].size_bytes == 8 and mine.rows[-1].size_bytes == 8 * 1024**3
    assert 455 <= mine.rows[-1].out_of_place.busbw_gbps <= 490  # NVLS ~ 480 GB/s
    assert mine.rows[0].out_of_place.busbw_gbps < 1  # small sizes are latency-bound
    assert mine.out_of_bounds_ok is True and mine.wrong_total == 0
    avg = sum(r.out_of_place.busbw_gbps + r.in_place.busbw_gbps for r in mine.rows)
    assert mine.avg_busbw_gbps == pytest.approx(avg / (2 * len(mine.rows)), abs=0.02)


@pytest.mark.parametrize("coll", ["all_gather", "alltoall", "sendrecv"])
def test_other_collectives_parse(sim: Runner, coll: str) -> None:
    out = sim("gpu001", f"{coll}_perf", "-b", "1M", "-e", "1G", "-f", "4", "-g", "8", "-c", "0")
    result = parse("nccl-tests", out.stdout)
    assert result.rows and result.avg_busbw_gbps and result.avg_busbw_gbps > 50


def test_nccl_missing_gpu_fails_like_cuda(sim: Runner) -> None:
    out = sim("gpu002", "all_reduce_perf", "-g", "8")
    assert out.returncode == 1
    assert "invalid device ordinal" in out.stdout


def _two_node(
    state_dir: Any, tmp_path: Any, nodes: tuple[str, str], extra: dict[str, str] | None = None
) -> list[str]:
    """Two processes, one per "node", with the SLURM_* variables srun would set."""
    procs = []
    for procid, host in enumerate(nodes):
        env = sim_env(state_dir / f"{host}.json", tmp_path / "run")
        env.update(
            {
                "SLURM_PROCID": str(procid),
                "SLURM_LOCALID": "0",
                "SLURM_NTASKS": "2",
                "SLURM_NNODES": "2",
                "SLURM_JOB_NODELIST": ",".join(nodes),
                **(extra or {}),
            }
        )
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-S",
                    "-m",
                    "gpuforge_sim",
                    "all_reduce_perf",
                    "-b",
                    "256M",
                    "-e",
                    "8G",
                    "-f",
                    "2",
                    "-g",
                    "8",
                ],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        outs.append(out)
    return outs


def test_degraded_node_lowers_multi_node_busbw(state_dir: Any, tmp_path: Any) -> None:
    healthy, other = _two_node(state_dir, tmp_path, ("gpu001", "gpu003"))
    assert other == ""  # only rank 0 prints
    base = parse("nccl-tests", healthy)
    assert base.hosts == ("gpu001", "gpu003") and len(base.ranks) == 16
    assert 340 <= base.rows[-1].out_of_place.busbw_gbps <= 380  # 8 x 400G rails
    slow = parse("nccl-tests", _two_node(state_dir, tmp_path, ("gpu001", "gpu005"))[0])
    assert slow.avg_busbw_gbps < base.avg_busbw_gbps * 0.8
    # NCCL's channels split the data evenly and wait for the slowest: gpu006's half-rate NIC on
    # rail 0 would halve the busbw, but this pair also crosses leaf-su01-r1's quarter-rate uplink
    # on rail 1, and the slowest rail sets the pace of all eight.
    nic = parse("nccl-tests", _two_node(state_dir, tmp_path, ("gpu006", "gpu001"))[0])
    top, nic_top = base.rows[-1].out_of_place.busbw_gbps, nic.rows[-1].out_of_place.busbw_gbps
    assert nic_top == pytest.approx(top / 4, rel=0.05)


def test_slow_uplink_only_across_leaves(state_dir: Any, tmp_path: Any) -> None:
    same_leaf = parse("nccl-tests", _two_node(state_dir, tmp_path, ("gpu001", "gpu003"))[0])
    cross = parse("nccl-tests", _two_node(state_dir, tmp_path, ("gpu001", "gpu006"))[0])
    # gpu001 (SU 1) and gpu006 (SU 2) meet through the spine; leaf-su01-r1's uplink is slow
    # and gpu006 also has a slow NIC on rail 0.
    assert cross.avg_busbw_gbps < same_leaf.avg_busbw_gbps * 0.95


def test_state_file_override_is_required_outside_the_lab() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFORGE_SIM")}
    env["PYTHONPATH"] = str(SIM_DIR)
    env["GPUFORGE_SIM_STATE"] = "/nonexistent/state.json"
    env["GPUFORGE_SIM_VERSIONS"] = json.dumps(VERSIONS)
    out = subprocess.run(
        [sys.executable, "-S", "-m", "gpuforge_sim", "nvidia-smi", "-L"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert out.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in out.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
def test_nvidia_modprobe_creates_one_device_file_per_gpu(sim: Runner, tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    env = {"GPUFORGE_SIM_DEV_DIR": str(dev)}
    assert sim("gpu001", "nvidia-modprobe", env=env).returncode == 0
    assert sorted(p.name for p in dev.iterdir()) == [
        *(f"nvidia{i}" for i in range(8)),
        "nvidiactl",
    ]
    ctl = (dev / "nvidiactl").stat()
    assert stat.S_ISCHR(ctl.st_mode)
    assert (os.major(ctl.st_rdev), os.minor(ctl.st_rdev)) == (195, 255)
    assert os.minor((dev / "nvidia7").stat().st_rdev) == 7
    assert sim("gpu001", "nvidia-modprobe", "-c", "3", env=env).returncode == 0  # exists: no-op


def _top(state_dir: Any, tmp_path: Any, nodes: tuple[str, str], hca: str | None) -> float:
    extra = {"NCCL_IB_HCA": hca} if hca is not None else None
    out = parse("nccl-tests", _two_node(state_dir, tmp_path, nodes, extra)[0])
    return float(out.rows[-1].out_of_place.busbw_gbps)


def test_nccl_ib_hca_limits_a_run_to_one_rail(state_dir: Any, tmp_path: Any) -> None:
    """Per-rail tests (``NCCL_IB_HCA==mlx5_R``) measure that rail alone, at one NIC's pace."""
    healthy = ("gpu001", "gpu003")
    every = _top(state_dir, tmp_path, healthy, None)
    one = _top(state_dir, tmp_path, healthy, "=mlx5_4")
    assert one == pytest.approx(every / 8, rel=0.06)  # before: the all-rail figure
    # gpu006's rail-0 NIC runs at half rate: only its own rail shows it, other rails do not
    pair = ("gpu006", "gpu003")
    slow_rail = _top(state_dir, tmp_path, pair, "=mlx5_0")
    good_rail = _top(state_dir, tmp_path, pair, "=mlx5_2")
    assert slow_rail == pytest.approx(good_rail / 2, rel=0.06)
    assert good_rail == pytest.approx(one, rel=0.06)
    # the pair crosses leaves: rail 1 goes through leaf-su01-r1's quarter-rate uplink
    uplink_rail = _top(state_dir, tmp_path, pair, "=mlx5_1")
    assert uplink_rail == pytest.approx(good_rail / 4, rel=0.06)
    # exclusion and prefix forms; the slowest selected rail sets the pace of the others
    assert _top(state_dir, tmp_path, pair, "^=mlx5_0") == pytest.approx(7 * uplink_rail, rel=0.06)
    assert _top(state_dir, tmp_path, healthy, "mlx5") == pytest.approx(every, rel=0.06)


def test_hca_selects_follows_nccls_syntax() -> None:
    from gpuforge_sim.perf import hca_selects  # noqa: PLC0415

    assert hca_selects(None, "mlx5_3")
    assert hca_selects("mlx5", "mlx5_3")
    assert hca_selects("mlx5_1", "mlx5_10")  # a prefix, as in NCCL
    assert not hca_selects("=mlx5_1", "mlx5_10")
    assert hca_selects("=mlx5_1:1,mlx5_2:1", "mlx5_1")
    assert not hca_selects("^=mlx5_1", "mlx5_1")
    assert hca_selects("^=mlx5_1", "mlx5_2")
