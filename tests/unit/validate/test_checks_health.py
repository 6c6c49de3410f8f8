"""The pure judgements the node health checker added: counters, pins, services, DCGM, drops."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from tests.unit.conftest import REAL_FIXTURES

from gpuforge.validate import checks, flaps
from gpuforge.validate.parsers import dcgmi, link_events


def test_counter_growth_judges_each_counter_by_its_name() -> None:
    maxima = {"symbol_error": 10, "link_downed": 1}
    ok = checks.counter_growth(
        {"ib/mlx5_0/1/symbol_error": 10, "ib/mlx5_0/1/link_downed": 1}, maxima, window_s=3600
    )
    assert ok.ok
    bad = checks.counter_growth({"ib/mlx5_1/1/link_downed": 2}, maxima, window_s=3600)
    assert not bad.ok
    assert bad.measured == "ib/mlx5_1/1/link_downed +2 > 1"
    assert "1 h" in str(bad.expected)
    unjudged = checks.counter_growth({"ib/mlx5_0/1/port_rcv_data": 1e9}, maxima, window_s=60)
    assert unjudged.ok


@pytest.mark.parametrize(
    ("offset", "ok", "side"),
    [(0.2, True, ""), (-30.0, True, ""), (30.5, False, "behind"), (-400.0, False, "ahead of")],
)
def test_clock_offset_only_warns_beyond_its_threshold(offset: float, ok: bool, side: str) -> None:
    outcome = checks.clock_offset(offset, 0.01, warn_s=30)
    assert (outcome.ok, outcome.measured, outcome.expected) == (ok, offset, "|offset| <= 30 s")
    assert outcome.warn_only is not ok  # never a FAIL: a wrong clock drains nothing
    if not ok:
        assert f"s {side} the collector's (within 0.005 s)" in outcome.detail


@pytest.mark.parametrize(
    ("measured", "pin", "ok"),
    [
        ("22.05.8-4", "22.05", True),
        ("2.21.5-1+cuda12.4", "2.21.5", True),
        ("1:4.2.3-1", "4.2.3", True),
        ("570.133.20", "570.133.20", True),
        ("2.210.0-1", "2.21", False),
        ("550.54.15", "570.133.20", False),
        (None, "2.21.5", False),
        ("", "2.21.5", False),
    ],
)
def test_pinned_version(measured: str | None, pin: str, ok: bool) -> None:
    assert checks.pinned_version(measured, pin).ok is ok


def test_pinned_versions_names_each_difference() -> None:
    out = checks.pinned_versions(
        {"nccl": "2.21.5-1", "slurm": None}, {"nccl": "2.26.2", "slurm": "22.05"}
    )
    assert not out.ok
    assert out.detail == "nccl 2.21.5-1 != 2.26.2; slurm absent != 22.05"


def test_services_active() -> None:
    assert checks.services_active({"slurmd": "active"}).ok
    out = checks.services_active({"slurmd": "active", "nvidia-dcgm": "failed"})
    assert not out.ok
    assert out.detail == "nvidia-dcgm failed"


def test_dcgm_diag_real_outputs() -> None:
    failed = dcgmi.parse(
        (REAL_FIXTURES / "dcgmi/azh200doc-h200-8gpu-dcgmi-diag-r1-persistence-fail.txt").read_text()
    )
    out = checks.dcgm_diag_passed(failed)
    assert not out.ok and not out.warn_only
    assert "failed:" in out.detail
    passed = dcgmi.parse(
        (REAL_FIXTURES / "dcgmi/awsome-p4de-a100-80gb-dcgmi-diag-r2-pass.txt").read_text()
    )
    assert checks.dcgm_diag_passed(passed).ok


NOW = datetime(2026, 11, 30, 19, 0, tzinfo=UTC)


def _log(*lines: tuple[timedelta, str]) -> list[link_events.LinkEvent]:
    text = "\n".join(
        f"{(NOW - ago).strftime('%Y-%m-%dT%H:%M:%S')},000000+00:00 "
        f"mlx5_core 0000:08:00.0 ib0: Link {state}"
        for ago, state in lines
    )
    return link_events.parse(text, now=NOW)


def test_dropped_is_a_port_down_longer_than_four_minutes() -> None:
    down5 = _log((timedelta(minutes=5), "down"))
    out = flaps.dropped(down5, "ib0", now=NOW)
    assert not out.ok
    assert out.measured == "down for 300 s"
    assert flaps.dropped(_log((timedelta(minutes=3), "down")), "ib0", now=NOW).ok
    back = _log((timedelta(minutes=9), "down"), (timedelta(minutes=8), "up"))
    assert flaps.dropped(back, "ib0", now=NOW).ok
    assert flaps.dropped(down5, "ib1", now=NOW).ok
