"""The rollout's record: one SQLite database per cluster.

Every change is a transaction (``BEGIN IMMEDIATE`` … ``COMMIT``) on a database in WAL mode, so a
process killed at any instant leaves either the old record or the new one, never half of a change.
``synchronous=NORMAL`` is enough for that: a committed transaction is in the WAL before ``COMMIT``
returns and survives the death of the process; only a power cut can lose the newest transactions
(never corrupt older ones), and a re-run redoes those steps because every step is idempotent.
A node's lifecycle is::

    new → provisioning → provisioned → validating → admitted | quarantined | unreachable

and every transition is kept with its run, reason and time.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from gpuforge import database
from gpuforge.database import Database, Foreign, Schema, Step
from gpuforge.errors import InputError, OperationError
from gpuforge.upgrade import tables as upgrade_tables


class NodeState(StrEnum):
    NEW = "new"
    PROVISIONING = "provisioning"
    PROVISIONED = "provisioned"
    VALIDATING = "validating"
    ADMITTED = "admitted"
    QUARANTINED = "quarantined"
    UNREACHABLE = "unreachable"


# Which states a node may move to from each state. Any state may go back to PROVISIONING (a redo
# or a repair) or to UNREACHABLE (preflight found it gone).
_ALLOWED: dict[NodeState, frozenset[NodeState]] = {
    NodeState.NEW: frozenset({NodeState.PROVISIONING, NodeState.VALIDATING}),
    NodeState.PROVISIONING: frozenset({NodeState.PROVISIONED, NodeState.QUARANTINED}),
    NodeState.PROVISIONED: frozenset({NodeState.VALIDATING}),
    NodeState.VALIDATING: frozenset(
        {NodeState.ADMITTED, NodeState.QUARANTINED, NodeState.PROVISIONED}
    ),
    NodeState.ADMITTED: frozenset({NodeState.VALIDATING, NodeState.QUARANTINED}),
    NodeState.QUARANTINED: frozenset({NodeState.VALIDATING, NodeState.ADMITTED}),
    NodeState.UNREACHABLE: frozenset({NodeState.VALIDATING}),
}
_ALWAYS_ALLOWED = frozenset({NodeState.PROVISIONING, NodeState.UNREACHABLE})

_V1 = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (
    hostname   TEXT PRIMARY KEY,
    phase      INTEGER NOT NULL,
    state      TEXT NOT NULL,
    reason     TEXT NOT NULL DEFAULT '',
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    phase       INTEGER NOT NULL,
    level       TEXT NOT NULL,
    operator    TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    started_at  REAL NOT NULL,
    finished_at REAL,
    status      TEXT NOT NULL DEFAULT 'running',
    detail      TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS transitions (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id     INTEGER REFERENCES runs(id),
    hostname   TEXT NOT NULL REFERENCES nodes(hostname),
    from_state TEXT NOT NULL,
    to_state   TEXT NOT NULL,
    reason     TEXT NOT NULL,
    at         REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS check_results (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id     INTEGER NOT NULL REFERENCES runs(id),
    hostname   TEXT NOT NULL,
    check_name TEXT NOT NULL,
    status     TEXT NOT NULL,
    measured   TEXT NOT NULL,
    expected   TEXT NOT NULL,
    evidence   TEXT NOT NULL,
    duration_s REAL NOT NULL,
    at         REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS gates (
    run_id    INTEGER PRIMARY KEY REFERENCES runs(id),
    phase     INTEGER NOT NULL,
    passed    INTEGER NOT NULL,
    admitted  INTEGER NOT NULL,
    total     INTEGER NOT NULL,
    required  REAL NOT NULL,
    detail    TEXT NOT NULL,
    at        REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS overrides (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id   INTEGER REFERENCES runs(id),
    phase    INTEGER NOT NULL,
    kind     TEXT NOT NULL,
    reason   TEXT NOT NULL,
    operator TEXT NOT NULL,
    at       REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS transitions_by_host ON transitions(hostname);
CREATE INDEX IF NOT EXISTS results_by_run ON check_results(run_id);
-- What gpuforge before the database module read as the schema version (kept for it).
INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', '1');
"""

