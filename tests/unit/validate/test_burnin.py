"""Burn-in verdicts from real tool output served by fake runners."""

from __future__ import annotations

from conftest import FakeRunner, real

from gpuforge.command import CommandResult
from gpuforge.validate import burnin
from gpuforge.validate.burnin import PairResult, RailPair, ib_write_bw_pair, ib_write_bw_rail
from gpuforge.validate.result import Status


def test_dcgm_level_by_phase() -> None:
    assert burnin.dcgm_level(new_or_repaired=True) == 3
    assert burnin.dcgm_level(new_or_repaired=False) == 2


def test_dcgm_pass_real_a100_r2(fake: FakeRunner) -> None:
    fake.on("n1", "dcgmi diag -r 2", real("dcgmi/awsome-p4de-a100-80gb-dcgmi-diag-r2-pass.txt"))
    [r] = burnin.dcgm_diag(fake, "n1", level=2)
    assert r.status is Status.PASS, r
    assert r.check == "gpu.dcgm_diag"
    assert fake.calls[0][2] == 600


def test_dcgm_targeted_power_fail_names_gpu(fake: FakeRunner) -> None:
    text = real("dcgmi/idx25468481308-a10g-4gpu-dcgmi-diag-extended-targeted-power-fail.txt")
    fake.on("n1", "dcgmi diag -r 3", text, rc=226)
    [r] = burnin.dcgm_diag(fake, "n1", level=3)
    assert r.status is Status.FAIL
    assert r.check == "gpu.dcgm_diag[targeted_power.gpu1]"
    assert "Targeted Power" in str(r.measured)
    assert "GPU 1" in str(r.measured)
    # DCGM's own explanation, from the Warning row (the table wraps it mid-word)
    assert r.message.startswith("GPU 1 Max power of 224.1 did not reach")
    assert "GPU 1 Max power of 224.1 did not reach desire" in r.evidence


def test_dcgm_json_real_t4_pass(fake: FakeRunner) -> None:
    fake.on("n1", "dcgmi diag", real("dcgmi/virtualclient-t4-dcgmi-diag-r3-j.json.txt"))
    assert [r.status for r in burnin.dcgm_diag(fake, "n1", level=3)] == [Status.PASS]


def test_dcgm_could_not_run_is_inconclusive(fake: FakeRunner) -> None:
    fake.on(
        "n1", "dcgmi diag", real("dcgmi/dcgm-issue94-a100-80gb-pcie-mig-incompatible-error.txt")
    )
    [r] = burnin.dcgm_diag(fake, "n1", level=2)
    assert r.status in (Status.ERROR, Status.FAIL)
    assert r.status is not Status.PASS


def test_dcgm_hang_is_a_failure_with_evidence(fake: FakeRunner) -> None:
    fake.on("n1", "dcgmi diag", "Running...", rc=124, timed_out=True)
    [r] = burnin.dcgm_diag(fake, "n1", level=3)
    assert r.status is Status.FAIL
    assert r.measured == "hung"
    assert "timed out" in r.evidence


def test_dcgm_unreachable_is_error(fake: FakeRunner) -> None:
    fake.on("n1", "dcgmi", "", rc=255, stderr="ssh: connect to host n1: No route to host")
    [r] = burnin.dcgm_diag(fake, "n1", level=2)
    assert r.status is Status.ERROR


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


def _make_pair(server: str, client: str, round_no: int) -> RailPair:
    return RailPair(0, server, "mlx5_0", server, client, "mlx5_0", 18515 + round_no)


def _slow_nodes(*slow: str) -> dict[frozenset[str], float]:
    """Every pair with a slow node in it runs at 150 Gb/s."""
    return {frozenset((a, b)): 150.0 for a in slow for b in "abcdefgh" if a != b}


def _rail(gbps: dict[frozenset[str], float], nodes: str) -> dict[str, Status]:
    res = ib_write_bw_rail(_synthetic(gbps), list(nodes), rate_gbps=400, make_pair=_make_pair)
    return {r.node: r.status for r in res}


def test_ib_write_bw_rail_localizes_bad_port() -> None:
    assert _rail(_slow_nodes("d"), "abcd") == {
        "a": Status.PASS,
        "b": Status.PASS,
        "c": Status.PASS,
        "d": Status.FAIL,
    }


