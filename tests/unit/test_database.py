"""The database convention: legacy files migrate in place, foreign/newer/damaged files are refused.

The ``OLD_*`` DDL below is the schema code of gpuforge before the database module (copied from
``rollout/state.py``, ``upgrade/run.py``, ``history/store.py``, ``history/conformance.py`` and
``admission.py`` as they were), so that a file written by that code is built here and opened by
the new one.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuforge import database
from gpuforge.admission import SCHEMA as ADMISSION_SCHEMA
from gpuforge.admission import AdmissionRecord
from gpuforge.cli import main
from gpuforge.database import Step, open_database, statements
from gpuforge.errors import InputError, OperationError
from gpuforge.history.conformance import ConformanceHistory, NodeResult
from gpuforge.history.store import SCHEMA as HISTORY_SCHEMA
from gpuforge.history.store import HistoryStore
from gpuforge.resources import project_path
from gpuforge.rollout.state import SCHEMA as ROLLOUT_SCHEMA
from gpuforge.rollout.state import NodeState, open_store
from gpuforge.upgrade.run import UpgradeRecord

from .history.records import record

SCHEMAS = (ROLLOUT_SCHEMA, HISTORY_SCHEMA, ADMISSION_SCHEMA)

OLD_ROLLOUT = """
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
"""


OLD_UPGRADE = """
CREATE TABLE IF NOT EXISTS upgrades (
    id         TEXT PRIMARY KEY,
    pins       TEXT NOT NULL,
    started_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    status     TEXT NOT NULL,
    detail     TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS upgrade_nodes (
    upgrade     TEXT NOT NULL REFERENCES upgrades(id),
    hostname    TEXT NOT NULL,
    wave        INTEGER NOT NULL,
    step        TEXT NOT NULL,
    detail      TEXT NOT NULL DEFAULT '',
    started_at  REAL NOT NULL,
    drained_s   REAL,
    apply_s     REAL,
    validate_s  REAL,
    finished_at REAL,
    PRIMARY KEY (upgrade, hostname)
);
CREATE TABLE IF NOT EXISTS upgrade_waves (
    upgrade     TEXT NOT NULL REFERENCES upgrades(id),
    wave        INTEGER NOT NULL,
    nodes       TEXT NOT NULL,
    started_at  REAL NOT NULL,
    finished_at REAL,
    passed      INTEGER,
    detail      TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (upgrade, wave)
);
"""


OLD_HISTORY = """
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
"""


OLD_CONFORMANCE = """
CREATE TABLE IF NOT EXISTS conformance_runs (
    id INTEGER PRIMARY KEY,
    started REAL NOT NULL,
    finished REAL,
    level TEXT NOT NULL,
    state TEXT NOT NULL,          -- running | complete | partial
    nodes INTEGER NOT NULL,       -- nodes of the cluster at the start
    counts TEXT NOT NULL DEFAULT '{}',  -- JSON {outcome: nodes}, kept after pruning
    meta TEXT NOT NULL DEFAULT '{}'     -- JSON: job id, transport, sbatch calls, notes
);
CREATE TABLE IF NOT EXISTS conformance_results (
    node TEXT NOT NULL,
    run_id INTEGER NOT NULL REFERENCES conformance_runs (id),
    outcome TEXT NOT NULL,
    why TEXT NOT NULL DEFAULT '',       -- not_checked / error: the reason, fail: the checks
    failed TEXT NOT NULL DEFAULT '[]',  -- JSON [[check, status, action], ...] not passing
    drift TEXT NOT NULL DEFAULT '[]',   -- JSON [[kind, item, desired, actual], ...]
    PRIMARY KEY (node, run_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS conformance_results_run ON conformance_results (run_id, outcome);
"""


OLD_ADMISSION = """
CREATE TABLE IF NOT EXISTS windows (
    name TEXT PRIMARY KEY,
    nodes TEXT NOT NULL,       -- JSON list
    before TEXT NOT NULL,      -- JSON {node: drain reason, or null when it was in service}
    decided TEXT NOT NULL,     -- JSON list of nodes admit() has put in their final state
    opened_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    source TEXT NOT NULL,
    node TEXT NOT NULL,
    action TEXT NOT NULL,
    changed INTEGER NOT NULL,
    reason TEXT NOT NULL,
    detail TEXT NOT NULL,
    shadow INTEGER NOT NULL,
    out_of_service INTEGER NOT NULL  -- 1: this drain took an in-service node out
);
CREATE INDEX IF NOT EXISTS actions_at ON actions (at);
"""


def _old_file(path: Path, *scripts: str, rows: tuple[str, ...] = ()) -> Path:
    """A database as gpuforge before the database module wrote it (WAL, no application id)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    for script in scripts:
        conn.executescript(script)
    for row in rows:
        conn.execute(row)
    conn.close()
    return path


def _header(path: Path) -> tuple[int, int]:
    conn = sqlite3.connect(path)
    try:
        app = conn.execute("PRAGMA application_id").fetchone()[0]
        return int(app), int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def test_an_old_rollout_record_migrates_in_place_keeping_its_rows(tmp_path: Path) -> None:
    path = _old_file(
        tmp_path / "rollout.db",
        OLD_ROLLOUT,
        rows=(
            "INSERT INTO meta(key, value) VALUES ('schema_version', '1')",
            "INSERT INTO nodes VALUES ('gpu01', 1, 'admitted', 'ok', 1.0)",
        ),
    )
    store = open_store(path)
    try:
        assert [(n.hostname, n.state) for n in store.nodes()] == [("gpu01", NodeState.ADMITTED)]
        UpgradeRecord(store).begin("u1", {"driver": "550"})  # the upgrade's tables are there
        assert store.db.version == ROLLOUT_SCHEMA.version
    finally:
        store.close()
    assert _header(path) == (ROLLOUT_SCHEMA.application_id, ROLLOUT_SCHEMA.version)
    copy = sqlite3.connect(tmp_path / "rollout.db.v1.bak")
    assert copy.execute("SELECT hostname FROM nodes").fetchall() == [("gpu01",)]
    copy.close()


def test_an_old_rollout_record_with_the_upgrade_tables_migrates(tmp_path: Path) -> None:
    path = _old_file(
        tmp_path / "rollout.db",
        OLD_ROLLOUT,
        OLD_UPGRADE,
        rows=(
            "INSERT INTO meta(key, value) VALUES ('schema_version', '1')",
            "INSERT INTO upgrades VALUES ('u1', '{}', 1.0, 2.0, 'passed', '')",
        ),
    )
    store = open_store(path)
    try:
        assert [u["id"] for u in UpgradeRecord(store).summary()] == ["u1"]
    finally:
        store.close()


def test_an_old_history_migrates_in_place_and_conformance_reads_it(tmp_path: Path) -> None:
    path = _old_file(
        tmp_path / "history.db",
        OLD_HISTORY,
        OLD_CONFORMANCE,
        rows=(
            "INSERT INTO meta VALUES ('app', 'gpuforge.history'), ('schema_version', '1')",
            "INSERT INTO conformance_runs (started, level, state, nodes) VALUES"
            " (1.0, 'quick', 'complete', 1)",
            "INSERT INTO conformance_results (node, run_id, outcome) VALUES ('gpu01', 1, 'pass')",
        ),
    )
    with HistoryStore.open(path) as store:
        store.ingest([record()])
        history = ConformanceHistory(store)
        assert [r.id for r in history.runs()] == [1]
        assert history.results(1)["gpu01"].outcome == "pass"
    assert _header(path) == (HISTORY_SCHEMA.application_id, HISTORY_SCHEMA.version)


def test_an_old_history_without_conformance_tables_gets_them(tmp_path: Path) -> None:
    path = _old_file(
        tmp_path / "history.db",
        OLD_HISTORY,
        rows=("INSERT INTO meta VALUES ('app', 'gpuforge.history'), ('schema_version', '1')",),
    )
    with HistoryStore.open(path) as store:
        history = ConformanceHistory(store)
        run = history.begin("quick", 1)
        history.add(run.id, [NodeResult("gpu01", "fail", "gpu.xid")])
        assert history.finish(run.id, "complete").counts == {"fail": 1}


def test_an_old_admission_record_migrates_in_place(tmp_path: Path) -> None:
    path = _old_file(
        tmp_path / "admission.db",
        OLD_ADMISSION,
        rows=("INSERT INTO windows VALUES ('w1', '[\"gpu01\"]', '{\"gpu01\": null}', '[]', 5.0)",),
    )
    rec = AdmissionRecord(path)
    assert [(w.name, w.nodes) for w in rec.windows()] == [("w1", ("gpu01",))]
    assert _header(path) == (ADMISSION_SCHEMA.application_id, ADMISSION_SCHEMA.version)


def test_a_reader_never_creates_nor_migrates(tmp_path: Path) -> None:
    missing = tmp_path / "lab" / "history.db"
    with pytest.raises(InputError, match="no history database"):
        HistoryStore.open(missing, readonly=True)
    assert not missing.parent.exists()
    path = _old_file(
        tmp_path / "old" / "history.db",
        OLD_HISTORY,
        rows=("INSERT INTO meta VALUES ('app', 'gpuforge.history'), ('schema_version', '1')",),
    )
    before = path.read_bytes()
    with HistoryStore.open(path, readonly=True) as store:
        assert store.database.version == 1
        history = ConformanceHistory(store)  # conformance report: no table is added
        assert history.runs() == []
        assert history.results(1) == {}
        assert history.failures_since(0.0) == {}
        assert store.latest() == {}
        with (
            pytest.raises(sqlite3.OperationalError, match="readonly"),
            store.transaction() as db,
        ):
            db.execute("INSERT INTO meta VALUES ('x', 'y')")
    assert path.read_bytes() == before
    assert _header(path) == (0, 0)
    assert sorted(p.name for p in path.parent.iterdir() if not p.name.endswith(("-wal", "-shm")))\
        == ["history.db"]  # fmt: skip
    with pytest.raises(InputError, match="no rollout record"):
        open_store(tmp_path / "none" / "rollout.db", readonly=True)
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.kind)
def test_a_newer_file_is_refused_untouched(tmp_path: Path, schema: database.Schema) -> None:
    path = tmp_path / "x.db"
    open_database(path, schema).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {schema.version + 1}")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(InputError, match=f"{path}: {schema.kind} schema version .* is newer"):
        open_database(path, schema)
    with pytest.raises(InputError, match="is newer"):
        open_database(path, schema, readonly=True)
    assert path.read_bytes() == before


def test_an_old_file_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = _old_file(
        tmp_path / "history.db",
        OLD_HISTORY,
        rows=("INSERT INTO meta VALUES ('app', 'gpuforge.history'), ('schema_version', '99')",),
    )
    with pytest.raises(InputError, match="newer than this gpuforge"):
        HistoryStore.open(path)


@pytest.mark.parametrize(
    ("opener", "other", "why"),
    [
        (open_store, HISTORY_SCHEMA, "gpuforge's history database, not a rollout"),
        (HistoryStore.open, ADMISSION_SCHEMA, "gpuforge's admission record"),
        (AdmissionRecord, ROLLOUT_SCHEMA, "gpuforge's rollout record"),
    ],
    ids=["rollout", "history", "admission"],
)
def test_another_kind_of_gpuforge_file_is_refused(
    tmp_path: Path, opener: object, other: database.Schema, why: str
) -> None:
    path = tmp_path / "x.db"
    open_database(path, other).close()
    before = path.read_bytes()
    with pytest.raises(InputError, match=why):
        opener(path)  # type: ignore[operator]
    assert path.read_bytes() == before


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.kind)
@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"", "empty file"),
        (b"PK\x03\x04 a zip, not a database" * 64, "no SQLite header"),
        (b"SQLite format 3\x00" + bytes(range(256)) * 32, "file is not a database"),
    ],
    ids=["empty", "not-sqlite", "damaged-header"],
)
def test_a_file_that_is_not_one_is_refused_untouched(
    tmp_path: Path, schema: database.Schema, content: bytes, why: str
) -> None:
    path = tmp_path / "x.db"
    path.write_bytes(content)
    with pytest.raises(InputError, match=why) as info:
        open_database(path, schema)
    assert str(path) in str(info.value)
    assert path.read_bytes() == content


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.kind)
def test_another_programs_database_is_refused(tmp_path: Path, schema: database.Schema) -> None:
    path = tmp_path / "x.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE songs (title TEXT)")
    other = tmp_path / "y.db"
    with sqlite3.connect(other) as conn:
        conn.execute("PRAGMA application_id = 1234")
        conn.execute("CREATE TABLE t (x)")
    for p, why in ((path, "another program's file"), (other, "application id 0x4d2")):
        before = p.read_bytes()
        with pytest.raises(InputError, match=why):
            open_database(p, schema)
        assert p.read_bytes() == before


