"""One SQLite convention for every gpuforge database (rollout, admission, history).

A database is described by a :class:`Schema`: what it is (its ``kind``, named in every error), its
``application_id`` (SQLite's header field that marks the file as this kind of gpuforge database)
and its ordered :class:`Step` list. ``PRAGMA user_version`` is the number of steps applied, so
the schema version of a file is read from its header, and a migration is a step appended to the
list. Each step names its ``owner``: the module whose tables it creates or changes. Where two
modules keep tables in one file (the upgrade's in the rollout record, conformance's in the
history), the file's list is assembled from the owners' steps in one place, so that one version
number covers the whole file and each table is changed by one module only.

:func:`open_database` opens or creates a file, and refuses, with an :class:`InputError` (exit 2)
naming the file and why, anything it must not write to: an empty or truncated file, a file that
is not SQLite, a damaged one (``PRAGMA quick_check``), another program's or another kind of
gpuforge database (``application_id``), or a schema newer than this gpuforge knows. A file written
before this module (``application_id`` 0, no ``user_version``) is recognised by the schema's
``legacy`` function and migrated in place, after an online copy (``<file>.v<N>.bak``) is kept.
``readonly=True`` opens the file with ``mode=ro``: it never creates the file, a table or a row
(SQLite may add the ``-wal``/``-shm`` sidecars of a WAL file it reads, as any reader does).

A damaged page met later, in a query, raises ``InputError("<file>: damaged (...)")`` through
:meth:`Database.transaction` and :meth:`Database.read`, never a raw ``sqlite3.DatabaseError``.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from gpuforge.errors import InputError, OperationError

#: The first 16 bytes of every SQLite 3 database file.
SQLITE_HEADER = b"SQLite format 3\x00"
#: SQLite's primary result codes for a damaged file and for a file that is not a database.
_CORRUPT = (11, 26)


#: Every schema defined, by application id: names the kind of a gpuforge file opened as another.
_KNOWN: dict[int, str] = {}


@dataclass(frozen=True)
class Step:
    """One schema step: SQL that takes a file from version N to N + 1, and the module owning it."""

    owner: str
    sql: str


class Foreign(Exception):  # noqa: N818 - a reason, raised by a schema's legacy function
    """Raised by a :attr:`Schema.legacy` function: the file is not this kind of database."""


@dataclass(frozen=True)
class Schema:
    """What one kind of gpuforge database is, and how each version of it is made."""

    kind: str
    """Its name in messages: ``rollout record``, ``history database``."""
    application_id: int
    steps: tuple[Step, ...]
    legacy: Callable[[sqlite3.Connection], int]
    """The version of a file written before application ids (0: an empty database to make);
    raises :class:`Foreign` with the reason when the file is not this kind of database."""
    recovery: str
    """What an operator does with a file that cannot be read (appended to the error)."""
    wal: bool = True
    foreign_keys: bool = False
    unreadable_as: str = ""
    """How the error names a file it cannot open (default ``the <kind> is unreadable``)."""

    def __post_init__(self) -> None:
        _KNOWN.setdefault(self.application_id, self.kind)

    @property
    def version(self) -> int:
        """The schema version this gpuforge writes: the number of steps."""
        return len(self.steps)

    def owners(self) -> dict[str, list[int]]:
        """``owner -> [versions its steps create]``, for the docs and tests."""
        out: dict[str, list[int]] = {}
        for number, step in enumerate(self.steps, start=1):
            out.setdefault(step.owner, []).append(number)
        return out


class Database:
    """An open gpuforge database: its connection, the schema it follows, its version."""

    def __init__(
        self, path: Path, conn: sqlite3.Connection, schema: Schema, version: int, readonly: bool
    ) -> None:
        self.path = path
        self.conn = conn
        self.schema = schema
        #: The file's schema version (after migration when opened for writing).
        self.version = version
        self.readonly = readonly

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``): all of the block lands, or none of it."""
        with self.damage_is_input_error():
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                if self.conn.in_transaction:  # SQLite may have rolled it back already
                    self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: every query of the block sees the same committed state."""
        with self.damage_is_input_error():
            self.conn.execute("BEGIN")
            try:
                yield self.conn
            finally:
                self.conn.execute("COMMIT")

    @contextmanager
    def damage_is_input_error(self) -> Iterator[None]:
        """Turn a damaged page met inside the block into ``InputError("<file>: damaged (...)")``."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            if not is_damage(exc):
                raise
            raise damaged(self.path, self.schema, exc) from None

    def has_table(self, name: str) -> bool:
        """Whether the file holds table ``name`` (a reader of an older file may lack one)."""
        with self.damage_is_input_error():
            row = self.conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
            ).fetchone()
        return row is not None

    def backup(self, target: Path) -> Path:
        """An online copy of the database at ``target`` (consistent while others write)."""
        copy = sqlite3.connect(target)
        try:
            with self.damage_is_input_error():
                self.conn.backup(copy)
        finally:
            copy.close()
        return target


