"""Network link down/up events in a kernel log or journal, with their times.

Recognised lines (the netdev is the port's Linux interface):

- the mlx5 driver's carrier reports, ``mlx5_core 0000:08:00.7 ens9f0v5: Link down`` and
  ``... enp4s0f0np0: Link up`` (Linux ``drivers/net/ethernet/mellanox/mlx5/core/en_main.c``);
- systemd-networkd's ``ib6: lost carrier`` / ``ib6: Gained carrier`` (journal or syslog).

Times come from ``dmesg --time-format iso`` (``2025-08-17T06:18:01,123456+00:00``),
``journalctl -o short-iso`` (``2025-08-17T06:18:01+0000 host kernel: ...``), syslog
(``Aug 17 06:18:01 host ...``: the year is taken from ``now``) or plain ``dmesg``
(``[ 1843.308145]``: seconds since boot, placed with ``boot``). A line without a time keeps
``time=None``; the caller decides what an undated event counts for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gpuforge.validate.parsers._common import split_lines

_ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
_STAMPS = (
    re.compile(rf"^(?:\w+\s*:\s*\w+\s*:\s*)?(?P<iso>{_ISO})\s+(?:\S+\s+\S+:\s+)?"),
    re.compile(r"^(?P<syslog>[A-Z][a-z]{2}\s+\d+\s+\d\d:\d\d:\d\d)\s+\S+\s+\S+:\s+"),
    re.compile(r"^(?:\w+\s*:\s*\w+\s*:\s*)?\[\s*(?P<mono>\d+\.\d+)\]\s*"),
)
_MLX5 = re.compile(r"\bmlx5_core [0-9A-Fa-f:.]+ (?P<netdev>[\w.-]+): Link (?P<state>up|down)\b")
_NETWORKD = re.compile(r"\b(?P<netdev>[\w.-]+): (?P<state>lost carrier|Gained carrier)\b")


@dataclass(frozen=True, slots=True)
class LinkEvent:
    """One link state change of one netdev."""

    line: int
    time: datetime | None
    netdev: str
    up: bool
    text: str


def _time(match: re.Match[str], *, now: datetime, boot: datetime | None) -> datetime | None:
    if match.groupdict().get("iso"):
        stamp = match["iso"].replace(",", ".")
        stamp = re.sub(r"([+-]\d\d)(\d\d)$", r"\1:\2", stamp).replace("Z", "+00:00")
        parsed = datetime.fromisoformat(stamp)
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    if match.groupdict().get("syslog"):
        parsed = datetime.strptime(f"{now.year} {match['syslog']}", "%Y %b %d %H:%M:%S")
        parsed = parsed.replace(tzinfo=now.tzinfo or UTC)
        # Syslog has no year: a date after now is last year's.
        return parsed.replace(year=now.year - 1) if parsed > now + timedelta(days=1) else parsed
    if match.groupdict().get("mono") and boot is not None:
        return boot + timedelta(seconds=float(match["mono"]))
    return None


def parse(text: str, *, now: datetime, boot: datetime | None = None) -> list[LinkEvent]:
    """Every link down/up line of ``text``, in order. Empty text has no events."""
    events: list[LinkEvent] = []
    for number, line in enumerate(split_lines(text), start=1):
        found = _MLX5.search(line)
        if found is not None:
            up = found["state"] == "up"
        else:
            found = _NETWORKD.search(line)
            if found is None:
                continue
            up = found["state"] == "Gained carrier"
        when: datetime | None = None
        for stamp in _STAMPS:
            match = stamp.match(line)
            if match is not None:
                when = _time(match, now=now, boot=boot)
                break
        events.append(LinkEvent(number, when, found["netdev"], up, line.strip()))
    return events
