"""Link flaps: how often a fabric port went down and came back within a window.

The defaults are leptonai/gpud's (``components/accelerator/nvidia/infiniband/store/
scan_flaps.go``, ``defaultIbPortFlapBackToActiveThreshold = 3``: "requires at least 3 flap
events (in the last 12 hours) to be considered as a flap"): three or more down/up cycles of one
port in 12 hours are a flap and fail the node; one or two are a warning.

Two sources, per port:

- the kernel log's ``Link down`` / ``Link up`` lines
  (:mod:`~gpuforge.validate.parsers.link_events`), which carry times, so only the cycles inside
  the window count;
- the port's ``LinkDownedCounter`` (``perfquery``, InfiniBand only), which has no times: it counts
  since the counters were last reset, at the earliest when the node booted. When the node booted
  inside the window, every downed link it counts is inside the window too; otherwise a non-zero
  counter with no dated cycle is reported as a warning (flaps of unknown age).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpuforge.validate import catalogue
from gpuforge.validate.checks import JudgeOutcome
from gpuforge.validate.parsers.link_events import LinkEvent

_PARAMS = catalogue.params("fabric.flaps")
#: gpud's flap threshold: this many down/up cycles of one port inside the window are a flap.
FLAP_CYCLES = int(_PARAMS["flaps"])
#: gpud's window for counting flap events.
WINDOW = timedelta(hours=float(_PARAMS["window_h"]))


@dataclass(frozen=True, slots=True)
class PortFlaps:
    """What the two sources say about one port."""

    netdev: str
    cycles: tuple[LinkEvent, ...]
    """The ``Link up`` events that ended a ``Link down`` inside the window."""
    older_cycles: int
    """Down/up cycles before the window (or undated)."""
    link_downed: int | None
    """``LinkDownedCounter``, or None when not read (RoCE, perfquery missing)."""
    booted_in_window: bool

    @property
    def in_window(self) -> int:
        """Down/up cycles known to lie inside the window."""
        counted = len(self.cycles)
        if self.booted_in_window and self.link_downed is not None:
            counted = max(counted, self.link_downed)
        return counted


def count(
    events: Sequence[LinkEvent],
    netdev: str,
    *,
    now: datetime,
    boot: datetime | None,
    link_downed: int | None,
    window: timedelta = WINDOW,
) -> PortFlaps:
    """Pair each ``Link down`` of ``netdev`` with the next ``Link up``; sort them by the window."""
    since = now - window
    cycles: list[LinkEvent] = []
    older = 0
    down: LinkEvent | None = None
    for event in events:
        if event.netdev != netdev:
            continue
        if not event.up:
            down = down or event
            continue
        if down is None:
            continue  # an up with no down before it: the port coming up at boot
        if event.time is not None and event.time >= since:
            cycles.append(event)
        else:
            older += 1
        down = None
    return PortFlaps(
        netdev=netdev,
        cycles=tuple(cycles),
        older_cycles=older,
        link_downed=link_downed,
        booted_in_window=boot is not None and boot >= since,
    )


def judge(
    flaps: PortFlaps, *, threshold: int = FLAP_CYCLES, window: timedelta = WINDOW
) -> JudgeOutcome:
    """Flap (not ok), warning (one or more cycles below the threshold, or of unknown age) or ok."""
    hours = f"{window.total_seconds() / 3600:g} h"
    counter = "" if flaps.link_downed is None else f", LinkDownedCounter {flaps.link_downed}"
    measured = f"{flaps.in_window} down/up in {hours}{counter}"
    expected = f"< {threshold} down/up in {hours}"
    seen = flaps.in_window
    if seen >= threshold:
        return JudgeOutcome(
            False,
            measured,
            expected,
            f"{flaps.netdev} flapped: {seen} down/up cycles in the last {hours} "
            f"(gpud counts {threshold} as a flap)",
        )
    if seen:
        return JudgeOutcome(
            False,
            measured,
            expected,
            f"{flaps.netdev} went down and up {seen} time(s) in the last {hours}",
            warn_only=True,
        )
    if flaps.link_downed or flaps.older_cycles:
        older = max(flaps.link_downed or 0, flaps.older_cycles)
        return JudgeOutcome(
            False,
            measured,
            expected,
            f"{flaps.netdev} went down {older} time(s) since its counters were reset, "
            f"none dated inside the last {hours}",
            warn_only=True,
        )
    return JudgeOutcome(True, measured, expected)


#: gpud's "drop": a port down for longer than this without coming back.
DROP_AFTER = timedelta(seconds=float(_PARAMS["down_s"]))


def dropped(
    events: Sequence[LinkEvent],
    netdev: str,
    *,
    now: datetime,
    down_s: float = DROP_AFTER.total_seconds(),
) -> JudgeOutcome:
    """The port's last event is a ``Link down`` older than ``down_s`` (gpud's drop: > 4 min).

    A port that went down moments ago may be retraining; one still down after ``down_s`` has
    dropped off the fabric. An undated ``Link down`` is not judged (its age is unknown).
    """
    last = next((e for e in reversed(events) if e.netdev == netdev), None)
    limit = f"{down_s:g} s"
    if last is None or last.up or last.time is None:
        return JudgeOutcome(
            True, "up" if last is None or last.up else "down (undated)", f"not down > {limit}"
        )
    age = (now - last.time).total_seconds()
    if age > down_s:
        return JudgeOutcome(
            False,
            f"down for {age:.0f} s",
            f"not down > {limit}",
            f"{netdev} went down at {last.time.isoformat()} and has not come back (gpud: drop)",
        )
    return JudgeOutcome(True, f"down for {age:.0f} s", f"not down > {limit}")


def judge_port(
    events: Sequence[LinkEvent],
    netdev: str,
    *,
    now: datetime,
    boot: datetime | None,
    link_downed: int | None,
    params: Mapping[str, Any] | None = None,
) -> JudgeOutcome:
    """The ``fabric.flaps`` judgement of one port, on every path: a drop, else the flap count.

    ``params``: the check's thresholds (``flaps``, ``window_h``, ``down_s``), the catalogue's
    when None (a node's health.yaml may override them).
    """
    p = {**_PARAMS, **(params or {})}
    window = timedelta(hours=float(p["window_h"]))
    found = count(events, netdev, now=now, boot=boot, link_downed=link_downed, window=window)
    flapped = judge(found, threshold=int(p["flaps"]), window=window)
    drop = dropped(events, netdev, now=now, down_s=float(p["down_s"]))
    return drop if not drop.ok else flapped
