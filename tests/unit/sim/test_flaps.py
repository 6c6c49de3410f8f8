"""The simulator's link flaps: dated kernel-log lines and perfquery's LinkDownedCounter."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuforge.validate import flaps
from gpuforge.validate.parsers import link_events, perfquery
from tests.unit.sim.conftest import Runner


def test_perfquery_counts_the_flaps_of_a_port(sim: Runner) -> None:
    flapping = perfquery.parse(sim("gpu005", "perfquery", "-C", "mlx5_3", "-P", "1").stdout)
    assert flapping.link_downed == 3
    healthy = perfquery.parse(sim("gpu001", "perfquery", "-C", "mlx5_0", "-P", "1").stdout)
    assert healthy.link_downed == 0
    down = sim("gpu005", "perfquery", "-C", "mlx5_0", "-P", "1")
    assert down.returncode == 255 and "iberror" in down.stderr


def test_dmesg_dates_the_flaps_inside_gpuds_window(sim: Runner) -> None:
    out = sim("gpu005", "dmesg", "--time-format", "iso").stdout
    now = datetime.now(UTC)
    found = flaps.count(link_events.parse(out, now=now), "ib3", now=now, boot=None, link_downed=3)
    assert len(found.cycles) == 3
    assert not flaps.judge(found).ok
