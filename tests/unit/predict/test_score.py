"""Fleet scoring: degrading nodes first with the right reason, facility events told apart."""

from __future__ import annotations

import numpy as np

from gpuforge.predict.score import (
    BANKS_LOW,
    ECC_SBE,
    GPU_TEMP,
    IB_SYMBOL,
    REMAP_CORRECTABLE,
    score_telemetry,
)
from gpuforge.predict.signals import DAY_S, Window
from gpuforge.predict.telemetry import SeriesKey, Telemetry
from tests.unit.predict.builders import AT, fleet, ramp_from, set_series, times, xid

WINDOW = Window(AT)


def test_healthy_fleet_has_no_findings_and_every_node_scored() -> None:
    report = score_telemetry(fleet(), WINDOW)
    assert len(report.ranked) == 16
    assert all(r.score == 0 and not r.findings for r in report.ranked)
    assert report.groups == ()


def test_degrading_gpu_ranks_first_with_its_signal_and_gpu() -> None:
    telemetry = fleet()
    set_series(telemetry, SeriesKey("gpu07", ECC_SBE, gpu=3), ramp_from(day=3, per_hour_end=400))
    rows = np.floor(np.linspace(0, 9, len(times())))
    set_series(telemetry, SeriesKey("gpu07", REMAP_CORRECTABLE, gpu=3), rows)
    report = score_telemetry(telemetry, WINDOW)
    top = report.ranked[0]
    assert top.node == "gpu07"
    assert top.score >= 0.5
    signals = {(f.signal, f.subject) for f in top.findings}
    assert ("ecc_sbe_rate", "gpu3") in signals
    assert ("row_remap", "gpu3") in signals
    ecc = next(f for f in top.findings if f.signal == "ecc_sbe_rate")
    assert ecc.detail.startswith("rising:")
    assert all(r.score == 0 for r in report.ranked[1:])


def test_banks_without_spare_rows_are_a_hard_limit_finding() -> None:
    telemetry = fleet()
    set_series(telemetry, SeriesKey("gpu03", BANKS_LOW, gpu=5), np.ones(len(times())))
    report = score_telemetry(telemetry, WINDOW)
    top = report.ranked[0]
    assert (top.node, top.top_signal) == ("gpu03", "row_remap")
    assert "few spare rows" in top.findings[0].detail


def test_one_off_burst_is_reported_weak_and_never_reaches_the_drain_score() -> None:
    telemetry = fleet()
    burst = np.zeros(len(times()))
    burst[-5:] = 300.0  # 300 errors at once, five hours before the end
    set_series(telemetry, SeriesKey("gpu02", ECC_SBE, gpu=1), burst)
    report = score_telemetry(telemetry, WINDOW)
    node = next(r for r in report.ranked if r.node == "gpu02")
    assert node.findings[0].detail.startswith("one-off burst")
    assert node.score < 0.5


def test_rack_warming_together_is_one_cooling_finding_not_nodes_at_risk() -> None:
    telemetry = fleet()
    t = times()
    warm = np.clip((t - (AT - 3 * DAY_S)) / DAY_S, 0, None) * 2.0  # +2 C/day for 3 days
    for node in ("gpu05", "gpu06", "gpu07", "gpu08"):  # rack r1
        for g in range(8):
            key = SeriesKey(node, GPU_TEMP, gpu=g)
            telemetry.series[key] = (t, telemetry.series[key][1] + warm)
    report = score_telemetry(telemetry, WINDOW)
    assert [(g.kind, g.scope, g.group) for g in report.groups] == [("cooling", "rack", "r1")]
    assert report.groups[0].nodes == ("gpu05", "gpu06", "gpu07", "gpu08")
    assert all(r.score == 0 for r in report.ranked), "a facility event must not rank nodes"


def test_one_gpu_warming_against_its_rack_is_a_node_finding() -> None:
    telemetry = fleet()
    t = times()
    key = SeriesKey("gpu10", GPU_TEMP, gpu=6)
    drift = np.clip((t - (AT - 4 * DAY_S)) / DAY_S, 0, None) * 3.0
    telemetry.series[key] = (t, telemetry.series[key][1] + drift)
    report = score_telemetry(telemetry, WINDOW)
    top = report.ranked[0]
    assert (top.node, top.top_signal, top.findings[0].subject) == ("gpu10", "thermal_drift", "gpu6")
    assert report.groups == ()


