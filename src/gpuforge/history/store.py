"""The history store: what the nodes reported and what gpuforge did about it, per cluster.

Sized for 12,500 nodes pushing a record every 5 minutes (42 records/s), the store keeps:

* ``latest``: the newest record of every node and tier, in full (one row each, replaced);
  newest in the collector's order, never by the node's clock (below, "Order");
* ``verdicts``: every verdict *change* of a node and tier (a change is a different verdict or a
  different set of non-passing checks and actions), and in ``change_records`` the full record
  that made it: 30 days for a change between pass and warn, the whole retention otherwise;
* ``snapshots``: a node's counters at most once an hour, and only when they differ from its
  previous snapshot (or when its verdict changed): an unchanged counter set is not stored again,
  so a healthy node costs a row only when a counter moves. Dense time series are Prometheus's;
* ``events``: kernel-log events the nodes report (``xid``, ...) and the controller's own
  (``drain``, ``resume``, ``refused``, ``failure``, ``remediation``, ``rma``), each once.
  A node's event without a time (``"time": null``, which the record schema allows) is stored at
  its record's ``started`` time.

Order: a record becomes its node's latest (of its tier) when it arrives, whatever its
``started`` says, unless the node's sequence number says it was overtaken in flight (a record
whose sequence is below the latest's; the collector's authentication refuses a replayed or older
sequence before it gets here). A node whose clock jumped backwards, or one dated long ago, cannot
freeze the node's state: the next record it sends still changes the verdict and records the
failure. The node's own time stays data: ``latest.at``, the time (``at``) of the verdict changes,
events and snapshots it causes. ``received`` is the collector's clock: in ``latest`` (what fleet
status measures staleness from), and in ``verdicts`` and ``events`` (schema step 4), by which
:meth:`HistoryStore.node_history` orders and filters a node's history (what ``health history``
shows, both times beside each other). An event the controller writes (a drain, a remediation) is
received when it is written: its ``at`` is the controller's clock already.

Retention (:class:`Retention`, applied by :meth:`HistoryStore.prune`): snapshots 30 days, verdict
changes and events 400 days, the records of pass/warn changes 30 days; latest rows are kept while
the node reports. Every write is one transaction; records of one batch share one (the collector
batches them).

A file that is not a history database of this or an older schema version is refused with an
:class:`~gpuforge.errors.InputError` naming it, and is never written to.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuforge import database
from gpuforge.database import Database, Foreign, Schema, Step
from gpuforge.errors import InputError
from gpuforge.history import conformance_tables
from gpuforge.state_paths import StatePaths

#: What the ``meta`` table's ``app`` key holds in a history database (how a file written before
#: application ids is recognised).
APP = "gpuforge.history"
#: Event kinds in the store. Nodes report ``xid`` (and other kernel-log events); the controller
#: writes the decisions (``drain``, ``resume``, ``refused``, ``hold``), ``failure`` when a node's
#: verdict turns to fail, and the remediation and RMA steps (``remediation``, ``rma``).
EVENT_KINDS = ("xid", "drain", "resume", "refused", "hold", "failure", "remediation", "rma")
#: Seconds between two counter snapshots of one node (unless its verdict changes).
SNAPSHOT_INTERVAL_S = 3600.0
#: Verdicts a record may carry.
VERDICTS = ("pass", "warn", "fail", "error")

_V1 = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS latest (
    node TEXT NOT NULL,
    tier TEXT NOT NULL,
    at REAL NOT NULL,           -- the record's start time (epoch seconds)
    received REAL NOT NULL,     -- when the controller stored it
    verdict TEXT NOT NULL,
    signature TEXT NOT NULL,    -- non-passing checks: check=status[:action],...
    request TEXT,               -- JSON of the record's request, or NULL
    record TEXT NOT NULL,       -- the whole record, JSON
    PRIMARY KEY (node, tier)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS verdicts (
    id INTEGER PRIMARY KEY,
    node TEXT NOT NULL,
    tier TEXT NOT NULL,
    at REAL NOT NULL,
    verdict TEXT NOT NULL,
    previous TEXT,              -- the verdict before, NULL for a node's first record
    signature TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS verdicts_node ON verdicts (node, at);
CREATE INDEX IF NOT EXISTS verdicts_at ON verdicts (at);
-- The full record of a change, apart so that a roll-up frees whole pages for reuse.
CREATE TABLE IF NOT EXISTS change_records (
    id INTEGER PRIMARY KEY,     -- verdicts.id
    record BLOB NOT NULL        -- zlib-compressed JSON
);
CREATE TABLE IF NOT EXISTS snapshots (
    id INTEGER PRIMARY KEY,
    node TEXT NOT NULL,
    at REAL NOT NULL,
    tier TEXT NOT NULL,
    verdict TEXT NOT NULL,
    digest TEXT NOT NULL,
    counters BLOB NOT NULL      -- zlib-compressed JSON {name: value}
);
CREATE INDEX IF NOT EXISTS snapshots_node ON snapshots (node, at);
CREATE INDEX IF NOT EXISTS snapshots_at ON snapshots (at);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    node TEXT NOT NULL,
    kind TEXT NOT NULL,
    check_name TEXT NOT NULL DEFAULT '',
    action TEXT NOT NULL DEFAULT '',
    code INTEGER,
    gpu INTEGER,
    source TEXT NOT NULL DEFAULT '',
    detail TEXT NOT NULL DEFAULT '',
    data TEXT NOT NULL DEFAULT '{}',
    key TEXT UNIQUE             -- node-reported events: stored once however often re-sent
);
CREATE INDEX IF NOT EXISTS events_node ON events (node, at);
CREATE INDEX IF NOT EXISTS events_kind ON events (kind, at);
-- How gpuforge before the database module recognised the file (kept for it).
INSERT OR IGNORE INTO meta VALUES ('app', 'gpuforge.history'), ('schema_version', '1');
"""

