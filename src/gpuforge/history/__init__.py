"""The controller's state store for day-2 health: verdicts, counters, events (SQLite, WAL).

One file per cluster, ``<state>/<cluster>/history.db`` (:func:`history_path`), written by the
collector (``gpuforge health serve``) and read by ``gpuforge health history``, ``gpuforge fleet
status`` and the exporters. :class:`HistoryStore` is the API; docs/health.md ("Controller:
collector, decisions, history") says what is kept and for how long.
"""

from __future__ import annotations

from gpuforge.history.store import (
    EVENT_KINDS,
    SCHEMA_VERSION,
    HistoryEntry,
    HistoryEvent,
    HistoryStore,
    LatestRow,
    Retention,
    Snapshot,
    history_path,
)

__all__ = [
    "EVENT_KINDS",
    "SCHEMA_VERSION",
    "HistoryEntry",
    "HistoryEvent",
    "HistoryStore",
    "LatestRow",
    "Retention",
    "Snapshot",
    "history_path",
]
