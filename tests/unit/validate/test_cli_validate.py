"""``gpuforge validate`` end to end through CliRunner, with every collaborator faked."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import FakeRunner, counter_reply, real
from tests.unit.slurm.fake import FakeSlurm

import gpuforge.cli.validate as cli_validate
from gpuforge.cli import main
from gpuforge.command import CommandResult
from gpuforge.slurm.control import SlurmClient
from gpuforge.validate import nccl, pipeline
from gpuforge.validate.acceptance import SuiteRun
from gpuforge.validate.result import BatchSummary, CheckResult, FabricFinding, Level, Status

NODES = [f"gpu{i:02d}" for i in range(1, 9)]
H100_NT = {"name": "h100-sxm", "gpu_model": "H100-SXM-80GB", "gpus": 8, "nvswitch": True}


def topology(tmp: Path) -> Path:
    nodes = [
        {
            "hostname": "ctl01",
            "role": "controller",
            "rack": "svc01",
            "su": 0,
            "phase": 1,
            "mgmt_address": "10.0.0.1",
            "rails": [],
        }
    ]
    for i, n in enumerate(NODES):
        nodes.append(
            {
                "hostname": n,
                "role": "gpu",
                "rack": f"r00{1 + i // 4}",
                "su": 1,
                "phase": 1 + i // 4,
                "mgmt_address": f"10.0.0.{11 + i}",
                "rails": [
                    [r, f"mlx5_{r}", f"ib{r}", f"10.100.{r}.{11 + i}/24", f"leaf-{i // 4}-r{r}", i]
                    for r in range(2)
                ],
            }
        )
    inv = tmp / "inv"  # a cluster directory: its generated layer is all the view reads here
    (inv / "generated").mkdir(parents=True)
    (inv / "generated" / "hosts.yml").write_text('{"all": {}}\n', encoding="utf-8")
    (inv / "generated" / "topology.json").write_text(
        json.dumps({"nodes": nodes, "fabric": {"rate_gbps": 200}}), encoding="utf-8"
    )
    return inv


def hostvars(_: Path) -> dict[str, Any]:
    meta = {n: {"gpu_node_type": H100_NT} for n in NODES}
    meta["ctl01"] = {}
    return {"_meta": {"hostvars": meta}, "slurm_controllers": {"hosts": ["ctl01"]}}


NCCL_OK = real("nccl-tests/azh200doc-h200-8gpu-all_reduce_perf-8G-single-size.txt")
# FP32 gpu-burn on H100s (simulator output: no real H100 capture; the real A100 one ran -d -tc)
BURN_OK = (
    Path(__file__).parents[1] / "fixtures" / "sim" / "gpu_burn-h100-8gpu-60s.txt"
).read_text()
BURN_BAD = real("kernel/gpuburn-issue12-16gpu-faulty-summary.txt")
DCGM_OK = real("dcgmi/awsome-p4de-a100-80gb-dcgmi-diag-r2-pass.txt")
IB_BW = real("ib/superbench-ib_write_bw-loopback-8M.txt")


def suite_with(failing: dict[str, str], unreachable: Sequence[str] = ()):
    def run(inv: Path, hosts: Sequence[str], work: Path) -> SuiteRun:
        results = []
        for h in hosts:
            if h in unreachable:
                results.append(CheckResult(h, "gpu.count", Status.ERROR, message="ssh timeout"))
                continue
            for check in ("gpu.count", "gpu.ecc_enabled", "fabric.port[mlx5_0]"):
                st = Status.FAIL if failing.get(h) == check else Status.PASS
                results.append(CheckResult(h, check, st, measured=7 if st is Status.FAIL else 8))
        return SuiteRun(1 if failing else 0, tuple(results), "", ("pytest",))

    return run


def wiring(
    tmp: Path,
    *,
    failing: dict[str, str] | None = None,
    unreachable: Sequence[str] = (),
    slow_nccl: Sequence[str] = (),
    drained: dict[str, str] | None = None,
    counter_growth: Mapping[tuple[str, str, str], int] | None = None,
    fake: FakeRunner,
) -> tuple[pipeline.Wiring, FakeSlurm]:
    view = pipeline.ClusterView.load(topology(tmp), hostvars)
    fake.on("gpu03", "gpu_burn", BURN_BAD)  # FAULTY GPUs, exit 0
    fake.on("*", "gpu_burn", BURN_OK)
    fake.on("*", "dcgmi diag", DCGM_OK)
    fake.on("*", "ib_write_bw", IB_BW)
    fake.on("*", "all_reduce_perf", NCCL_OK)
    fake.on_call("*", "/sys/class/infiniband/", counter_reply(counter_growth))

    def collective(v: pipeline.ClusterView, nodes: Sequence[str], opts: pipeline.ValidationOptions):
        def run(group: tuple[str, ...]) -> float:
            return 100.0 if set(group) & set(slow_nccl) else 380.0

        leaf = {n: pipeline.fabric_node(v, n).leaf_key for n in nodes}
        loc = nccl.Localizer(run, 320.0, leaf).localize(nodes)
        res = nccl.localization_results(loc, check="nccl.multinode.batch", floor_gbs=320.0)
        return res, list(loc.findings), loc.run_count

    deps = pipeline.ValidationDeps(
        runner=fake,
        run_suite=suite_with(failing or {}, unreachable),
        collective=collective,
        now=lambda: "2026-11-30T00:00:00+00:00",
    )
    drained = drained or {}
    sl = FakeSlurm({n: ("IDLE+DRAIN", drained[n]) if n in drained else ("IDLE", "") for n in NODES})
    return pipeline.Wiring(view, deps, SlurmClient(sl, "ctl01")), sl


def invoke(monkeypatch: pytest.MonkeyPatch, w: pipeline.Wiring, tmp: Path, *args: str):
    monkeypatch.setattr(cli_validate, "wire", lambda *_a, **_k: w)
    return CliRunner().invoke(
        main,
        [
            "validate",
            "--inventory",
            str(tmp / "inv"),
            "--report-dir",
            str(tmp / "out"),
            "--state-dir",
            str(tmp / "state"),
            *args,
        ],
    )


def test_quick_all_pass_exit_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake) -> None:
    w, _ = wiring(tmp_path, fake=fake)
    res = invoke(monkeypatch, w, tmp_path)
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "out" / "validation.json").read_text())
    assert data["counts"] == {"admit": 8, "quarantine": 0, "hold": 0}
    assert (tmp_path / "out" / "junit.xml").exists()
    assert (tmp_path / "out" / "report.html").exists()
    assert fake.calls == []  # quick never runs burn-in tools


def test_quick_failure_exit_1_and_drain(tmp_path: Path, monkeypatch, fake) -> None:
    w, sl = wiring(
        tmp_path,
        failing={"gpu02": "gpu.count"},
        drained={"gpu05": "gpuforge:join:validate", "gpu06": "RMA 4711"},
        fake=fake,
    )
    res = invoke(monkeypatch, w, tmp_path, "--drain")
    assert res.exit_code == 1, res.output
    assert sl.nodes["gpu02"] == ("IDLE+DRAIN", "gpuforge:gpu.count:quarantine")
    assert sl.nodes["gpu05"] == ("IDLE", "")  # ours: resumed
    assert sl.nodes["gpu06"] == ("IDLE+DRAIN", "RMA 4711")  # someone else's: left alone
    assert "quarantine" in res.output


def test_unreachable_node_is_held_not_drained(tmp_path: Path, monkeypatch, fake) -> None:
    w, sl = wiring(tmp_path, unreachable=["gpu04"], fake=fake)
    res = invoke(monkeypatch, w, tmp_path, "--drain", "--limit", "gpu[01-04]")
    assert res.exit_code == 2, res.output
    assert sl.nodes["gpu04"] == ("IDLE", "")
    assert not any("gpu04" in " ".join(u) for u in sl.updates())
    assert "held" in res.output
    data = json.loads((tmp_path / "out" / "validation.json").read_text())
    assert [n["node"] for n in data["nodes"] if n["verdict"] == "hold"] == ["gpu04"]


def test_full_level_finds_burn_and_nccl_culprits(tmp_path: Path, monkeypatch, fake) -> None:
    w, sl = wiring(tmp_path, slow_nccl=["gpu06"], fake=fake, drained={"gpu05": "RMA 4711"})
    res = invoke(monkeypatch, w, tmp_path, "--level", "full", "--gpu-burn-seconds", "5")
    assert res.exit_code == 1, res.output
    # The NCCL jobs ran in a maintenance reservation over the batch (gpu05 resumed inside it);
    # afterwards, without --drain, gpu05 is drained again with its own reason and nothing else
    # changed state.
    assert ["scontrol", "update", "NodeName=gpu[01-08]", "State=RESUME"] not in sl.updates()
    assert sl.updates()[0] == ["scontrol", "update", "NodeName=gpu05", "State=RESUME"]
    assert sl.nodes["gpu05"] == ("IDLE+DRAIN", "RMA 4711")
    assert {n for n, (st, _) in sl.nodes.items() if "DRAIN" in st} == {"gpu05"}
    assert sl.reservations == {}
    data = json.loads((tmp_path / "out" / "validation.json").read_text())
    verdicts = {n["node"]: (n["verdict"], n["reasons"]) for n in data["nodes"]}
    # gpu03's gpu-burn output is a 16-GPU FAULTY run (exit 0): quarantined by the summary.
    assert verdicts["gpu03"][0] == "quarantine"
    assert "burnin.gpu_burn" in verdicts["gpu03"][1]
    assert verdicts["gpu06"] == ("quarantine", ["nccl.multinode.batch"])
    others = {n for n, (v, _) in verdicts.items() if v != "admit"}
    assert others == {"gpu03", "gpu06"}
    assert data["meta"]["nccl_multinode_runs"] >= 3
    commands = [c[1] for c in fake.calls]
    assert any(c.startswith("dcgmi diag -r 3 -j") for c in commands)
    assert any("all_reduce_perf" in c and "-g 8" in c for c in commands)
    page = (tmp_path / "out" / "report.html").read_text()
    assert "8-GPU all_reduce busbw per node" in page


def test_a_port_whose_error_counters_climb_during_validation_is_not_admitted(
    tmp_path: Path, monkeypatch, fake
) -> None:
    """Active, full rate, bandwidth passing, but rail 1's symbol errors climb by hundreds under
    burn-in and NCCL: the node checker's fabric.counters (same name, same action) quarantines it."""
    w, sl = wiring(tmp_path, fake=fake, counter_growth={("gpu02", "mlx5_1", "symbol_error"): 300})
    res = invoke(monkeypatch, w, tmp_path, "--level", "full", "--gpu-burn-seconds", "5", "--drain")
    assert res.exit_code == 1, res.output
    data = json.loads((tmp_path / "out" / "validation.json").read_text())
    verdicts = {n["node"]: n for n in data["nodes"]}
    assert verdicts["gpu02"]["verdict"] == "quarantine"
    assert verdicts["gpu02"]["reasons"] == ["fabric.counters"]
    (counters,) = [r for r in verdicts["gpu02"]["results"] if r["check"] == "fabric.counters"]
    assert counters["status"] == "fail"
    assert counters["action"] == "inspect"  # the node checker's action for the same check
    assert "ib/mlx5_1/1/symbol_error +300 > 10" in counters["measured"]
    assert sl.nodes["gpu02"][1] == "gpuforge:fabric.counters:inspect"
    # Every other node's counters were read before burn-in and after NCCL, and did not grow.
    for node in set(NODES) - {"gpu02", "gpu03"}:
        ok = [r for r in verdicts[node]["results"] if r["check"] == "fabric.counters"]
        assert [r["status"] for r in ok] == ["pass"], node
    reads = [h for h, c, _ in fake.calls if "/sys/class/infiniband/" in c]
    assert reads.count("gpu02") == 2


