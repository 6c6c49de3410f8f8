"""Growth over level, trend over noise: the two mistakes of issue 30, each pinned by a test."""

from __future__ import annotations

import numpy as np

from gpuforge.predict.score import ECC_SBE, IB_SYMBOL, SM_CLOCK, score_telemetry
from gpuforge.predict.signals import DAY_S, HOUR_S, Window
from gpuforge.predict.telemetry import SeriesKey
from tests.unit.predict.builders import AT, T0, fleet, set_series, times

WINDOW = Window(AT)


def _days() -> np.ndarray:
    return (times() - T0) / DAY_S


def test_a_counter_growing_faster_each_day_outranks_any_flat_level() -> None:
    telemetry = fleet()
    days = _days()
    # a failing optic: symbol errors whose daily increment doubles from day 1 (0.2/h -> 25/h)
    growing = np.cumsum(np.where(days >= 1, 0.2 * 2.0 ** (days - 1), 0.0))
    set_series(telemetry, SeriesKey("gpu09", IB_SYMBOL, port="mlx5_1/1"), np.floor(growing))
    # a cable replaced before the window: 400,000 old errors, not one more since
    set_series(telemetry, SeriesKey("gpu05", IB_SYMBOL, port="mlx5_1/1"), np.full(len(days), 4e5))
    # a cable replaced on day 4: 50 errors an hour until then, flat since (a large count)
    stopped = np.cumsum(np.where(days < 4, 50.0, 0.0)) + 2e5
    set_series(telemetry, SeriesKey("gpu06", IB_SYMBOL, port="mlx5_0/1"), stopped)
    report = score_telemetry(telemetry, WINDOW)
    top = report.ranked[0]
    assert (top.node, top.top_signal, top.findings[0].subject) == (
        "gpu09",
        "ib_symbol_errors",
        "mlx5_1/1",
    )
    assert top.findings[0].detail.startswith("rising:")
    assert top.score >= 0.5
    by_node = {r.node: r for r in report.ranked}
    for node in ("gpu05", "gpu06"):  # the level is never read: no growth, no finding
        assert by_node[node].score == 0 and not by_node[node].findings


def test_a_clock_falling_behind_outranks_the_normal_spread_of_correctable_ecc() -> None:
    telemetry = fleet()
    rng = np.random.default_rng(3)
    t = times()
    days = _days()
    for node in sorted(telemetry.labels):
        for g in range(8):
            # a healthy fleet's log-normal spread of correctable ECC rates, steady
            rate = 0.05 * float(np.exp(rng.normal(0, 1.3)))
            telemetry.series[SeriesKey(node, ECC_SBE, gpu=g)] = (
                t,
                np.cumsum(rng.poisson(rate, len(t))).astype(np.float64),
            )
            clock = 1980 - np.abs(rng.normal(0, 20, len(t))) - float(rng.uniform(0, 30))
            telemetry.series[SeriesKey(node, SM_CLOCK, gpu=g)] = (t, np.round(clock))
    for node, g, rate in (("gpu02", 1, 2.0), ("gpu03", 6, 4.0), ("gpu14", 0, 6.0)):
        # the top of the spread: steady 2-6 errors an hour, for the whole window
        set_series(telemetry, SeriesKey(node, ECC_SBE, gpu=g), np.cumsum(rng.poisson(rate, len(t))))
    # GPU 2 of gpu12 falls 40 MHz further behind its node's GPUs each day under load
    key = SeriesKey("gpu12", SM_CLOCK, gpu=2)
    sag = 40.0 * np.clip(days - 2, 0, None)
    telemetry.series[key] = (t, telemetry.series[key][1] - sag)
    # GPU 4 of gpu13 dips for six hours in the last day only: no persistence, no finding
    key = SeriesKey("gpu13", SM_CLOCK, gpu=4)
    dip = np.where(t >= AT - 6 * HOUR_S, 300.0, 0.0)
    telemetry.series[key] = (t, telemetry.series[key][1] - dip)
    report = score_telemetry(telemetry, WINDOW)
    top = report.ranked[0]
    assert (top.node, top.top_signal, top.findings[0].subject) == ("gpu12", "clock_low", "gpu2")
    assert top.score >= 0.5
    by_node = {r.node: r for r in report.ranked}
    for node in ("gpu02", "gpu03", "gpu14"):
        risk = by_node[node]
        assert risk.score < 0.05, risk.findings
        assert all(f.detail.startswith("steady, high") for f in risk.findings)
    assert not [f for f in by_node["gpu13"].findings if f.signal == "clock_low"]
    assert all(r.score < 0.05 for r in report.ranked[1:])
