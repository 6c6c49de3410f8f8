"""Conformance history: one row per node per nightly run, in the cluster's history database.

The tables live in the same SQLite file as the health history (:class:`HistoryStore`); they are
made by that file's migration list, from this module's steps (:mod:`conformance_tables
<gpuforge.history.conformance_tables>`), when a writer opens it. A reader (``conformance report``)
opens the file read-only and adds nothing to it: an older file without these tables reads as
having no runs. Sized for 12,500 nodes x 365 nights (4.6 million rows): a row
holds the node's outcome and, only when it did not pass, its failed checks and drift as compact
JSON (``[check, status, action]`` per failed check, ``[kind, item, desired, actual]`` per
drifted item), so a year of a healthy fleet is about 200 MB; the primary key ``(node, run_id)``
answers a node's history from the index alone (measured in ``make bench``).

Retention (:meth:`ConformanceHistory.prune`): rows of the last ``full_days`` (default 90) are
kept as they are; older ``pass`` and ``not_checked`` rows are deleted, since a run's counts stay
in ``conformance_runs`` and every non-passing row is kept for ``keep_days`` (default 400) so
repeat offenders and RMA evidence reach back a year.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpuforge.history.store import HistoryStore
from gpuforge.node.record import Drift
from gpuforge.validate.result import CheckResult, Status

#: A node's outcome in one run: the record's verdict, or why it has none.
OUTCOMES = ("pass", "warn", "fail", "error", "not_checked")
#: A run in progress, finished with every planned node accounted for, or cut short.
RUN_STATES = ("running", "complete", "partial")


@dataclass(frozen=True)
class NodeResult:
    """One node's outcome in one run.

    ``failed``: the node's checks that did not pass (nor skip), as the record's
    :class:`~gpuforge.validate.result.CheckResult`; ``drift``: its drifted items. A result keeps
    of each check what its row stores, the node, check name, status and action
    (:func:`failed_check`), so a result read back from the history equals the one written.
    """

    node: str
    outcome: str
    why: str = ""
    failed: tuple[CheckResult, ...] = ()
    drift: tuple[Drift, ...] = ()

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome: {self.outcome!r} is not one of {', '.join(OUTCOMES)}")
        kept = tuple(failed_check(self.node, c.check, c.status, c.action) for c in self.failed)
        object.__setattr__(self, "failed", kept)
        object.__setattr__(self, "drift", tuple(self.drift))

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "node": self.node,
            "outcome": self.outcome,
            "why": self.why,
            "failed": [
                {"check": c.check, "status": c.status.value, "action": c.action}
                for c in self.failed
            ],
            "drift": [d.to_dict() for d in self.drift],
        }


def failed_check(node: str, check: str, status: str, action: str = "") -> CheckResult:
    """A failed check as a conformance result keeps it: the name, status and action only (its
    row's ``[check, status, action]``)."""
    return CheckResult(node, check, Status(status), action=action)


@dataclass(frozen=True)
class ConformanceRun:
    """One conformance run."""

    id: int
    started: float
    finished: float | None
    level: str
    state: str
    nodes: int
    counts: Mapping[str, int] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "id": self.id,
            "started": self.started,
            "finished": self.finished,
            "level": self.level,
            "state": self.state,
            "nodes": self.nodes,
            "counts": dict(self.counts),
            "meta": dict(self.meta),
        }


def _run(row: Sequence[Any]) -> ConformanceRun:
    return ConformanceRun(
        id=row[0],
        started=row[1],
        finished=row[2],
        level=row[3],
        state=row[4],
        nodes=row[5],
        counts=json.loads(row[6]),
        meta=json.loads(row[7]),
    )


def _result(row: Sequence[Any]) -> NodeResult:
    node = row[0]
    return NodeResult(
        node=node,
        outcome=row[1],
        why=row[2],
        failed=tuple(failed_check(node, c, s, a) for c, s, a in json.loads(row[3])),
        drift=tuple(Drift(k, i, d, a) for k, i, d, a in json.loads(row[4])),
    )


def _failed_json(result: NodeResult) -> str:
    """The row's ``failed`` column: ``[[check, status, action], ...]``."""
    rows = [[c.check, c.status.value, c.action] for c in result.failed]
    return json.dumps(rows, separators=(",", ":"))


def _drift_json(result: NodeResult) -> str:
    """The row's ``drift`` column: ``[[kind, item, desired, actual], ...]``."""
    rows = [[d.kind, d.item, d.desired, d.actual] for d in result.drift]
    return json.dumps(rows, separators=(",", ":"))


_RUN_COLS = "id, started, finished, level, state, nodes, counts, meta"
_RESULT_COLS = "node, outcome, why, failed, drift"