def test_unreadable_counters_hold_a_node_never_drain_it(tmp_path: Path, monkeypatch, fake) -> None:
    fake.on("gpu04", "/sys/class/infiniband/", "", rc=2, stderr="grep: No such file")
    w, sl = wiring(tmp_path, fake=fake)
    res = invoke(monkeypatch, w, tmp_path, "--level", "burnin", "--gpu-burn-seconds", "5")
    data = json.loads((tmp_path / "out" / "validation.json").read_text())
    gpu04 = next(n for n in data["nodes"] if n["node"] == "gpu04")
    assert gpu04["verdict"] == "hold", res.output
    assert gpu04["reasons"] == ["fabric.counters"]
    assert sl.nodes["gpu04"] == ("IDLE", "")


def test_limit_and_phase_are_exclusive(tmp_path: Path, monkeypatch, fake) -> None:
    w, _ = wiring(tmp_path, fake=fake)
    res = invoke(monkeypatch, w, tmp_path, "--limit", "gpu01", "--phase", "1")
    assert res.exit_code == 2


def test_phase_selects_its_nodes(tmp_path: Path, fake) -> None:
    view = pipeline.ClusterView.load(topology(tmp_path), hostvars)
    assert view.select(phase=2) == ["gpu05", "gpu06", "gpu07", "gpu08"]
    assert view.select(limit="gpu[01-02]") == ["gpu01", "gpu02"]
    with pytest.raises(Exception, match="not GPU nodes"):
        view.select(limit="ctl01")