def test_ib_write_bw_rail_breaks_a_tie_with_the_odd_node_out() -> None:
    # b-c fails and no pair has passed yet: the untested d meets b, passes, and so condemns c.
    res = ib_write_bw_rail(
        _synthetic(_slow_nodes("c")), list("bcd"), rate_gbps=400, make_pair=_make_pair
    )
    status = {r.node: r.status for r in res}
    assert status == {"b": Status.PASS, "c": Status.FAIL, "d": Status.PASS}
    (c,) = [r for r in res if r.node == "c"]
    assert c.check == "burnin.ib_write_bw[mlx5_0]"
    assert "which reached it with" in c.message


def test_ib_write_bw_rail_every_pair_slow_is_held_not_failed() -> None:
    everything = {frozenset(p): 100.0 for p in ("ab", "ac", "ad", "bc", "bd", "cd")}
    assert set(_rail(everything, "abcd").values()) == {Status.ERROR}


def test_ib_write_bw_rail_no_partner_holds() -> None:
    assert set(_rail({frozenset(("a", "b")): 10.0}, "ab").values()) == {Status.ERROR}


def test_ib_write_bw_rail_rounds_use_disjoint_pairs() -> None:
    seen: list[RailPair] = []
    slow = _slow_nodes("a", "d", "e")

    def run(p: RailPair) -> PairResult:
        seen.append(p)
        return _synthetic(slow)(p)

    ib_write_bw_rail(run, list("abcdefgh"), rate_gbps=400, make_pair=_make_pair)
    for port in {p.port for p in seen}:
        members = [n for p in seen if p.port == port for n in (p.server, p.client)]
        assert len(members) == len(set(members)), f"a node twice in round {port}"


def test_ib_write_bw_rail_two_slow_nodes_among_eight() -> None:
    status = _rail(_slow_nodes("b", "g"), "abcdefgh")
    assert {n for n, s in status.items() if s is Status.FAIL} == {"b", "g"}
    assert {n for n, s in status.items() if s is Status.PASS} == set("acdefh")


def test_ib_write_bw_rail_admitted_nodes_resolve_a_node_whose_partners_all_failed() -> None:
    # a, b, c are slow; d met them all and cannot tell. Before: d was held (no partner passed).
    slow = {frozenset((x, y)): 150.0 for x in "abc" for y in "abcdxy" if x != y}
    batch = list("abcd")
    before = ib_write_bw_rail(_synthetic(slow), batch, rate_gbps=400, make_pair=_make_pair)
    assert {r.node: r.status for r in before}["d"] is Status.ERROR
    after = ib_write_bw_rail(
        _synthetic(slow), batch, rate_gbps=400, make_pair=_make_pair, references=["x", "y"]
    )
    status = {r.node: r.status for r in after}
    assert status == {"a": Status.FAIL, "b": Status.FAIL, "c": Status.FAIL, "d": Status.PASS}
    assert "admitted node" in next(r.message for r in after if r.node == "a")


def test_ib_write_bw_rail_odd_node_out_meets_an_admitted_node_in_round_one() -> None:
    seen: list[RailPair] = []

    def run(p: RailPair) -> PairResult:
        seen.append(p)
        return _synthetic({})(p)

    res = ib_write_bw_rail(run, list("abc"), rate_gbps=400, make_pair=_make_pair, references=["z"])
    assert {r.node: r.status for r in res} == dict.fromkeys("abc", Status.PASS)
    first = [(p.server, p.client) for p in seen if p.port == 18516]
    assert ("z", "c") in first
    assert all(r.node != "z" for r in res)  # admitted nodes get no result of their own


def test_dcgm_check_names_fold_consecutive_gpus() -> None:
    assert burnin.dcgm_check_name("PCIe", [2]) == "gpu.dcgm_diag[pcie.gpu2]"
    assert (
        burnin.dcgm_check_name("Persistence Mode", range(6))
        == "gpu.dcgm_diag[persistence_mode.gpu0-5]"
    )
    assert (
        burnin.dcgm_check_name("Targeted Power", [1, 3, 4])
        == "gpu.dcgm_diag[targeted_power.gpu1,gpu3-4]"
    )
    assert (
        burnin.dcgm_check_name("Page Retirement/Row Remap", [])
        == "gpu.dcgm_diag[page_retirement_row_remap]"
    )


def test_dcgm_deployment_failure_real_h200_names_the_gpus_from_the_message(
    fake: FakeRunner,
) -> None:
    text = real("dcgmi/azh200doc-h200-8gpu-dcgmi-diag-r1-persistence-fail.txt")
    fake.on("n1", "dcgmi diag", text, rc=1)
    [r] = burnin.dcgm_diag(fake, "n1", level=1)
    assert r.check == "gpu.dcgm_diag[persistence_mode.gpu0-5]"
    assert r.message.startswith("Persistence mode for GPU 0 is currently disabled")