def test_leaf_wide_symbol_errors_are_a_fabric_finding() -> None:
    telemetry = fleet()
    for i in range(8):  # leaf0: gpu01..gpu08
        steady = np.cumsum(np.full(len(times()), 30.0))
        set_series(telemetry, SeriesKey(f"gpu{i + 1:02d}", IB_SYMBOL, port="mlx5_0/1"), steady)
    report = score_telemetry(telemetry, WINDOW)
    assert [(g.kind, g.group, g.signal) for g in report.groups] == [
        ("fabric", "leaf0", "ib_symbol_errors")
    ]
    assert all(r.score == 0 for r in report.ranked)


def test_xid_recurrence_counts_the_same_gpu_only() -> None:
    telemetry = fleet()
    telemetry.events += [xid("gpu04", 2, 31, h) for h in (5, 30, 60)]
    telemetry.events += [xid("gpu09", g, 31, 10 * g + 1) for g in range(3)]  # three GPUs
    report = score_telemetry(telemetry, WINDOW)
    top = report.ranked[0]
    assert (top.node, top.top_signal, top.findings[0].subject) == (
        "gpu04",
        "xid_recurrence",
        "gpu2",
    )
    assert next(r for r in report.ranked if r.node == "gpu09").score == 0


def test_node_with_too_little_data_is_listed_not_scored_as_safe() -> None:
    telemetry = fleet()
    t = times()
    for key in [k for k in telemetry.series if k.node == "gpu16"]:
        telemetry.series[key] = (t[-10:], telemetry.series[key][1][-10:])
    telemetry.labels["gpu17"] = {"rack": "r4"}  # known to the inventory, never reported
    report = score_telemetry(telemetry, WINDOW)
    thin = {r.node: r.note for r in report.insufficient}
    assert set(thin) == {"gpu16", "gpu17"}
    assert "span" in thin["gpu16"] and thin["gpu17"] == "no samples in the window"
    assert "gpu16" not in {r.node for r in report.ranked}


def test_counter_reset_is_not_a_negative_or_huge_rate() -> None:
    telemetry = fleet()
    values = np.arange(len(times()), dtype=np.float64) * 0.01
    values[len(values) // 2 :] -= values[len(values) // 2]  # driver reload: counter back to 0
    set_series(telemetry, SeriesKey("gpu01", ECC_SBE, gpu=0), values)
    report = score_telemetry(telemetry, WINDOW)
    assert all(r.score == 0 for r in report.ranked)


def test_lab_shaped_ecc_degradation_over_one_hour_ranks_first() -> None:
    """The simulator's ecc_degrading: 0 -> 600/h linearly over an hour, remapped rows 0 -> 6."""
    telemetry = Telemetry(source="lab")
    t = 1_795_000_000.0 + 15.0 * np.arange(1, 241)  # one hour of 15 s scrapes
    elapsed = t - t[0]
    for n in range(4):
        node = f"gpu{n + 1:02d}"
        telemetry.labels[node] = {"rack": f"r{n // 2}", "node_type": "lab"}
        for g in range(8):
            errors = np.zeros(len(t))
            rows = np.zeros(len(t))
            if (node, g) == ("gpu03", 5):
                errors = np.floor(600 / 3600 * elapsed**2 / (2 * 3600))
                rows = np.floor(6 * elapsed / 3600)
            telemetry.series[SeriesKey(node, ECC_SBE, gpu=g)] = (t, errors)
            telemetry.series[SeriesKey(node, REMAP_CORRECTABLE, gpu=g)] = (t, rows)
    report = score_telemetry(telemetry, Window(float(t[-1]), 3600.0))
    top = report.ranked[0]
    assert (top.node, top.findings[0].subject) == ("gpu03", "gpu5")
    assert {f.signal for f in top.findings} == {"row_remap", "ecc_sbe_rate"}
    assert top.score >= 0.5
    assert all(r.score == 0 for r in report.ranked[1:])


def test_all_gpus_of_a_node_warming_together_is_a_load_change_not_drift() -> None:
    telemetry = fleet()
    t = times()
    busy = np.where(t >= AT - DAY_S, 25.0, 0.0)  # a job started a day ago on every GPU
    for g in range(8):
        key = SeriesKey("gpu11", GPU_TEMP, gpu=g)
        telemetry.series[key] = (t, telemetry.series[key][1] + busy)
    report = score_telemetry(telemetry, WINDOW)
    assert all(r.score == 0 for r in report.ranked)
