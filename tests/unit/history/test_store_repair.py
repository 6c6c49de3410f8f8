"""``gpuforge health store check|repair`` on a real history store damaged with garbage pages."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpuforge.cli import main
from gpuforge.database import check_integrity, free_backup_path
from gpuforge.health.collector import claim_history
from gpuforge.history.store import SCHEMA, HistoryStore, check_store, iso, repair_store

from .records import T0, record

PAGE = 4096


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def filled(path: Path, records: int = 1500) -> int:
    """A store of ``records`` records (50 nodes, an event each); the events it holds."""
    with HistoryStore.open(path) as store:
        for i in range(records):
            failed = (("gpu.xid", "reboot"),) if i % 2 else ()
            event = {"time": iso(T0 + i), "event": "xid", "code": 79, "gpu": i % 8,
                     "detail": "x" * 200}  # fmt: skip
            store.ingest(
                [record(f"gpu{i % 50:02d}", at=T0 + i, verdict="fail" if i % 2 else "pass",
                        failed=failed, events=[event])]
            )  # fmt: skip
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
    finally:
        conn.close()


def damage(path: Path, pages: range) -> None:
    """Overwrite ``pages`` (0-based) of ``path`` with garbage; the header page is kept."""
    with path.open("r+b") as fh:
        for page in pages:
            fh.seek(PAGE * page)
            fh.write(b"\xa5" * PAGE)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


def test_a_sound_store_checks_ok_and_needs_no_repair(state: Path) -> None:
    path = state / "lab" / "history.db"
    filled(path, 200)
    assert check_store(path) is None
    result = run("health", "store", "check", "--cluster", "lab", "--state-dir", state)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"{path}: ok (integrity_check)"
    result = run("health", "store", "repair", "--cluster", "lab", "--state-dir", state)
    assert result.exit_code == 0, result.output
    assert "nothing to repair" in result.output
    assert not list(path.parent.glob("*.bak"))


def test_a_damaged_store_is_named_repaired_and_then_sound(state: Path) -> None:
    path = state / "lab" / "history.db"
    events = filled(path)
    damage(path, range(10, 150, 7))  # 20 pages of garbage
    before = path.read_bytes()

    result = run("health", "store", "check", "--cluster", "lab", "--state-dir", state)
    assert result.exit_code == 2, result.output
    assert f"{path}: damaged (" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert isinstance(result.exception, SystemExit)  # an exit status, no traceback
    assert path.read_bytes() == before  # read-only

    result = run("health", "store", "repair", "--cluster", "lab", "--state-dir", state, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["repaired"] is True
    backup = Path(report["backup"])
    assert backup == path.with_name(f"history.db.v{SCHEMA.version}.bak")
    assert check_store(backup) is not None  # the copy is the file as it was, damage and all
    tables = report["tables"]
    assert tables["events"]["damaged"] is True
    assert 0 < tables["events"]["kept"] < events
    assert tables["latest"]["kept"] > 0
    assert report["kept"] == sum(t["kept"] for t in tables.values())

    assert check_store(path) is None
    result = run("health", "store", "check", "--cluster", "lab", "--state-dir", state)
    assert result.exit_code == 0, result.output
    with HistoryStore.open(path, readonly=True) as store:
        assert len(store.events()) == tables["events"]["kept"]
        assert set(store.latest()) <= {f"gpu{i:02d}" for i in range(50)}
    with HistoryStore.open(path) as store:  # and the collector can write to it again
        store.ingest([record("gpu99", at=T0 + 9999)])
        assert "gpu99" in store.latest()


def test_repair_keeps_every_row_of_a_table_it_can_read_row_by_row(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    events = filled(path)
    conn = sqlite3.connect(path)
    pages = [
        int(r[0])
        for r in conn.execute(
            "SELECT pageno FROM dbstat WHERE name = 'events' AND pagetype = 'leaf'"
        )
    ] if _has_dbstat(conn) else []  # fmt: skip
    conn.close()
    if not pages:
        pytest.skip("this SQLite has no dbstat table")
    damage(path, range(pages[len(pages) // 2] - 1, pages[len(pages) // 2]))  # one leaf page
    assert check_store(path) is not None
    salvage = repair_store(path)
    got = {t.table: t for t in salvage.tables}
    assert got["events"].damaged
    assert 0 < got["events"].kept < events
    # the rows after the damaged leaf were read past it, not only those before
    with HistoryStore.open(path, readonly=True) as store:
        ats = sorted(e.at for e in store.events())
    assert ats[-1] == T0 + 1499
    assert ats[0] == T0
    assert check_integrity(path, SCHEMA) is None


def _has_dbstat(conn: sqlite3.Connection) -> bool:
    try:
        conn.execute("SELECT 1 FROM dbstat LIMIT 1").fetchall()
    except sqlite3.DatabaseError:
        return False
    return True


def test_repair_is_refused_while_a_collector_holds_the_history(state: Path) -> None:
    path = state / "lab" / "history.db"
    filled(path, 50)
    damage(path, range(3, 5))
    before = path.read_bytes()
    with claim_history(path, "gpuforge health serve"):
        result = run("health", "store", "repair", "--cluster", "lab", "--state-dir", state)
    assert result.exit_code == 2, result.output
    assert "has a collector already" in result.output
    assert path.read_bytes() == before
    assert not list(path.parent.glob("*.bak"))


def test_a_second_repair_keeps_the_first_backup(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    filled(path, 50)
    first = free_backup_path(path, SCHEMA.version)
    first.write_bytes(b"earlier")
    assert free_backup_path(path, SCHEMA.version) == path.with_name(
        f"history.db.v{SCHEMA.version}.2.bak"
    )
    damage(path, range(3, 5))
    salvage = repair_store(path)
    assert salvage.backup.name == f"history.db.v{SCHEMA.version}.2.bak"
    assert first.read_bytes() == b"earlier"


@pytest.mark.parametrize(
    ("content", "said"),
    [(b"", "empty file"), (b"not a database at all" * 100, "no SQLite header")],
    ids=["empty", "not-sqlite"],
)
def test_check_names_a_file_that_is_no_database(state: Path, content: bytes, said: str) -> None:
    path = state / "lab" / "history.db"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    result = run("health", "store", "check", "--cluster", "lab", "--state-dir", state)
    assert result.exit_code == 2, result.output
    assert f"{path}: damaged (" in result.output and said in result.output
    result = run("health", "store", "repair", "--cluster", "lab", "--state-dir", state)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert said in result.output
    assert path.read_bytes() == content


def test_check_of_a_missing_store_is_an_input_error(state: Path) -> None:
    result = run("health", "store", "check", "--cluster", "lab", "--state-dir", state)
    assert result.exit_code == 2
    assert "no history database" in result.output