def is_damage(exc: sqlite3.DatabaseError) -> bool:
    """Whether ``exc`` says the file is damaged or not a database (not a constraint, a lock)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _CORRUPT
    return type(exc) is sqlite3.DatabaseError


class Damaged(InputError):  # noqa: N818 - reads as the state it reports
    """A damaged page met after the file was opened: the file's fault, not the caller's input.

    Still an :class:`InputError` (exit 2, one line); a writer that refuses what its input causes
    tells it apart (the collector answers 503, so the node keeps its record, not 400).
    """


def damaged(path: Path, schema: Schema, exc: BaseException) -> Damaged:
    """The error for a page found damaged after the file was opened."""
    return Damaged(f"{path}: damaged ({_one_line(exc)}); {schema.recovery}")


def unreadable(path: Path, schema: Schema, why: str) -> InputError:
    """The error for a file that cannot be opened as ``schema``; it was not changed."""
    said = schema.unreadable_as or f"the {schema.kind} is unreadable"
    return InputError(f"{path}: {said} ({why}); {schema.recovery}")


def open_database(
    path: Path,
    schema: Schema,
    *,
    readonly: bool = False,
    check_same_thread: bool = True,
    timeout: float = 30.0,
) -> Database:
    """Open ``path`` as ``schema`` (creating and migrating it unless ``readonly``).

    Raises :class:`InputError` naming the file when it is missing (``readonly``), empty, not
    SQLite, damaged, foreign or newer than this gpuforge; such a file is never written to. A file
    of an older version is migrated in place (``readonly``: read as it is) after a copy is kept
    beside it as ``<name>.v<version>.bak``.
    """
    path = Path(path)
    if not path.exists():
        if readonly:
            raise InputError(f"{path}: no {schema.kind} (nothing has written one yet)")
        _create(path, schema)
    _refuse_non_sqlite(path, schema)
    conn: sqlite3.Connection | None = None
    try:
        conn = _connect(path, readonly, check_same_thread, timeout)
        check = conn.execute("PRAGMA quick_check").fetchone()
        if check is None or check[0] != "ok":
            raise sqlite3.DatabaseError(str(check[0] if check else "no answer"))
        version = _version(conn, path, schema)
        if not readonly:
            version = _for_writing(conn, path, schema, version)
        if schema.foreign_keys:
            conn.execute("PRAGMA foreign_keys=ON")
    except sqlite3.DatabaseError as exc:
        if conn is not None:
            conn.close()
        if is_damage(exc):
            raise unreadable(path, schema, _one_line(exc)) from None
        # Locked past the timeout, a full disk, a read-only folder: the file itself is fine.
        raise OperationError(f"{path}: cannot open the {schema.kind}: {_one_line(exc)}") from None
    except BaseException:
        if conn is not None:
            conn.close()
        raise
    return Database(path, conn, schema, version, readonly)


def _for_writing(conn: sqlite3.Connection, path: Path, schema: Schema, version: int) -> int:
    """WAL, then the steps the file lacks (after a copy of it); the version it is at now."""
    if schema.wal:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL: a crash loses no commit
    legacy = int(conn.execute("PRAGMA application_id").fetchone()[0]) == 0
    if version < schema.version or legacy:
        if 0 < version < schema.version:
            db = Database(path, conn, schema, version, readonly=False)
            db.backup(path.with_name(f"{path.name}.v{version}.bak"))
        version = _migrate(conn, schema)
    return version


def attach(
    path: Path, schema: Schema, *, readonly: bool = False, timeout: float = 30.0
) -> Database:
    """A new connection to a file :func:`open_database` has already checked (and migrated).

    For stores that open a short connection per operation (the admission record, shared by
    processes): no integrity check, no migration; damage met in a query is still an InputError.
    """
    conn = _connect(Path(path), readonly, True, timeout)
    return Database(Path(path), conn, schema, schema.version, readonly)


def _connect(
    path: Path, readonly: bool, check_same_thread: bool, timeout: float
) -> sqlite3.Connection:
    if readonly:
        uri = f"file:{quote(str(path.resolve()))}?mode=ro"
        return sqlite3.connect(
            uri, uri=True, timeout=timeout, isolation_level=None,
            check_same_thread=check_same_thread,
        )  # fmt: skip
    return sqlite3.connect(
        path, timeout=timeout, isolation_level=None, check_same_thread=check_same_thread
    )


def _refuse_non_sqlite(path: Path, schema: Schema) -> None:
    if path.is_dir():
        raise unreadable(path, schema, "a directory")
    try:
        with path.open("rb") as fh:
            head = fh.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise unreadable(path, schema, exc.strerror or str(exc)) from None
    if not head:
        # SQLite reads an empty file as a new database: a record truncated to nothing would
        # start over silently.
        raise unreadable(path, schema, "empty file (0 bytes)")
    if head != SQLITE_HEADER:
        raise unreadable(path, schema, "not a database: no SQLite header")


def _version(conn: sqlite3.Connection, path: Path, schema: Schema) -> int:
    app = int(conn.execute("PRAGMA application_id").fetchone()[0])
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if app == 0 and version == 0:
        try:
            version = schema.legacy(conn)
        except Foreign as why:
            raise unreadable(path, schema, str(why)) from None
    elif app != schema.application_id:
        other = _KNOWN.get(app)
        what = f"gpuforge's {other}" if other else f"application id {app:#x}"
        raise unreadable(path, schema, f"it is {what}, not a {schema.kind}")
    if version > schema.version:
        raise InputError(
            f"{path}: {schema.kind} schema version {version} is newer than this gpuforge's "
            f"({schema.version}): use (or upgrade to) the gpuforge that wrote it; "
            "the file was not changed"
        )
    return version


def _migrate(conn: sqlite3.Connection, schema: Schema) -> int:
    """Apply the steps the file lacks, each in its own transaction with its version number."""
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version == 0 and int(conn.execute("PRAGMA application_id").fetchone()[0]) == 0:
                version = schema.legacy(conn)
            if version >= schema.version:  # up to date (or another process migrated it)
                # A file written before application ids whose tables are current: stamped.
                conn.execute(f"PRAGMA application_id = {int(schema.application_id)}")
                conn.execute(f"PRAGMA user_version = {version}")
                conn.execute("COMMIT")
                return version
            for statement in statements(schema.steps[version].sql):
                conn.execute(statement)
            conn.execute(f"PRAGMA application_id = {int(schema.application_id)}")
            conn.execute(f"PRAGMA user_version = {version + 1}")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


def statements(sql: str) -> list[str]:
    """The complete SQL statements of ``sql``, one by one (``;`` inside literals kept)."""
    out: list[str] = []
    buffer = ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                out.append(buffer.strip())
            buffer = ""
    if buffer.strip() and not all(
        not ln.strip() or ln.strip().startswith("--") for ln in buffer.splitlines()
    ):
        raise ValueError(f"incomplete SQL statement: {buffer.strip()[:80]!r}")
    return out


def _create(path: Path, schema: Schema) -> None:
    """Make a new database beside ``path`` and link it into place, so none is ever empty there.

    A process killed while creating it leaves a hidden ``.<name>.PID.new`` file, never an empty
    ``<name>`` that the next open would have to refuse as truncated.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.new")
    tmp.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp, isolation_level=None)
    try:
        if schema.wal:
            conn.execute("PRAGMA journal_mode=WAL")
        _migrate(conn, schema)
    finally:
        conn.close()
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass  # another process made it first: theirs is used (and checked) like any other
    finally:
        tmp.unlink(missing_ok=True)


