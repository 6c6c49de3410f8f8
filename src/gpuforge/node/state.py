"""``state.json``: what one run leaves for the next (streaks, kernel-log cursor, counter samples).

Written atomically (a temporary file renamed over the old one), so a run killed mid-write (slurmd
kills HealthCheckProgram at 60 s) leaves the previous state whole. A state file that cannot be
read is replaced by a fresh one: losing streaks delays a drain by ``fail_after`` runs, it never
causes one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuforge.atomic import write_atomic

__all__ = ["STATE_SCHEMA", "Clock", "State", "Streak", "load", "save", "write_atomic"]

STATE_SCHEMA = 1


@dataclass
class Streak:
    """One check's hysteresis: consecutive FAILs, consecutive non-FAILs, and whether it holds a
    drain request (latched after ``fail_after`` FAILs, released after ``pass_after`` passes)."""

    fails: int = 0
    passes: int = 0
    latched: bool = False
    action: str | None = None
    last: str = "skip"


@dataclass(frozen=True, slots=True)
class Clock:
    """The node's clock against the collector's, measured on the last answer (``node.clock``).

    ``offset_s`` is the collector's clock less the node's at the middle of the round trip
    (positive: the node is behind), good to ``rtt_s / 2``; ``at`` the node's time of the
    measurement (epoch seconds).
    """

    offset_s: float
    rtt_s: float
    at: float

    def to_dict(self) -> dict[str, float]:
        """The JSON form."""
        return {"offset_s": self.offset_s, "rtt_s": self.rtt_s, "at": self.at}

    @classmethod
    def from_dict(cls, data: object) -> Clock | None:
        """The measurement saved in ``state.json``; None when absent or unreadable (the check
        then has no measurement: it skips)."""
        if not isinstance(data, dict):
            return None
        try:
            values = [float(data[k]) for k in ("offset_s", "rtt_s", "at")]
        except (KeyError, TypeError, ValueError):
            return None
        if not all(math.isfinite(v) for v in values):
            return None
        return cls(*values)


@dataclass
class State:
    """Everything the node checker remembers between runs."""

    boot_id: str = ""
    #: ISO time of the newest kernel-log line the passive tier has judged.
    kmsg_cursor: str | None = None
    streaks: dict[str, Streak] = field(default_factory=dict)
    #: Kernel-log lines of Xids that drain, kept until the node reboots or ``health clear``.
    sticky_xids: list[str] = field(default_factory=list)
    #: ``{counter key: [[epoch, value], ...]}`` samples inside the counters' window.
    counters: dict[str, list[list[float]]] = field(default_factory=dict)
    #: A drain was requested and not yet lifted: the next clean runs ask for a resume.
    resume_pending: bool = False
    spool_dropped: int = 0
    #: The clock against the collector's at its last answer (None: not measured yet).
    clock: Clock | None = None
    #: Why the previous state was discarded (corrupt file), reported once in the record.
    note: str = ""

    def streak(self, check: str) -> Streak:
        """The streak of ``check`` (created empty)."""
        return self.streaks.setdefault(check, Streak())

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "schema": STATE_SCHEMA,
            "boot_id": self.boot_id,
            "kmsg_cursor": self.kmsg_cursor,
            "streaks": {k: vars(v) for k, v in sorted(self.streaks.items())},
            "sticky_xids": self.sticky_xids,
            "counters": self.counters,
            "resume_pending": self.resume_pending,
            "spool_dropped": self.spool_dropped,
            "clock": self.clock.to_dict() if self.clock else None,
        }


def load(path: Path) -> State:
    """The state at ``path``; a fresh one when it is absent or unreadable (with a note)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return State()
    except (OSError, ValueError) as exc:
        return State(note=f"{path}: unreadable, started afresh ({exc})")
    try:
        if data.get("schema") != STATE_SCHEMA:
            raise ValueError(f"schema {data.get('schema')!r}")
        return State(
            boot_id=str(data.get("boot_id") or ""),
            kmsg_cursor=data.get("kmsg_cursor"),
            streaks={str(k): Streak(**v) for k, v in (data.get("streaks") or {}).items()},
            sticky_xids=[str(x) for x in data.get("sticky_xids") or []],
            counters={
                str(k): [[float(t), float(v)] for t, v in samples]
                for k, samples in (data.get("counters") or {}).items()
            },
            resume_pending=bool(data.get("resume_pending")),
            spool_dropped=int(data.get("spool_dropped") or 0),
            clock=Clock.from_dict(data.get("clock")),
        )
    except (AttributeError, TypeError, ValueError) as exc:
        return State(note=f"{path}: unreadable, started afresh ({exc})")


def save(path: Path, state: State) -> None:
    """Write ``state`` to ``path`` atomically."""
    write_atomic(path, json.dumps(state.to_dict(), indent=1, sort_keys=True) + "\n")