def _damage_a_table(path: Path, table: str) -> None:
    """Overwrite the root page of ``table`` with garbage (the header stays valid)."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    conn.close()
    with path.open("r+b") as fh:
        fh.seek((root[0] - 1) * page_size)
        fh.write(b"\xff" * page_size)


def test_a_damaged_page_is_refused_at_open_and_named_in_a_query(tmp_path: Path) -> None:
    path = tmp_path / "rollout.db"
    store = open_store(path)
    store.register_nodes([(f"gpu{i:03d}", 1) for i in range(500)])
    store.close()
    _damage_a_table(path, "nodes")
    with pytest.raises(InputError, match="rollout record is unreadable"):
        open_store(path)
    db = database.attach(path, ROLLOUT_SCHEMA, readonly=True)
    try:
        with (
            pytest.raises(InputError, match=f"^{path}: damaged \\(.*malformed"),
            db.read() as conn,
        ):
            conn.execute("SELECT * FROM nodes").fetchall()
    finally:
        db.close()


def test_each_table_is_made_by_one_owner(tmp_path: Path) -> None:
    for schema in SCHEMAS:
        conn = sqlite3.connect(":memory:")
        made: dict[str, str] = {}
        for step in schema.steps:
            before = database.tables(conn)
            for statement in statements(step.sql):
                conn.execute(statement)
            for table in database.tables(conn) - before:
                assert table not in made, f"{schema.kind}: {table} made twice"
                made[table] = step.owner
        conn.close()
        assert set(schema.owners()) == set(made.values()), schema.kind
    owners = ROLLOUT_SCHEMA.owners()
    assert owners == {"gpuforge.rollout.state": [1], "gpuforge.upgrade.run": [2]}
    assert HISTORY_SCHEMA.owners() == {
        "gpuforge.history.store": [1, 3, 4],
        "gpuforge.history.conformance": [2],
    }


def test_application_ids_are_distinct() -> None:
    assert len({s.application_id for s in SCHEMAS}) == len(SCHEMAS)


def test_statements_keep_semicolons_inside_literals() -> None:
    sql = (
        "CREATE TABLE a (x TEXT DEFAULT ';');\n"
        "-- a comment; with one\nINSERT INTO a VALUES ('1;2');\n"
    )
    assert statements(sql) == [
        "CREATE TABLE a (x TEXT DEFAULT ';');",
        "-- a comment; with one\nINSERT INTO a VALUES ('1;2');",
    ]
    with pytest.raises(ValueError, match="incomplete"):
        statements("CREATE TABLE b (x")


def test_a_step_is_applied_once_with_a_copy_kept(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    base = database.Schema(
        kind="test database",
        application_id=0x54455354,
        steps=(Step("tests", "CREATE TABLE a (x);"),),
        legacy=lambda _conn: 0,
        recovery="delete it",
    )
    open_database(path, base).close()
    more = database.Schema(
        kind=base.kind,
        application_id=base.application_id,
        steps=(*base.steps, Step("tests", "ALTER TABLE a ADD COLUMN y;")),
        legacy=base.legacy,
        recovery=base.recovery,
    )
    db = open_database(path, more)
    assert db.version == 2
    db.close()
    open_database(path, more).close()  # nothing left to apply: no error, no second copy
    assert sorted(p.name for p in tmp_path.glob("x.db.v*.bak")) == ["x.db.v1.bak"]
    copy = sqlite3.connect(tmp_path / "x.db.v1.bak")
    assert [r[1] for r in copy.execute("PRAGMA table_info(a)")] == ["x"]
    copy.close()


def test_backup_is_a_consistent_copy(tmp_path: Path) -> None:
    store = open_store(tmp_path / "rollout.db")
    try:
        store.register_nodes([("gpu01", 1)])
        target = store.db.backup(tmp_path / "copy.db")
    finally:
        store.close()
    assert _header(target) == (ROLLOUT_SCHEMA.application_id, ROLLOUT_SCHEMA.version)
    copy = open_store(target)
    assert copy.nodes()[0].hostname == "gpu01"
    copy.close()


def test_conformance_report_adds_no_table_to_the_collectors_file(tmp_path: Path) -> None:
    """The report used to create the conformance tables in the collector's history.db."""
    path = _old_file(
        tmp_path / "lab" / "history.db",
        OLD_HISTORY,
        rows=("INSERT INTO meta VALUES ('app', 'gpuforge.history'), ('schema_version', '1')",),
    )
    before = path.read_bytes()
    sample = project_path("inventory", "sample")
    result = CliRunner().invoke(
        main, ["conformance", "report", "--inventory", str(sample), "--state-dir", str(tmp_path)]
    )
    assert result.exit_code == 2, result.output
    assert "no conformance finished run" in result.output
    assert path.read_bytes() == before
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert "conformance_runs" not in database.tables(conn)
    conn.close()


def test_a_locked_file_is_an_operation_error_not_unreadable(tmp_path: Path) -> None:
    """A busy database must not be called unreadable: the advice is to move it aside."""
    path = tmp_path / "x.db"
    base = database.Schema(
        kind="test database",
        application_id=0x54455355,
        steps=(Step("tests", "CREATE TABLE a (x);"),),
        legacy=lambda _conn: 0,
        recovery="delete it",
    )
    open_database(path, base).close()
    more = replace(base, steps=(*base.steps, Step("tests", "CREATE TABLE b (y);")))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(OperationError, match="cannot open the test database: database is"):
            open_database(path, more, timeout=0.1)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert open_database(path, more).version == 2