def tables(conn: sqlite3.Connection) -> set[str]:
    """The names of the tables of ``conn``'s main database."""
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


# -- integrity check and repair (``gpuforge health store check|repair``)

#: The most problems :func:`check_integrity` names (SQLite's ``integrity_check`` can list many).
_PROBLEMS_SHOWN = 3


def check_integrity(path: Path, schema: Schema) -> str | None:
    """Why ``path`` is not a sound ``schema`` database (one line), or None when it is.

    Read-only (``mode=ro``): the file, its tables and rows are never changed. Runs SQLite's full
    ``PRAGMA integrity_check`` (every page, row and index entry; ``quick_check`` skips the
    indexes' contents), then the header's application id and version. Raises
    :class:`InputError` when there is no file to check.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no {schema.kind} (nothing has written one yet)")
    try:
        _refuse_non_sqlite(path, schema)
    except InputError as exc:
        return _reason(str(exc))
    conn: sqlite3.Connection | None = None
    try:
        conn = _connect(path, True, True, 30.0)
        rows = conn.execute("PRAGMA integrity_check(100)").fetchall()
        problems = [str(r[0]) for r in rows if r and r[0] != "ok"]
        if problems:
            more = len(problems) - _PROBLEMS_SHOWN
            shown = "; ".join(_one_line(Exception(p)) for p in problems[:_PROBLEMS_SHOWN])
            return shown + (f"; and {more} more" if more > 0 else "")
        _version(conn, path, schema)
    except InputError as exc:
        return _reason(str(exc))
    except sqlite3.DatabaseError as exc:
        if not is_damage(exc):
            raise OperationError(
                f"{path}: cannot check the {schema.kind}: {_one_line(exc)}"
            ) from None
        return _one_line(exc)
    finally:
        if conn is not None:
            conn.close()
    return None


def _reason(message: str) -> str:
    """The reason in an :func:`unreadable` message (``FILE: said (REASON); recovery``)."""
    head = message.split("; ", 1)[0]
    if "(" in head and head.endswith(")"):
        return head[head.index("(") + 1 : -1]
    return head


def free_backup_path(path: Path, version: int) -> Path:
    """``<name>.v<version>.bak`` beside ``path``, or ``<name>.v<version>.<n>.bak`` when taken."""
    path = Path(path)
    target = path.with_name(f"{path.name}.v{version}.bak")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.v{version}.{n}.bak")
    return target


@dataclass(frozen=True)
class TableSalvage:
    """What a rebuild kept of one table: rows copied, rows known lost (None: unknown)."""

    table: str
    kept: int
    lost: int | None
    damaged: bool


@dataclass(frozen=True)
class Salvage:
    """What :func:`rebuild` did: the copy it kept first, and each table's rows kept and lost."""

    path: Path
    backup: Path
    tables: tuple[TableSalvage, ...]

    @property
    def kept(self) -> int:
        """Rows copied into the new file, all tables together."""
        return sum(t.kept for t in self.tables)

    @property
    def lost(self) -> int | None:
        """Rows known lost, all tables together (None when a damaged table's count is unknown)."""
        counts = [t.lost for t in self.tables]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)