def test_srun_command_shape() -> None:
    coll = nccl.SrunCollective(
        FakeRunner(), "ctl01", reservation="gpuforge", rail_devices={3: "mlx5_3"}
    )
    argv = shlex.split(coll.command(["gpu01", "gpu02", "gpu03"], rail=3))
    assert argv[:5] == ["srun", "-N3", "--ntasks-per-node=1", "--gpus-per-node=8", "-w"]
    assert argv[5] == "gpu[01-03]"
    assert "--reservation=gpuforge" in argv
    assert "--export=ALL,NCCL_IB_HCA==mlx5_3" in argv
    assert argv[-9:] == ["all_reduce_perf", "-b", "8G", "-e", "8G", "-f", "2", "-g", "8"]


def test_srun_collective_parses_and_times_out() -> None:
    fake = FakeRunner()
    fake.on("ctl01", "gpu[01-02]", real("nccl-tests/ocihowto-h200-2node-16gpu-all_reduce_perf.txt"))
    fake.on("ctl01", "gpu[03-04]", "", rc=124, timed_out=True)
    coll = nccl.SrunCollective(fake, "ctl01")
    assert coll(("gpu01", "gpu02")) > 400
    assert coll(("gpu03", "gpu04")) == 0.0
    assert fake.calls[0][2] == 10 * 60 + 30
    fake.on("ctl01", "gpu[05-06]", "", rc=255)
    with pytest.raises(nccl.CollectiveUnavailable):
        coll(("gpu05", "gpu06"))