class ConformanceHistory:
    """The conformance tables of one cluster's history database."""

    def __init__(self, store: HistoryStore) -> None:
        self.store = store
        #: False only on a read-only open of a history written before these tables existed.
        self.present = store.has_table("conformance_runs")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection | None]:
        """A read transaction, or None when the tables are absent (nothing recorded yet)."""
        if not self.present:
            yield None
            return
        with self.store.read() as db:
            yield db

    # -- runs

    def begin(
        self, level: str, nodes: int, *, at: float | None = None, meta: Any = None
    ) -> ConformanceRun:
        """Record a new run as ``running`` and return it."""
        started = time.time() if at is None else at
        with self.store.transaction() as db:
            cur = db.execute(
                "INSERT INTO conformance_runs (started, level, state, nodes, meta)"
                " VALUES (?, ?, 'running', ?, ?)",
                (started, level, nodes, json.dumps(meta or {}, sort_keys=True)),
            )
            run_id = int(cur.lastrowid or 0)
        return ConformanceRun(run_id, started, None, level, "running", nodes, {}, dict(meta or {}))

    def update_meta(self, run_id: int, meta: Mapping[str, Any]) -> None:
        """Merge ``meta`` into the run's (the job id, once sbatch answered)."""
        with self.store.transaction() as db:
            row = db.execute("SELECT meta FROM conformance_runs WHERE id = ?", (run_id,)).fetchone()
            merged = {**json.loads(row[0] if row else "{}"), **meta}
            db.execute(
                "UPDATE conformance_runs SET meta = ? WHERE id = ?",
                (json.dumps(merged, sort_keys=True), run_id),
            )

    def add(self, run_id: int, results: Iterable[NodeResult]) -> int:
        """Store (or replace) node results of a run in one transaction; returns how many."""
        rows = [
            (
                r.node,
                run_id,
                r.outcome,
                r.why,
                _failed_json(r),
                _drift_json(r),
            )
            for r in results
        ]
        with self.store.transaction() as db:
            db.executemany(
                "INSERT OR REPLACE INTO conformance_results VALUES (?, ?, ?, ?, ?, ?)", rows
            )
        return len(rows)

    def finish(self, run_id: int, state: str, *, at: float | None = None) -> ConformanceRun:
        """Close the run as ``complete`` or ``partial`` with its counts."""
        if state not in RUN_STATES[1:]:
            raise ValueError(f"state: {state!r}")
        with self.store.transaction() as db:
            counts = dict(
                db.execute(
                    "SELECT outcome, COUNT(*) FROM conformance_results WHERE run_id = ?"
                    " GROUP BY outcome",
                    (run_id,),
                ).fetchall()
            )
            db.execute(
                "UPDATE conformance_runs SET state = ?, finished = ?, counts = ? WHERE id = ?",
                (state, time.time() if at is None else at, json.dumps(counts), run_id),
            )
        run = self.run(run_id)
        assert run is not None  # noqa: S101 - just written
        return run

    def run(self, run_id: int) -> ConformanceRun | None:
        """Run ``run_id``."""
        with self._read() as db:
            if db is None:
                return None
            row = db.execute(
                f"SELECT {_RUN_COLS} FROM conformance_runs WHERE id = ?",  # noqa: S608
                (run_id,),
            ).fetchone()
        return None if row is None else _run(row)

    def runs(self, limit: int = 30) -> list[ConformanceRun]:
        """The newest ``limit`` runs, newest first."""
        with self._read() as db:
            if db is None:
                return []
            rows = db.execute(
                f"SELECT {_RUN_COLS} FROM conformance_runs ORDER BY id DESC LIMIT ?",  # noqa: S608
                (limit,),
            ).fetchall()
        return [_run(r) for r in rows]

    def unfinished(self) -> ConformanceRun | None:
        """The newest run still marked ``running`` (a killed run's), or None."""
        return next((r for r in self.runs(50) if r.state == "running"), None)

    def results(self, run_id: int) -> dict[str, NodeResult]:
        """Every node result of a run."""
        with self._read() as db:
            if db is None:
                return {}
            rows = db.execute(
                f"SELECT {_RESULT_COLS} FROM conformance_results WHERE run_id = ?",  # noqa: S608
                (run_id,),
            ).fetchall()
        return {r[0]: _result(r) for r in rows}

    def node_history(self, node: str, limit: int = 365) -> list[tuple[ConformanceRun, NodeResult]]:
        """``node``'s results, newest first, with their runs."""
        with self._read() as db:
            if db is None:
                return []
            rows = db.execute(
                f"SELECT {', '.join('r.' + c.strip() for c in _RUN_COLS.split(','))},"  # noqa: S608
                " c.node, c.outcome, c.why, c.failed, c.drift"
                " FROM conformance_results c JOIN conformance_runs r ON r.id = c.run_id"
                " WHERE c.node = ? ORDER BY c.run_id DESC LIMIT ?",
                (node, limit),
            ).fetchall()
        return [(_run(r[:8]), _result(r[8:])) for r in rows]

    def failures_since(self, since: float) -> dict[str, int]:
        """Failed runs per node since ``since`` (repeat offenders: two or more in 7 days)."""
        with self._read() as db:
            if db is None:
                return {}
            rows = db.execute(
                "SELECT c.node, COUNT(*) FROM conformance_results c"
                " JOIN conformance_runs r ON r.id = c.run_id"
                " WHERE r.started >= ? AND c.outcome = 'fail' GROUP BY c.node",
                (since,),
            ).fetchall()
        return dict(rows)

    def prune(
        self, *, now: float | None = None, full_days: float = 90.0, keep_days: float = 400.0
    ) -> int:
        """Apply the retention policy (module docstring); returns rows deleted."""
        at = time.time() if now is None else now
        with self.store.transaction() as db:
            old = at - full_days * 86400
            gone = db.execute(
                "DELETE FROM conformance_results WHERE outcome IN ('pass', 'not_checked')"
                " AND run_id IN (SELECT id FROM conformance_runs WHERE started < ?)",
                (old,),
            ).rowcount
            ancient = at - keep_days * 86400
            gone += db.execute(
                "DELETE FROM conformance_results"
                " WHERE run_id IN (SELECT id FROM conformance_runs WHERE started < ?)",
                (ancient,),
            ).rowcount
        return int(gone)
