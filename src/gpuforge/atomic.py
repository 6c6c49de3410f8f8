"""Atomic file writes: the one way gpuforge replaces a file that someone else may be reading.

The new content goes to a hidden temporary file in the same directory (``.<name>.<pid>.<hex>.tmp``)
which is then renamed over the target, so a reader (node_exporter, a browser, the next run, a
process killed mid-write) sees the old file or the new one, never half of one. A failed write
removes its temporary file and leaves the target as it was.

Standard library only: this module ships in the node checker's zipapp (:mod:`gpuforge.node.bundle`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Literal, overload


@overload
def atomic_open(
    path: Path, *, binary: Literal[False] = ..., mode: int | None = ..., fsync: bool = ...
) -> contextlib.AbstractContextManager[IO[str]]: ...


@overload
def atomic_open(
    path: Path, *, binary: Literal[True], mode: int | None = ..., fsync: bool = ...
) -> contextlib.AbstractContextManager[IO[bytes]]: ...


def atomic_open(
    path: Path, *, binary: bool = False, mode: int | None = 0o644, fsync: bool = False
) -> contextlib.AbstractContextManager[IO[Any]]:
    """A file to write ``path``'s new content to; it replaces ``path`` when the block ends.

    ``mode``: the new file's permission bits (0644: readable by the exporters and web servers
    that read gpuforge's files; 0600 for what only its owner may read); None gives what a plain
    ``open()`` would (0666 less the umask). ``fsync``: flush the file and its directory to disk
    before returning (a power cut keeps the new content). The parent directory is created when
    missing.
    """
    return _atomic_open(Path(path), binary=binary, mode=mode, fsync=fsync)


@contextmanager
def _atomic_open(path: Path, *, binary: bool, mode: int | None, fsync: bool) -> Iterator[IO[Any]]:
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            # 0o666 lets the umask decide, as open() does; an explicit mode is set below.
            fd = os.open(tmp, flags, 0o600 if mode is not None else 0o666)
            break
        except FileExistsError:
            continue
    try:
        handle = os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")
        with handle as fh:
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            yield fh
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if fsync:
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def write_atomic(
    path: Path, data: str | bytes, *, mode: int | None = 0o644, fsync: bool = False
) -> Path:
    """Replace ``path`` with ``data`` (text is written as UTF-8) atomically; returns ``path``."""
    path = Path(path)
    if isinstance(data, bytes):
        with atomic_open(path, binary=True, mode=mode, fsync=fsync) as raw:
            raw.write(data)
    else:
        with atomic_open(path, mode=mode, fsync=fsync) as text:
            text.write(data)
    return path