#: Version 3: the order of a node's records is the collector's, not the node's clock. ``seq`` is
#: the node's sequence number of the latest record (its munge credential's, NULL when it came
#: without one); ``snapshots_arrival`` finds a node's newest snapshot in the order it was stored.
_V3 = """
ALTER TABLE latest ADD COLUMN seq INTEGER;
CREATE INDEX IF NOT EXISTS snapshots_arrival ON snapshots (node, id);
"""

#: Version 4: a node's history in the order the collector received it. ``received`` (the
#: collector's clock) on ``verdicts`` and ``events``; rows of an older file take their own time
#: (``at``), the only one they have. Nullable only because ``ALTER TABLE`` cannot add a NOT NULL
#: column without a default: every writer sets it.
_V4 = """
ALTER TABLE verdicts ADD COLUMN received REAL;
UPDATE verdicts SET received = at;
CREATE INDEX IF NOT EXISTS verdicts_arrival ON verdicts (node, received, at);
ALTER TABLE events ADD COLUMN received REAL;
UPDATE events SET received = at;
CREATE INDEX IF NOT EXISTS events_arrival ON events (node, received, at);
"""

OWNER = "gpuforge.history.store"

#: Each step of the history database, in order (the file's one migration list), with its owner:
#: this module's tables, then conformance's (:mod:`gpuforge.history.conformance_tables`), then
#: this module's again (steps are appended, never inserted).
STEPS: tuple[Step, ...] = (
    Step(OWNER, _V1),
    *conformance_tables.STEPS,
    Step(OWNER, _V3),
    Step(OWNER, _V4),
)
#: The first schema version whose ``verdicts`` and ``events`` have ``received``.
ARRIVAL_VERSION = STEPS.index(Step(OWNER, _V4)) + 1