OWNER = "gpuforge.rollout.state"

#: Each step of the record, in order (the file's one migration list), with its owner: this
#: module's tables, then the upgrade's (:mod:`gpuforge.upgrade.tables`). A new step is appended.
STEPS: tuple[Step, ...] = (Step(OWNER, _V1), *upgrade_tables.STEPS)


def _legacy(conn: sqlite3.Connection) -> int:
    """The version of a record written before application ids: its ``meta`` says 1."""
    names = database.tables(conn)
    if not names:
        return 0
    if "meta" not in names or "nodes" not in names:
        raise Foreign("no rollout tables: another program's file")
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    try:
        return int(row[0]) if row is not None else 1
    except ValueError:
        raise Foreign(f"its meta table says schema_version={row[0]!r}") from None


def _recovery(backups: str = "") -> str:
    return (
        f"move it aside (keep it for the record){backups} and run `gpuforge deploy` again: "
        "nodes missing from the record are provisioned (idempotent) and validated again"
    )


#: The rollout record (``rollout.db``): application id ``GFRO``.
SCHEMA = Schema(
    kind="rollout record",
    application_id=0x4746524F,
    steps=STEPS,
    legacy=_legacy,
    recovery=_recovery(),
    foreign_keys=True,
)
SCHEMA_VERSION = SCHEMA.version


@dataclass(frozen=True, slots=True)
class NodeRecord:
    hostname: str
    phase: int
    state: NodeState
    reason: str
    updated_at: float


@dataclass(frozen=True, slots=True)
class GateRecord:
    run_id: int
    phase: int
    passed: bool
    admitted: int
    total: int
    required: float
    detail: str
    at: float


@dataclass(frozen=True, slots=True)
class RunRecord:
    id: int
    phase: int
    level: str
    operator: str
    started_at: float
    finished_at: float | None
    status: str
    detail: str


@dataclass(frozen=True, slots=True)
class ResultRow:
    """One check result as the store keeps it (values already rendered to text)."""

    hostname: str
    check: str
    status: str
    measured: str
    expected: str
    evidence: str
    duration_s: float


