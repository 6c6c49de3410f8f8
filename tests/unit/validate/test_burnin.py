"""Burn-in verdicts from real tool output served by fake runners."""

from __future__ import annotations

from conftest import FakeRunner, real

from gpuforge.validate import burnin
from gpuforge.validate.burnin import PairResult, RailPair, ib_write_bw_pair, ib_write_bw_rail
from gpuforge.validate.execution import CommandResult
from gpuforge.validate.result import Status


def test_dcgm_level_by_phase() -> None:
    assert burnin.dcgm_level(new_or_repaired=True) == 3
    assert burnin.dcgm_level(new_or_repaired=False) == 2


def test_dcgm_pass_real_a100_r2(fake: FakeRunner) -> None:
    fake.on("n1", "dcgmi diag -r 2", real("dcgmi/awsome-p4de-a100-80gb-dcgmi-diag-r2-pass.txt"))
    r = burnin.dcgm_diag(fake, "n1", level=2)
    assert r.status is Status.PASS, r
    assert r.check == "burnin.dcgm_diag_r2"
    assert fake.calls[0][2] == 600


def test_dcgm_targeted_power_fail_names_gpu(fake: FakeRunner) -> None:
    text = real("dcgmi/idx25468481308-a10g-4gpu-dcgmi-diag-extended-targeted-power-fail.txt")
    fake.on("n1", "dcgmi diag -r 3", text, rc=226)
    r = burnin.dcgm_diag(fake, "n1", level=3)
    assert r.status is Status.FAIL
    assert "Targeted Power" in str(r.measured)
    assert "1" in str(r.measured)
    assert r.evidence


def test_dcgm_json_real_t4_pass(fake: FakeRunner) -> None:
    fake.on("n1", "dcgmi diag", real("dcgmi/virtualclient-t4-dcgmi-diag-r3-j.json.txt"))
    assert burnin.dcgm_diag(fake, "n1", level=3).status is Status.PASS


def test_dcgm_could_not_run_is_inconclusive(fake: FakeRunner) -> None:
    fake.on(
        "n1", "dcgmi diag", real("dcgmi/dcgm-issue94-a100-80gb-pcie-mig-incompatible-error.txt")
    )
    r = burnin.dcgm_diag(fake, "n1", level=2)
    assert r.status in (Status.ERROR, Status.FAIL)
    assert r.status is not Status.PASS


def test_dcgm_hang_is_a_failure_with_evidence(fake: FakeRunner) -> None:
    fake.on("n1", "dcgmi diag", "Running...", rc=124, timed_out=True)
    r = burnin.dcgm_diag(fake, "n1", level=3)
    assert r.status is Status.FAIL
    assert r.measured == "hung"
    assert "timed out" in r.evidence


def test_dcgm_unreachable_is_error(fake: FakeRunner) -> None:
    fake.on("n1", "dcgmi", "", rc=255, stderr="ssh: connect to host n1: No route to host")
    assert burnin.dcgm_diag(fake, "n1", level=2).status is Status.ERROR


def test_gpu_burn_real_healthy(fake: FakeRunner) -> None:
    fake.on("n1", "gpu_burn", real("kernel/superbench-a100-80gb-8gpu-gpu_burn.txt"))
    res = burnin.gpu_burn_check(fake, "n1", seconds=60, gpus=8)
    assert res[0].status is Status.PASS, res[0]
    assert res[0].measured == "8 OK"
    assert fake.calls[0][2] == 60 + 180


def test_gpu_burn_faulty_despite_exit_zero(fake: FakeRunner) -> None:
    fake.on("n1", "gpu_burn", real("kernel/gpuburn-issue12-16gpu-faulty-summary.txt"), rc=0)
    res = burnin.gpu_burn_check(fake, "n1", seconds=60, gpus=16)
    assert res[0].status is Status.FAIL
    assert "GPU 0: FAULTY" in str(res[0].measured)
    gflops = [r for r in res if r.check == "burnin.gpu_burn.min_gflops"]
    assert gflops
    assert gflops[0].measured == 6311.0


def test_gpu_burn_min_gflops_floor(fake: FakeRunner) -> None:
    fake.on("n1", "gpu_burn", real("kernel/gpuburn-issue12-16gpu-faulty-summary.txt"))
    res = burnin.gpu_burn_check(fake, "n1", seconds=60, gpus=16, min_gflops=6400)
    assert {r.check: r.status for r in res}["burnin.gpu_burn.min_gflops"] is Status.FAIL


def test_gpu_burn_wrong_gpu_count_fails(fake: FakeRunner) -> None:
    fake.on("n1", "gpu_burn", real("kernel/superbench-a100-80gb-8gpu-gpu_burn.txt"))
    assert burnin.gpu_burn_check(fake, "n1", seconds=5, gpus=16)[0].status is Status.FAIL


def test_gpu_burn_crash_without_summary_fails(fake: FakeRunner) -> None:
    fake.on("n1", "gpu_burn", "Couldn't init a GPU test: CUDA error\n", rc=1)
    assert burnin.gpu_burn_check(fake, "n1", seconds=5, gpus=8)[0].status is Status.FAIL


def _pair() -> RailPair:
    return RailPair(0, "a", "mlx5_0", "10.0.0.1", "b", "mlx5_0")


def test_ib_write_bw_pair_real_hdr(fake: FakeRunner) -> None:
    text = real("ib/superbench-ib_write_bw-loopback-8M.txt")
    fake.on("*", "ib_write_bw", text)
    r = ib_write_bw_pair(fake, _pair(), timeout=5, settle_s=0)
    assert 201 < r.gbps < 203  # 24056.72 MB/s, perftest's MB being 2^20 bytes
    servers = [c for c in fake.calls if c[0] == "a"]
    clients = [c for c in fake.calls if c[0] == "b"]
    assert "10.0.0.1" in clients[0][1]
    assert "10.0.0.1" not in servers[0][1]
    assert all(c[2] == 5 for c in fake.calls)


def _synthetic(gbps: dict[frozenset[str], float]):
    def run(p: RailPair) -> PairResult:
        ok = CommandResult(p.client, "ib_write_bw", 0, "out")
        return PairResult(p, gbps.get(frozenset((p.server, p.client)), 390.0), ok, ok)

    return run


def test_ib_write_bw_rail_localizes_bad_port() -> None:
    run = _synthetic({frozenset(("c", "d")): 150.0, frozenset(("d", "a")): 150.0})
    pairs = [
        RailPair(0, "a", "mlx5_0", "a", "b", "mlx5_0"),
        RailPair(0, "c", "mlx5_0", "c", "d", "mlx5_0", 18516),
    ]

    def repair(ref: str, node: str) -> RailPair:
        return RailPair(0, ref, "mlx5_0", ref, node, "mlx5_0", 18600)

    res = {r.node: r.status for r in ib_write_bw_rail(run, pairs, rate_gbps=400, repair=repair)}
    assert res == {"a": Status.PASS, "b": Status.PASS, "c": Status.PASS, "d": Status.FAIL}


def test_ib_write_bw_rail_no_partner_holds() -> None:
    run = _synthetic({frozenset(("a", "b")): 10.0})
    pairs = [RailPair(0, "a", "mlx5_0", "a", "b", "mlx5_0")]
    res = ib_write_bw_rail(
        run, pairs, rate_gbps=400, repair=lambda r, n: RailPair(0, r, "m", r, n, "m")
    )
    assert {r.status for r in res} == {Status.ERROR}