def _legacy(conn: sqlite3.Connection) -> int:
    """The version of a history written before application ids: the one its ``meta`` says."""
    names = database.tables(conn)
    if not names:
        return 0
    if "meta" not in names:
        raise Foreign("no gpuforge meta table: another program's file")
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    if meta.get("app") != APP:
        raise Foreign(f"its meta table says app={meta.get('app')!r}")
    try:
        return int(meta.get("schema_version", ""))
    except ValueError:
        raise Foreign("no schema_version in its meta table") from None


#: The history database (``history.db``): application id ``GFHI``.
SCHEMA = Schema(
    kind="history database",
    application_id=0x47464849,
    steps=STEPS,
    legacy=_legacy,
    recovery="it was not changed: move it aside (keep it for the record) and the collector "
    "starts a new one",
    unreadable_as="not a readable gpuforge history database",
)
#: Version of the history database's tables; a file written by a newer gpuforge is refused.
SCHEMA_VERSION = SCHEMA.version


def history_path(state_dir: Path, cluster: str) -> Path:
    """Where the history of ``cluster`` lives, beside its admission record."""
    return StatePaths(state_dir, cluster).history_db


def parse_time(value: Any, where: str) -> float:
    """Epoch seconds of an ISO 8601 time (``2026-11-30T19:20:00Z``); InputError naming ``where``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str):
        raise InputError(f"{where}: must be an ISO 8601 time, not {value!r}")
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"{where}: must be an ISO 8601 time, not {value!r}") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def iso(at: float) -> str:
    """``at`` (epoch seconds) as ``2026-11-30T19:20:00Z``."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def signature(checks: Sequence[Mapping[str, Any]]) -> str:
    """The non-passing checks of a record as ``check=status[:action]``, sorted, comma-joined.

    Two records with the same verdict and signature are the same state of the node; a record
    whose signature differs from the previous one is a change, kept in full.
    """
    parts = []
    for c in checks:
        status = str(c.get("status", ""))
        if status in ("pass", "skip"):
            continue
        action = str(c.get("action") or "")
        shadow = "~shadow" if c.get("shadow") else ""
        parts.append(f"{c.get('check')}={status}{':' + action if action else ''}{shadow}")
    return ",".join(sorted(parts))


@dataclass(frozen=True)
class _Fields:
    """What the store reads from one record (validated before anything is written)."""

    node: str
    tier: str
    at: float
    verdict: str
    signature: str
    counters: Mapping[str, Any]
    events: Sequence[Mapping[str, Any]]
    request: Mapping[str, Any] | None
    text: str


def _fields(record: Mapping[str, Any], text: str | None = None) -> _Fields:
    node = record.get("node")
    if not isinstance(node, str) or not node:
        raise InputError("record: node: must be a non-empty string")
    where = f"record from {node}"
    tier = record.get("tier")
    if not isinstance(tier, str) or not tier:
        raise InputError(f"{where}: tier: must be a non-empty string")
    verdict = record.get("verdict")
    if verdict not in VERDICTS:
        raise InputError(f"{where}: verdict: must be one of {', '.join(VERDICTS)}, not {verdict!r}")
    checks = record.get("checks") or []
    if not isinstance(checks, list) or not all(isinstance(c, Mapping) for c in checks):
        raise InputError(f"{where}: checks: must be a list of objects")
    counters = record.get("counters") or {}
    if not isinstance(counters, Mapping):
        raise InputError(f"{where}: counters: must be an object")
    events = record.get("events") or []
    if not isinstance(events, list) or not all(isinstance(e, Mapping) for e in events):
        raise InputError(f"{where}: events: must be a list of objects")
    request = record.get("request")
    if request is not None and not isinstance(request, Mapping):
        raise InputError(f"{where}: request: must be an object or null")
    return _Fields(
        node=node,
        tier=tier,
        at=parse_time(record.get("started"), f"{where}: started"),
        verdict=str(verdict),
        signature=signature(checks),
        counters=counters,
        events=events,
        request=request,
        text=text if text is not None else json.dumps(record, separators=(",", ":")),
    )


