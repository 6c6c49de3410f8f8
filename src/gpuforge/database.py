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


def damaged(path: Path, schema: Schema, exc: BaseException) -> InputError:
    """The error for a page found damaged after the file was opened."""
    return InputError(f"{path}: damaged ({_one_line(exc)}); {schema.recovery}")


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