def test_single_node_nccl_judgement() -> None:
    ok = CommandResult("n", "all_reduce_perf", 0, NCCL_OK)
    assert nccl.judge_single_node("n", ok, 405.0, gpus=8).status is Status.PASS
    low = nccl.judge_single_node("n", ok, 500.0, gpus=8)
    assert low.status is Status.FAIL
    assert low.measured == pytest.approx(476.98)
    hung = CommandResult("n", "all_reduce_perf", None, "", timed_out=True)
    assert nccl.judge_single_node("n", hung, 405.0, gpus=8).status is Status.FAIL
    a100 = CommandResult(
        "n", "x", 0, real("nccl-tests/superbench-a100-40gb-8gpu-all_reduce_perf.txt")
    )
    assert nccl.judge_single_node("n", a100, 199.8, gpus=8).status is Status.PASS


def test_findings_make_exit_1(tmp_path: Path) -> None:
    s = BatchSummary.build(
        ["a"],
        [CheckResult("a", "x", Status.PASS)],
        level=Level.FULL,
        findings=(FabricFinding("leaf-uplink", "leaf1", "slow"),),
    )
    assert s.exit_code == 1


def test_a_note_shared_by_every_node_is_printed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake
) -> None:
    from dataclasses import replace  # noqa: PLC0415

    from gpuforge.validate.checks import READ_ONLY_SYSCTL_NOTE  # noqa: PLC0415

    w, _ = wiring(tmp_path, fake=fake)
    plain = w.deps.run_suite

    def with_sysctls(inv: Path, hosts: Sequence[str], work: Path) -> SuiteRun:
        run = plain(inv, hosts, work)
        extra = tuple(
            CheckResult(h, "fabric.sysctls", Status.PASS, message=READ_ONLY_SYSCTL_NOTE)
            for h in hosts
        )
        return replace(run, results=run.results + extra)

    w.deps.run_suite = with_sysctls
    res = invoke(monkeypatch, w, tmp_path)
    assert res.exit_code == 0, res.output
    assert res.output.count("note fabric.sysctls") == 1
    data = json.loads((tmp_path / "out" / "validation.json").read_text())
    assert all(n["warnings"] == [] for n in data["nodes"])  # not a warning per node
    assert data["notes"] == [
        {"check": "fabric.sysctls", "nodes": "gpu[01-08]", "message": READ_ONLY_SYSCTL_NOTE}
    ]


def test_unreachable_node_says_unreachable_once(tmp_path: Path, monkeypatch, fake) -> None:
    """One 'unreachable' result, not every check of the suite failing to connect (issue 15.7)."""
    w, sl = wiring(tmp_path, unreachable=["gpu04"], fake=fake)
    ran: list[Sequence[str]] = []
    run_suite = w.deps.run_suite

    def recording(inv: Path, hosts: Sequence[str], work: Path) -> SuiteRun:
        ran.append(list(hosts))
        return run_suite(inv, hosts, work)

    w.deps.run_suite = recording
    w.deps.unreachable = lambda hosts: {
        h: "no answer in 20 s waiting for the SSH banner from 10.0.0.14:22"
        for h in hosts
        if h == "gpu04"
    }
    res = invoke(monkeypatch, w, tmp_path, "--drain", "--limit", "gpu[01-04]")
    assert res.exit_code == 2, res.output
    assert ran == [["gpu01", "gpu02", "gpu03"]]
    assert sl.nodes["gpu04"] == ("IDLE", "")
    data = json.loads((tmp_path / "out" / "validation.json").read_text())
    (node,) = [n for n in data["nodes"] if n["node"] == "gpu04"]
    assert node["verdict"] == "hold"
    assert node["reasons"] == ["node.unreachable"]
    (result,) = node["results"]
    assert result["message"].startswith("no answer in 20 s waiting for the SSH banner")