def rebuild(path: Path, schema: Schema) -> Salvage:
    """Replace ``path`` by a new ``schema`` database holding every row of it that can be read.

    The caller keeps every writer away (the file's one-writer lock). First a copy is kept as
    ``<name>.v<N>.bak`` (:func:`free_backup_path`; SQLite's online backup, else the file's bytes
    with its ``-wal``); then a fresh file is made beside it at this gpuforge's schema version and
    filled table by table, and where a table cannot be read through, row by row: forward from
    its first key, skipping over what fails, and backward from its last. The new file passes
    :func:`check_integrity` before it replaces the old one (and the old ``-wal``/``-shm``).
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no {schema.kind} to repair")
    _refuse_non_sqlite(path, schema)
    src = _connect(path, True, True, 30.0)
    try:
        try:
            version = int(src.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.DatabaseError:
            version = 0
        backup = _keep_copy(path, src, version)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.repair")
        tmp.unlink(missing_ok=True)
        dst = sqlite3.connect(tmp, isolation_level=None)
        try:
            _migrate(dst, schema)
            salvaged = tuple(_salvage(src, dst))
        finally:
            dst.close()
    except sqlite3.DatabaseError as exc:
        path.with_name(f".{path.name}.{os.getpid()}.repair").unlink(missing_ok=True)
        raise OperationError(
            f"{path}: cannot repair the {schema.kind}: {_one_line(exc)}; it was not changed"
        ) from None
    finally:
        src.close()
    why = check_integrity(tmp, schema)
    if why is not None:
        tmp.unlink(missing_ok=True)
        raise OperationError(f"{path}: the rebuilt copy is not sound ({why}); it was not changed")
    if schema.wal:
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
        finally:
            conn.close()
    for sidecar in ("-wal", "-shm"):
        path.with_name(path.name + sidecar).unlink(missing_ok=True)
    tmp.replace(path)
    return Salvage(path, backup, salvaged)


def _keep_copy(path: Path, src: sqlite3.Connection, version: int) -> Path:
    target = free_backup_path(path, version)
    copy = sqlite3.connect(target)
    try:
        src.backup(copy)
        return target
    except sqlite3.DatabaseError:
        pass  # a page SQLite cannot read: the bytes as they are
    finally:
        copy.close()
    target.unlink(missing_ok=True)
    for suffix in ("", "-wal"):
        origin = path.with_name(path.name + suffix)
        if origin.exists():
            with origin.open("rb") as fh, target.with_name(target.name + suffix).open("wb") as out:
                while chunk := fh.read(1 << 20):
                    out.write(chunk)
    return target


def _salvage(src: sqlite3.Connection, dst: sqlite3.Connection) -> Iterator[TableSalvage]:
    try:
        names = sorted(
            r[0]
            for r in src.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if not str(r[0]).startswith("sqlite_")
        )
    except sqlite3.DatabaseError as exc:
        raise sqlite3.DatabaseError(f"its table list cannot be read ({_one_line(exc)})") from None
    wanted = tables(dst)
    for name in names:
        if name not in wanted:
            continue  # not a table of this schema: kept in the backup only
        yield _copy_table(src, dst, name)


def _columns(conn: sqlite3.Connection, table: str) -> list[tuple[str, int, str]]:
    """``(name, pk position, type)`` of each column of ``table``."""
    return [
        (str(r[1]), int(r[5]), str(r[2]).upper())
        for r in conn.execute(f"PRAGMA table_info({_quoted(table)})")
    ]


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _copy_table(src: sqlite3.Connection, dst: sqlite3.Connection, table: str) -> TableSalvage:
    try:
        theirs = _columns(src, table)
    except sqlite3.DatabaseError:
        return TableSalvage(table, 0, _count(src, table), True)
    ours = {c[0] for c in _columns(dst, table)}
    cols = [c[0] for c in theirs if c[0] in ours]
    pks = sorted((c for c in theirs if c[1] > 0), key=lambda c: c[1])
    without_rowid = bool(
        src.execute(
            "SELECT 1 FROM sqlite_master WHERE name = ? AND sql LIKE '%WITHOUT ROWID%'", (table,)
        ).fetchone()
    )
    alias = len(pks) == 1 and pks[0][2] == "INTEGER"
    names = ", ".join(_quoted(c) for c in cols)
    if without_rowid:
        keys = [_quoted(c[0]) for c in pks]
        insert_cols = names
    else:
        keys = ["rowid"]
        insert_cols = names if alias else f"rowid, {names}"
    select = f"SELECT {', '.join(keys)}, {names} FROM {_quoted(table)}"  # noqa: S608 - names from the schema
    insert = (
        f"INSERT OR IGNORE INTO {_quoted(table)} ({insert_cols}) "  # noqa: S608
        f"VALUES ({', '.join('?' * (len(cols) + (0 if alias or without_rowid else 1)))})"
    )
    width = len(keys)
    kept = 0
    damaged = False

    def put(row: tuple[object, ...]) -> None:
        nonlocal kept
        values = row[width:] if (alias or without_rowid) else (row[0], *row[width:])
        kept += dst.execute(insert, values).rowcount

    dst.execute("BEGIN")
    try:
        if not _scan(src, f"{select} ORDER BY {', '.join(keys)}", (), put):
            damaged = True
            if without_rowid:
                desc = ", ".join(f"{k} DESC" for k in keys)
                _scan(src, f"{select} ORDER BY {desc}", (), put)
            else:
                _skip_scan(src, table, select, put)
    finally:
        dst.execute("COMMIT")
    if not damaged:
        return TableSalvage(table, kept, 0, False)
    total = _count(src, table)
    return TableSalvage(table, kept, None if total is None else max(total - kept, 0), True)


def _scan(
    src: sqlite3.Connection,
    sql: str,
    args: tuple[object, ...],
    put: Callable[[tuple[object, ...]], None],
) -> bool:
    """Feed the rows of ``sql`` to ``put`` until one cannot be read; whether all could."""
    try:
        for row in src.execute(sql, args):
            put(tuple(row))
    except sqlite3.DatabaseError:
        return False
    return True


def _skip_scan(
    src: sqlite3.Connection,
    table: str,
    select: str,
    put: Callable[[tuple[object, ...]], None],
) -> None:
    """Row by row by rowid: read forward, and past a rowid that fails try further and further."""
    last: list[int] = []

    def track(row: tuple[object, ...]) -> None:
        last[:] = [int(str(row[0]))]
        put(row)

    top = _max_rowid(src, table, select, put)
    start = -(2**63)
    while True:
        if _scan(src, f"{select} WHERE rowid >= ? ORDER BY rowid", (start,), track):
            return
        after = last[0] if last and last[0] >= start else start
        gap = 1
        while True:
            probe = after + gap
            if top is None or probe > top:
                return
            try:
                found = src.execute(
                    f"SELECT rowid FROM {_quoted(table)} WHERE rowid >= ? ORDER BY rowid LIMIT 1",  # noqa: S608
                    (probe,),
                ).fetchone()
            except sqlite3.DatabaseError:
                gap *= 2
                continue
            if found is None:
                return
            start = int(found[0])
            try:
                row = src.execute(f"{select} WHERE rowid = ?", (start,)).fetchone()
            except sqlite3.DatabaseError:
                after, gap = start, 1
                continue
            if row is not None:
                track(tuple(row))
            start += 1
            break


def _max_rowid(
    src: sqlite3.Connection, table: str, select: str, put: Callable[[tuple[object, ...]], None]
) -> int | None:
    """The table's largest rowid (the rows read backward from it kept), None when unknown."""
    try:
        row = src.execute(f"SELECT max(rowid) FROM {_quoted(table)}").fetchone()  # noqa: S608
        if row is not None and row[0] is not None:
            top = int(row[0])
            _scan(src, f"{select} ORDER BY rowid DESC", (), put)
            return top
    except sqlite3.DatabaseError:
        pass
    return None


def _count(src: sqlite3.Connection, table: str) -> int | None:
    """The rows ``table`` holds, counted through the table or else through each of its indexes."""
    try:
        indexes = [
            str(r[0])
            for r in src.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?", (table,)
            )
        ]
    except sqlite3.DatabaseError:
        indexes = []
    ways = ["", *(f" INDEXED BY {_quoted(i)}" for i in indexes)]
    for way in ways:
        try:
            row = src.execute(f"SELECT count(*) FROM {_quoted(table)}{way}").fetchone()  # noqa: S608
        except sqlite3.DatabaseError:
            continue
        if row is not None:
            return int(row[0])
    return None