class StateStore:
    """The rollout record of one cluster. Open with :func:`open_store`."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._conn = db.conn
        self.path = db.path

    def close(self) -> None:
        self.db.close()

    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self.db.damage_is_input_error():
            return self._conn.execute(sql, args).fetchall()

    def _one(self, sql: str, args: Sequence[Any] = ()) -> Any:
        with self.db.damage_is_input_error():
            return self._conn.execute(sql, args).fetchone()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Run a block as one immediate transaction: all of it lands, or none of it."""
        with self.db.transaction() as conn:
            yield conn

    # -- nodes -------------------------------------------------------------------------------

    def register_nodes(self, nodes: Iterable[tuple[str, int]]) -> int:
        """Add nodes (hostname, phase) not yet known, in state ``new``; return how many."""
        now = time.time()
        with self.transaction() as db:
            before = db.total_changes
            db.executemany(
                "INSERT OR IGNORE INTO nodes(hostname, phase, state, updated_at) VALUES (?,?,?,?)",
                [(h, p, NodeState.NEW.value, now) for h, p in nodes],
            )
            return db.total_changes - before

    def nodes(self, phase: int | None = None) -> list[NodeRecord]:
        sql = "SELECT hostname, phase, state, reason, updated_at FROM nodes"
        args: tuple[Any, ...] = ()
        if phase is not None:
            sql += " WHERE phase = ?"
            args = (phase,)
        rows = self._all(sql + " ORDER BY phase, hostname", args)
        return [NodeRecord(r[0], r[1], NodeState(r[2]), r[3], r[4]) for r in rows]

    def node(self, hostname: str) -> NodeRecord:
        row = self._one(
            "SELECT hostname, phase, state, reason, updated_at FROM nodes WHERE hostname = ?",
            (hostname,),
        )
        if row is None:
            raise InputError(f"node {hostname!r} is not in the rollout record {self.path}")
        return NodeRecord(row[0], row[1], NodeState(row[2]), row[3], row[4])

    def transition(
        self,
        hostnames: Iterable[str],
        to_state: NodeState,
        reason: str,
        run_id: int | None,
        reasons: dict[str, str] | None = None,
    ) -> None:
        """Move nodes to ``to_state`` in one transaction, recording each transition.

        ``reasons`` overrides ``reason`` per host. A move the lifecycle does not allow raises
        :class:`OperationError` and changes nothing.
        """
        now = time.time()
        with self.transaction() as db:
            for host in hostnames:
                row = db.execute("SELECT state FROM nodes WHERE hostname = ?", (host,)).fetchone()
                if row is None:
                    raise OperationError(f"node {host!r} is not registered in the rollout record")
                current = NodeState(row[0])
                if current == to_state:
                    continue
                if to_state not in _ALLOWED[current] | _ALWAYS_ALLOWED:
                    raise OperationError(
                        f"node {host}: {current.value} → {to_state.value} is not a lifecycle step"
                    )
                why = (reasons or {}).get(host, reason)
                db.execute(
                    "UPDATE nodes SET state = ?, reason = ?, updated_at = ? WHERE hostname = ?",
                    (to_state.value, why, now, host),
                )
                db.execute(
                    "INSERT INTO transitions(run_id, hostname, from_state, to_state, reason, at)"
                    " VALUES (?,?,?,?,?,?)",
                    (run_id, host, current.value, to_state.value, why, now),
                )

    def transitions(self, hostname: str) -> list[tuple[str, str, str, float]]:
        """(from, to, reason, at) for one node, oldest first."""
        rows = self._all(
            "SELECT from_state, to_state, reason, at FROM transitions"
            " WHERE hostname = ? ORDER BY id",
            (hostname,),
        )
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    # -- runs --------------------------------------------------------------------------------

    def start_run(self, phase: int, level: str, operator: str) -> int:
        with self.transaction() as db:
            # A run left 'running' by a process that died is closed as interrupted first.
            db.execute(
                "UPDATE runs SET status = 'interrupted', finished_at = ? "
                "WHERE status = 'running' AND phase = ?",
                (time.time(), phase),
            )
            cur = db.execute(
                "INSERT INTO runs(phase, level, operator, pid, started_at) VALUES (?,?,?,?,?)",
                (phase, level, operator, os.getpid(), time.time()),
            )
            return int(cur.lastrowid or 0)

    def finish_run(self, run_id: int, status: str, detail: str = "") -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE runs SET status = ?, detail = ?, finished_at = ? WHERE id = ?",
                (status, detail, time.time(), run_id),
            )

    def runs(self, phase: int | None = None) -> list[RunRecord]:
        sql = "SELECT id, phase, level, operator, started_at, finished_at, status, detail FROM runs"
        args: tuple[Any, ...] = ()
        if phase is not None:
            sql += " WHERE phase = ?"
            args = (phase,)
        rows = self._all(sql + " ORDER BY id", args)
        return [RunRecord(*r) for r in rows]

    # -- results, gates, overrides -----------------------------------------------------------

    def record_results(self, run_id: int, results: Iterable[ResultRow]) -> None:
        now = time.time()
        with self.transaction() as db:
            db.executemany(
                "INSERT INTO check_results(run_id, hostname, check_name, status, measured,"
                " expected, evidence, duration_s, at) VALUES (?,?,?,?,?,?,?,?,?)",
                [
                    (
                        run_id,
                        r.hostname,
                        r.check,
                        r.status,
                        r.measured,
                        r.expected,
                        r.evidence,
                        r.duration_s,
                        now,
                    )
                    for r in results
                ],
            )

    def results(self, run_id: int) -> list[ResultRow]:
        rows = self._all(
            "SELECT hostname, check_name, status, measured, expected, evidence, duration_s"
            " FROM check_results WHERE run_id = ? ORDER BY id",
            (run_id,),
        )
        return [ResultRow(*r) for r in rows]

    def latest_measured(
        self, hosts: Sequence[str], checks: Sequence[str]
    ) -> dict[str, dict[str, float]]:
        """``check -> {host: value}``: the last numeric value recorded for each host and check.

        What an admitted node measured when it was validated, so that it can join the peer
        comparison of a later batch without being tested again. Non-numeric values are skipped.
        """
        out: dict[str, dict[str, float]] = {}
        wanted = list(dict.fromkeys(hosts))
        marks = ",".join("?" * len(checks))
        for start in range(0, len(wanted), 500):  # under SQLite's bound-parameter limit
            chunk = wanted[start : start + 500]
            rows = self._all(
                f"SELECT hostname, check_name, measured FROM check_results"  # noqa: S608
                f" WHERE hostname IN ({','.join('?' * len(chunk))})"
                f" AND check_name IN ({marks}) ORDER BY id",
                (*chunk, *checks),
            )
            for host, check, measured in rows:
                try:
                    out.setdefault(check, {})[host] = float(measured)
                except (TypeError, ValueError):
                    continue
        return out

    def record_gate(self, gate: GateRecord) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO gates(run_id, phase, passed, admitted, total, required,"
                " detail, at) VALUES (?,?,?,?,?,?,?,?)",
                (
                    gate.run_id,
                    gate.phase,
                    int(gate.passed),
                    gate.admitted,
                    gate.total,
                    gate.required,
                    gate.detail,
                    gate.at,
                ),
            )

    def last_gate(self, phase: int) -> GateRecord | None:
        row = self._one(
            "SELECT run_id, phase, passed, admitted, total, required, detail, at FROM gates"
            " WHERE phase = ? ORDER BY run_id DESC LIMIT 1",
            (phase,),
        )
        if row is None:
            return None
        return GateRecord(row[0], row[1], bool(row[2]), row[3], row[4], row[5], row[6], row[7])

    def record_override(
        self, run_id: int | None, phase: int, kind: str, reason: str, operator: str
    ) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO overrides(run_id, phase, kind, reason, operator, at)"
                " VALUES (?,?,?,?,?,?)",
                (run_id, phase, kind, reason, operator, time.time()),
            )

    def overrides(self) -> list[dict[str, Any]]:
        rows = self._all(
            "SELECT run_id, phase, kind, reason, operator, at FROM overrides ORDER BY id"
        )
        keys = ("run_id", "phase", "kind", "reason", "operator", "at")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def dump(self) -> dict[str, Any]:
        """The whole record as plain data (for ``status --json`` and reports)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "nodes": [
                {
                    "hostname": n.hostname,
                    "phase": n.phase,
                    "state": n.state.value,
                    "reason": n.reason,
                }
                for n in self.nodes()
            ],
            "runs": [
                {
                    "id": r.id,
                    "phase": r.phase,
                    "level": r.level,
                    "status": r.status,
                    "detail": r.detail,
                }
                for r in self.runs()
            ],
            "overrides": self.overrides(),
        }


def open_store(path: Path, *, readonly: bool = False) -> StateStore:
    """Open (creating if needed, unless ``readonly``) the record at ``path``.

    A record that cannot be read (truncated, even to 0 bytes, corrupt, not a database, another
    program's, a newer schema) raises :class:`InputError` saying how to recover; it is never
    modified. Before a migration to a newer schema, a copy of the record is kept beside it
    (``rollout.db.v1.bak``). ``readonly`` (``status``): the record must exist and is not changed.
    """
    path = Path(path)
    backups = sorted(path.parent.glob(f"{path.name}.v*.bak")) if path.parent.is_dir() else []
    schema = SCHEMA
    if backups:
        schema = replace(SCHEMA, recovery=_recovery(f", or restore the copy {backups[-1]}"))
    return StateStore(database.open_database(path, schema, readonly=readonly))
