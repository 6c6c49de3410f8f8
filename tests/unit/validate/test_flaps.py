"""Link flap judgement: gpud's 3 down/up cycles in 12 h fail, fewer warn."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuforge.validate import flaps
from gpuforge.validate.checks import JudgeOutcome
from gpuforge.validate.parsers import link_events

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def log(*cycles_hours_ago: float, netdev: str = "ib0") -> list[link_events.LinkEvent]:
    lines = []
    for hours in cycles_hours_ago:
        for up, offset in ((False, 60), (True, 0)):
            when = NOW - timedelta(hours=hours, seconds=offset)
            stamp = when.strftime("%Y-%m-%dT%H:%M:%S,000000+00:00")
            lines.append(f"{stamp} mlx5_core 0000:19:00.0 {netdev}: Link {'up' if up else 'down'}")
    return link_events.parse("\n".join(lines), now=NOW)


def judge(
    events: list[link_events.LinkEvent],
    *,
    link_downed: int | None = None,
    boot: datetime = NOW - timedelta(days=3),
) -> JudgeOutcome:
    found = flaps.count(events, "ib0", now=NOW, boot=boot, link_downed=link_downed)
    return flaps.judge(found)


def test_three_cycles_in_the_window_are_a_flap() -> None:
    got = judge(log(1, 5, 11))
    assert not got.ok and not got.warn_only
    assert got.measured == "3 down/up in 12 h"
    assert "flapped" in got.detail


def test_one_cycle_is_a_warning() -> None:
    got = judge(log(2))
    assert (got.ok, got.warn_only) == (False, True)


def test_cycles_before_the_window_or_on_another_port_do_not_count() -> None:
    got = judge(log(13, 20, 30) + log(1, 2, 3, netdev="ib1"))
    assert (got.ok, got.warn_only) == (False, True)  # old flaps: a warning of unknown age
    assert got.measured == "0 down/up in 12 h"
    assert judge(log(1, 2, 3, netdev="ib1")).ok


def test_the_counter_counts_inside_the_window_when_the_node_booted_inside_it() -> None:
    booted = NOW - timedelta(hours=2)
    got = judge([], link_downed=4, boot=booted)
    assert not got.ok and not got.warn_only
    assert got.measured == "4 down/up in 12 h, LinkDownedCounter 4"
    old = judge([], link_downed=4)
    assert (old.ok, old.warn_only) == (False, True)


def test_a_quiet_port_passes() -> None:
    assert judge([], link_downed=0).ok
    assert judge(link_events.parse("", now=NOW)).ok