@dataclass(frozen=True)
class LatestRow:
    """The newest record of one node and tier."""

    node: str
    tier: str
    at: float
    received: float
    verdict: str
    signature: str
    request: Mapping[str, Any] | None
    record_json: str

    @property
    def record(self) -> dict[str, Any]:
        """The whole record (parsed on demand: 12,500 of them are 50 MB of JSON)."""
        return dict(json.loads(self.record_json))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view without the record."""
        return {
            "node": self.node,
            "tier": self.tier,
            "at": iso(self.at),
            "received": iso(self.received),
            "verdict": self.verdict,
            "checks": self.signature,
            "request": dict(self.request) if self.request else None,
        }


@dataclass(frozen=True)
class HistoryEvent:
    """One event about one node."""

    at: float
    node: str
    kind: str
    check: str = ""
    action: str = ""
    code: int | None = None
    gpu: int | None = None
    source: str = ""
    detail: str = ""
    data: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "at": iso(self.at),
            "node": self.node,
            "kind": self.kind,
            "check": self.check,
            "action": self.action,
            "code": self.code,
            "gpu": self.gpu,
            "source": self.source,
            "detail": self.detail,
            "data": dict(self.data or {}),
        }


@dataclass(frozen=True)
class HistoryEntry:
    """One line of a node's history: a verdict change (``kind`` ``verdict``) or an event.

    ``at``: its own time (the node's clock for what the node reported, the controller's for
    what the controller did); ``received``: when the collector received it (its order).
    """

    at: float
    kind: str
    tier: str = ""
    verdict: str = ""
    previous: str | None = None
    checks: str = ""
    event: HistoryEvent | None = None
    received: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        received = iso(self.received if self.received is not None else self.at)
        if self.event is not None:
            return {**self.event.to_dict(), "received": received}
        return {
            "at": iso(self.at),
            "received": received,
            "kind": self.kind,
            "tier": self.tier,
            "verdict": self.verdict,
            "previous": self.previous,
            "checks": self.checks,
        }


@dataclass(frozen=True)
class Snapshot:
    """A node's counters at one time."""

    at: float
    node: str
    tier: str
    verdict: str
    counters: Mapping[str, Any]


@dataclass(frozen=True)
class Retention:
    """How long the store keeps what (days); latest rows stay while nodes report."""

    snapshot_days: float = 30.0
    history_days: float = 400.0
    #: A change between pass and warn keeps its full record this long; after it, its verdicts
    #: and non-passing checks (fail and error changes keep their records for ``history_days``).
    full_days: float = 30.0


@dataclass(frozen=True)
class IngestResult:
    """What one :meth:`HistoryStore.ingest` wrote."""

    records: int
    changes: int
    snapshots: int
    events: int


