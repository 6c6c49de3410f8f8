"""Per-SKU floors and the robust peer comparison."""

from __future__ import annotations

import pytest

from gpuforge.errors import InputError
from gpuforge.validate.result import Status
from gpuforge.validate.thresholds import (
    SKUS,
    for_sku,
    ib_write_bw_floor_gbps,
    low_outliers,
    nccl_net_floor_gbs,
    peer_scores,
    robust_z,
)
from gpuforge.validate.verdict import peer_results


def test_every_sku_has_a_source_and_a_sane_floor() -> None:
    for sku in SKUS.values():
        assert sku.source
        assert 0 < sku.nvlink_allreduce_floor_gbs < sku.nvlink_allreduce_ref_gbs


def test_floors_match_published_figures() -> None:
    assert for_sku("H100-SXM-80GB").nvlink_allreduce_floor_gbs == 408.0
    assert for_sku("H200").nvlink_allreduce_floor_gbs == pytest.approx(405.4, abs=0.1)
    assert for_sku("A100-SXM4-80GB").nvlink_allreduce_floor_gbs == pytest.approx(199.8, abs=0.1)
    # the H200 fixture (476.96 GB/s) passes its floor; the A100 40GB sample (235) passes A100's
    assert for_sku("H200").nvlink_allreduce_floor_gbs <= 476.96


def test_unknown_sku_is_an_input_error() -> None:
    with pytest.raises(InputError):
        for_sku("T4")


def test_network_floors() -> None:
    assert ib_write_bw_floor_gbps(400) == 360.0
    assert nccl_net_floor_gbs(1, 400) == pytest.approx(39.9, abs=0.1)
    assert nccl_net_floor_gbs(8, 400) == pytest.approx(319.6, abs=0.1)


def test_robust_z_guards_mad_zero() -> None:
    z = robust_z({f"n{i}": 400.0 for i in range(8)})
    assert set(z.values()) == {0.0}
    z = robust_z({**{f"n{i}": 400.0 for i in range(7)}, "slow": 300.0})
    assert z["slow"] < -10  # MAD floored at 1% of the median: a 25% deficit is extreme


def test_peer_flags_node_above_floor_but_far_below_peers() -> None:
    values = {f"n{i}": 470.0 + (i % 3) for i in range(15)}
    values["weak"] = 420.0  # above the 408 floor, 11% below peers
    scores = peer_scores(values)
    assert scores["weak"].status is Status.FAIL
    assert all(s.status is Status.PASS for n, s in scores.items() if n != "weak")
    assert [s.node for s in low_outliers(values)] == ["weak"]


def test_peer_warns_on_moderate_deficit() -> None:
    values = {f"n{i}": 470.0 + (i % 3) for i in range(15)}
    values["meh"] = 452.0  # ~4% below
    assert peer_scores(values)["meh"].status is Status.WARN


def test_peer_ignores_noise_on_tight_fleet_and_small_batches() -> None:
    values = {f"n{i}": 470.0 for i in range(15)}
    values["noisy"] = 466.0  # 0.9% below: large z on a MAD of 0, but no material deficit
    assert peer_scores(values)["noisy"].status is Status.PASS
    assert peer_scores({"a": 1.0, "b": 2.0, "c": 300.0}) == {}


def test_peer_never_flags_fast_nodes() -> None:
    values = {f"n{i}": 400.0 for i in range(10)}
    values["fast"] = 900.0
    assert peer_scores(values)["fast"].status is Status.PASS


def test_peer_results_become_check_results() -> None:
    values = {f"n{i}": 470.0 for i in range(9)}
    values["weak"] = 300.0
    res = {r.node: r for r in peer_results("nccl.allreduce_nvlink", values, unit="GB/s")}
    assert res["weak"].status is Status.FAIL
    assert res["weak"].check == "nccl.allreduce_nvlink.peer"
    assert "median 470.0" in str(res["weak"].expected)


def test_too_few_peers_say_so_instead_of_passing() -> None:
    values = {"a": 100.0, "b": 101.0, "c": 99.0, "d": 60.0}
    res = peer_results(
        "burnin.gpu_burn.min_gflops", values, unit="Gflop/s", floor="the SKU floor 40140 Gflop/s"
    )
    assert {r.status for r in res} == {Status.SKIP}
    assert res[0].message == (
        "no peer comparison (4 nodes, 5 needed); judged against the SKU floor 40140 Gflop/s only"
    )
    assert res[0].check == "burnin.gpu_burn.min_gflops.peer"


def test_admitted_nodes_complete_the_peer_pool_without_being_scored() -> None:
    values = {"a": 100.0, "b": 101.0, "c": 99.0, "d": 60.0}
    reference = {"x": 100.5, "y": 99.5}
    res = {r.node: r for r in peer_results("m", values, unit="GB/s", reference=reference)}
    assert set(res) == set(values)
    assert res["d"].status is Status.FAIL
    assert res["a"].status is Status.PASS
    assert "2 admitted nodes among them" in str(res["a"].expected)