def _digest(counters: Mapping[str, Any]) -> str:
    text = json.dumps(counters, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def _event_key(node: str, event: Mapping[str, Any]) -> str:
    text = json.dumps([node, event], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _pack(text: str) -> bytes:
    return zlib.compress(text.encode(), 6)


def _unpack(blob: bytes) -> str:
    return zlib.decompress(blob).decode()


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class HistoryStore:
    """The history database of one cluster; open with :meth:`open`.

    Safe to share between threads (one connection behind a lock); other processes open their
    own (SQLite's WAL lets readers run while the collector writes).
    """

    def __init__(self, db: Database) -> None:
        self.database = db
        self.path = db.path
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path, *, create: bool = True, readonly: bool = False) -> HistoryStore:
        """Open (or, with ``create``, make) the history database at ``path``.

        Raises InputError naming the file when it is not a gpuforge history database (corrupt,
        truncated, another program's file, a newer schema); such a file is never written to.
        ``readonly`` (reports, status): the file must exist and is never changed, not even
        migrated; a table an older file lacks reads as empty (:meth:`has_table`).
        """
        path = Path(path)
        if not path.exists() and (readonly or not create):
            raise InputError(f"{path}: no history database (has the collector run?)")
        return cls(database.open_database(path, SCHEMA, readonly=readonly, check_same_thread=False))

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self.database.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def has_table(self, name: str) -> bool:
        """Whether the file holds table ``name`` (a read-only open of an older file may not)."""
        with self._lock:
            return self.database.has_table(name)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``), for this module and the tables' owners."""
        with self._lock, self.database.transaction() as db:
            yield db

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction (works on a read-only open, unlike :meth:`transaction`)."""
        with self._lock, self.database.read() as db:
            yield db

    _read = read

    # -- writing

    def ingest(
        self,
        records: Sequence[Mapping[str, Any]],
        *,
        received: float | None = None,
        texts: Sequence[str] | None = None,
        sequences: Sequence[int | None] | None = None,
    ) -> IngestResult:
        """Store ``records`` in one transaction (all are validated before anything is written),
        in the order given: the order the collector received them (module docstring, "Order").

        ``texts``: the records' JSON as received (stored as it is; else they are serialized).
        ``sequences``: each record's sequence number from its node (its munge credential's; None
        for one without). A record whose sequence is below that of its node's latest of the same
        tier (overtaken in flight) adds its events but neither replaces the latest row nor counts
        as a change; any other record replaces it, however it is dated.
        """
        if texts is not None and len(texts) != len(records):
            raise ValueError("one text per record")
        if sequences is not None and len(sequences) != len(records):
            raise ValueError("one sequence per record")
        parsed = [_fields(r, texts[i] if texts else None) for i, r in enumerate(records)]
        now = time.time() if received is None else received
        changes = snaps = events = 0
        with self.transaction() as db:
            for i, f in enumerate(parsed):
                seq = sequences[i] if sequences is not None else None
                prev = db.execute(
                    "SELECT at, verdict, signature, seq FROM latest WHERE node = ? AND tier = ?",
                    (f.node, f.tier),
                ).fetchone()
                events += self._store_events(db, f, now)
                if prev is not None and seq is not None and prev[3] is not None and seq < prev[3]:
                    continue
                changed = prev is None or (prev[1], prev[2]) != (f.verdict, f.signature)
                db.execute(
                    "INSERT OR REPLACE INTO latest (node, tier, at, received, verdict, signature,"
                    " request, record, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        f.node,
                        f.tier,
                        f.at,
                        now,
                        f.verdict,
                        f.signature,
                        json.dumps(f.request, sort_keys=True) if f.request else None,
                        f.text,
                        seq,
                    ),
                )
                if changed:
                    changes += 1
                    cur = db.execute(
                        "INSERT INTO verdicts (node, tier, at, verdict, previous, signature,"
                        " received) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (f.node, f.tier, f.at, f.verdict, prev[1] if prev else None, f.signature,
                         now),
                    )  # fmt: skip
                    db.execute(
                        "INSERT INTO change_records VALUES (?, ?)", (cur.lastrowid, _pack(f.text))
                    )
                    if f.verdict == "fail" and (prev is None or prev[1] != "fail"):
                        db.execute(
                            "INSERT INTO events (at, node, kind, check_name, source, detail,"
                            " received) VALUES (?, ?, 'failure', ?, 'health', ?, ?)",
                            (f.at, f.node, f.signature.split("=", 1)[0], f.signature, now),
                        )
                        events += 1
                verdict_changed = changed and (prev is None or prev[1] != f.verdict)
                snaps += self._snapshot(db, f, force=verdict_changed)
        return IngestResult(len(parsed), changes, snaps, events)

    @staticmethod
    def _store_events(db: sqlite3.Connection, f: _Fields, received: float) -> int:
        stored = 0
        for e in f.events:
            kind = str(e.get("event") or "event")
            # The schema allows an event without a time (``"time": null`` or none): it is
            # stored at the record's own start time rather than refusing the whole record.
            when = e.get("time")
            at = f.at if when is None else parse_time(when, f"record from {f.node}: events: time")
            # Re-sent (the same key): ignored, so an event keeps the time it first arrived.
            cur = db.execute(
                "INSERT OR IGNORE INTO events (at, node, kind, check_name, action, code, gpu,"
                " source, detail, data, key, received)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 'node', ?, ?, ?, ?)",
                (
                    at,
                    f.node,
                    kind,
                    str(e.get("check") or ""),
                    str(e.get("action") or ""),
                    _opt_int(e.get("code")),
                    _opt_int(e.get("gpu")),
                    str(e.get("detail") or ""),
                    json.dumps(e, sort_keys=True, default=str),
                    _event_key(f.node, e),
                    received,
                ),
            )
            stored += cur.rowcount
        return stored

    @staticmethod
    def _snapshot(db: sqlite3.Connection, f: _Fields, *, force: bool) -> int:
        if not f.counters:
            return 0
        # The node's newest snapshot as stored (not by its date), and the interval either way:
        # a node whose clock jumped backwards keeps an hourly series, it is not frozen until its
        # clock passes the old snapshot's date again.
        last = db.execute(
            "SELECT at, digest FROM snapshots WHERE node = ? ORDER BY id DESC LIMIT 1", (f.node,)
        ).fetchone()
        if not force and last is not None and abs(f.at - last[0]) < SNAPSHOT_INTERVAL_S:
            return 0
        digest = _digest(f.counters)
        if not force and last is not None and digest == last[1]:
            return 0
        db.execute(
            "INSERT INTO snapshots (node, at, tier, verdict, digest, counters)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (
                f.node,
                f.at,
                f.tier,
                f.verdict,
                digest,
                _pack(json.dumps(f.counters, sort_keys=True, separators=(",", ":"))),
            ),
        )
        return 1

    def add_event(
        self,
        node: str,
        kind: str,
        *,
        at: float | None = None,
        check: str = "",
        action: str = "",
        code: int | None = None,
        gpu: int | None = None,
        source: str = "",
        detail: str = "",
        data: Mapping[str, Any] | None = None,
    ) -> None:
        """Record one event about ``node`` (``kind`` one of :data:`EVENT_KINDS`)."""
        when = at if at is not None else time.time()
        self.add_events([HistoryEvent(when, node, kind, check, action, code, gpu, source, detail,
                                      data)])  # fmt: skip

    def add_events(self, events: Iterable[HistoryEvent]) -> None:
        """Record several events in one transaction.

        The controller's own events: their time is the controller's clock, so each is received
        at its ``at`` (the order of a node's history, module docstring).
        """
        rows = list(events)
        for e in rows:
            if e.kind not in EVENT_KINDS:
                raise InputError(f"unknown event kind {e.kind!r} (one of {', '.join(EVENT_KINDS)})")
        with self.transaction() as db:
            db.executemany(
                "INSERT INTO events (at, node, kind, check_name, action, code, gpu, source,"
                " detail, data, received) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (e.at, e.node, e.kind, e.check, e.action, e.code, e.gpu, e.source, e.detail,
                     json.dumps(dict(e.data or {}), sort_keys=True, default=str), e.at)
                    for e in rows
                ],
            )  # fmt: skip

    def prune(
        self, retention: Retention | None = None, *, now: float | None = None
    ) -> dict[str, int]:
        """Delete what is older than ``retention`` allows, roll up old pass/warn changes.

        Returns the number of rows per table deleted (``rolled_up``: changes whose record was
        dropped). Freed pages are reused by SQLite, so the file stops growing at about the
        retention's size.
        """
        keep = retention or Retention()
        t = time.time() if now is None else now
        snap_cut = t - keep.snapshot_days * 86400
        hist_cut = t - keep.history_days * 86400
        full_cut = t - keep.full_days * 86400
        with self.transaction() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'rolled_up_until'").fetchone()
            since = float(row[0]) if row else 0.0
            rolled = db.execute(
                "DELETE FROM change_records WHERE id IN (SELECT id FROM verdicts"
                " WHERE at >= ? AND at < ? AND verdict IN ('pass', 'warn')"
                " AND coalesce(previous, 'pass') IN ('pass', 'warn'))",
                (since, full_cut),
            ).rowcount
            db.execute(
                "DELETE FROM change_records WHERE id IN (SELECT id FROM verdicts WHERE at < ?)",
                (hist_cut,),
            )
            db.execute(
                "INSERT OR REPLACE INTO meta VALUES ('rolled_up_until', ?)",
                (repr(max(since, full_cut)),),
            )
            return {
                "snapshots": db.execute("DELETE FROM snapshots WHERE at < ?", (snap_cut,)).rowcount,
                "verdicts": db.execute("DELETE FROM verdicts WHERE at < ?", (hist_cut,)).rowcount,
                "events": db.execute("DELETE FROM events WHERE at < ?", (hist_cut,)).rowcount,
                "rolled_up": rolled,
            }

    # -- reading

    def latest_of(self, node: str) -> dict[str, LatestRow]:
        """The newest record of ``node`` per tier."""
        with self._read() as db:
            rows = db.execute(
                "SELECT node, tier, at, received, verdict, signature, request, record FROM latest"
                " WHERE node = ?",
                (node,),
            ).fetchall()
        return {r[1]: _latest(r) for r in rows}

    def latest(self, tier: str | None = None, *, records: bool = True) -> dict[str, LatestRow]:
        """The newest record of every node (of ``tier``, else of any tier).

        ``records=False`` leaves the records out (``record_json`` empty): what fleet status
        needs of 12,500 nodes is in the other columns.
        """
        column = "record" if records else "''"
        query = (
            f"SELECT node, tier, at, received, verdict, signature, request, {column} FROM latest"  # noqa: S608 - one of two literals
        )
        args: tuple[str, ...] = ()
        if tier is not None:
            query += " WHERE tier = ?"
            args = (tier,)
        out: dict[str, LatestRow] = {}
        with self._read() as db:
            # Per node, the row received last wins (tier None): the collector's order.
            for r in db.execute(query + " ORDER BY node, received, at", args):
                out[r[0]] = _latest(r)
        return out

    def _arrival(self) -> str:
        """The column that says when a history row was received: ``received``, or in a file
        opened read-only before schema step 4 (no such column) the row's own time."""
        return "received" if self.database.version >= ARRIVAL_VERSION else "at"

    def node_history(
        self, node: str, since: float | None = None, limit: int | None = None
    ) -> list[HistoryEntry]:
        """Verdict changes and events of ``node`` received at or after ``since``, newest first.

        In the order the collector received them (``received``), never by the node's clock: a
        node whose clock is behind or ahead lists its records where they arrived; entries that
        arrived together (a record's verdict change, its failure and its events) by their own
        time.
        """
        start = since if since is not None else 0.0
        cap = limit if limit is not None else -1
        arrival = self._arrival()
        order = f"WHERE node = ? AND {arrival} >= ? ORDER BY {arrival} DESC, at DESC, id DESC"
        with self._read() as db:
            verdicts = db.execute(
                f"SELECT at, tier, verdict, previous, signature, {arrival} FROM verdicts "  # noqa: S608 - one of two column names
                + order
                + " LIMIT ?",
                (node, start, cap),
            ).fetchall()
            events = db.execute(
                f"SELECT {_EVENT_COLUMNS}, {arrival} FROM events " + order + " LIMIT ?",  # noqa: S608 - one of two column names
                (node, start, cap),
            ).fetchall()
        entries = [
            HistoryEntry(at=r[0], kind="verdict", tier=r[1], verdict=r[2], previous=r[3],
                         checks=r[4], received=r[5])
            for r in verdicts
        ] + [
            HistoryEntry(at=e.at, kind=e.kind, event=e, received=r[10])
            for e, r in ((_event(r), r) for r in events)
        ]  # fmt: skip
        entries.sort(key=lambda h: (h.received or 0.0, h.at), reverse=True)  # stable: ties kept
        return entries[:limit] if limit is not None else entries

    def events(
        self,
        *,
        kinds: Sequence[str] | None = None,
        node: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = None,
    ) -> list[HistoryEvent]:
        """Events, oldest first, filtered by kind, node and time."""
        where = ["at >= ?"]
        args: list[Any] = [since if since is not None else 0.0]
        if until is not None:
            where.append("at < ?")
            args.append(until)
        if node is not None:
            where.append("node = ?")
            args.append(node)
        if kinds:
            where.append(f"kind IN ({','.join('?' * len(kinds))})")
            args += list(kinds)
        args.append(limit if limit is not None else -1)
        with self._read() as db:
            rows = db.execute(
                _EVENT_SELECT + f" WHERE {' AND '.join(where)} ORDER BY at, id LIMIT ?", args
            ).fetchall()
        return [_event(r) for r in rows]

    def counters(self, node: str, since: float | None = None) -> list[Snapshot]:
        """The counter snapshots of ``node``, oldest first (a gap: nothing changed)."""
        with self._read() as db:
            rows = db.execute(
                "SELECT at, node, tier, verdict, counters FROM snapshots"
                " WHERE node = ? AND at >= ? ORDER BY at",
                (node, since if since is not None else 0.0),
            ).fetchall()
        return [Snapshot(r[0], r[1], r[2], r[3], json.loads(_unpack(r[4]))) for r in rows]

    def changes(self, node: str, since: float | None = None) -> list[dict[str, Any]]:
        """The full records that changed ``node``'s verdict, oldest first (not the rolled-up)."""
        with self._read() as db:
            rows = db.execute(
                "SELECT c.record FROM verdicts v JOIN change_records c ON c.id = v.id"
                " WHERE v.node = ? AND v.at >= ? ORDER BY v.at",
                (node, since if since is not None else 0.0),
            ).fetchall()
        return [dict(json.loads(_unpack(r[0]))) for r in rows]


_EVENT_COLUMNS = "at, node, kind, check_name, action, code, gpu, source, detail, data"
_EVENT_SELECT = f"SELECT {_EVENT_COLUMNS} FROM events"  # noqa: S608 - a constant


def _latest(r: Sequence[Any]) -> LatestRow:
    return LatestRow(
        node=r[0],
        tier=r[1],
        at=r[2],
        received=r[3],
        verdict=r[4],
        signature=r[5],
        request=json.loads(r[6]) if r[6] else None,
        record_json=r[7],
    )


def _event(r: Sequence[Any]) -> HistoryEvent:
    return HistoryEvent(
        at=r[0],
        node=r[1],
        kind=r[2],
        check=r[3],
        action=r[4],
        code=r[5],
        gpu=r[6],
        source=r[7],
        detail=r[8],
        data=json.loads(r[9]) if r[9] else {},
    )


def check_store(path: Path) -> str | None:
    """Why the history database at ``path`` is damaged (one line), or None when it is sound.

    Read-only: SQLite's full ``integrity_check`` and the header (:func:`database.check_integrity`).
    """
    return database.check_integrity(path, SCHEMA)


def repair_store(path: Path) -> database.Salvage:
    """Rebuild the history database at ``path`` from every row of it that can be read.

    A copy is kept first (``history.db.v<N>.bak``); the caller holds the collector's lock so
    that no collector writes meanwhile (:func:`database.rebuild`).
    """
    return database.rebuild(path, SCHEMA)
