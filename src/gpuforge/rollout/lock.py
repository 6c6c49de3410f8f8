"""One operator at a time per cluster.

The lock is an ``flock`` on a file beside the rollout record: the kernel drops it when its holder
dies, so a lock cannot outlive its process. The file also names the holder (host, pid, start time,
command), which is what a second operator is shown, and what tells a stale file from a live lock.

The lock also covers the play its holder started: the play's process group is recorded beside
the lock (:func:`play_record`), and whoever takes the lock next stops a play that outlived its
gpuforge before starting another on the same hosts.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpuforge import playguard
from gpuforge.errors import OperationError
from gpuforge.state_paths import play_record_of


class LockHeld(OperationError):  # noqa: N818 - reads as the outcome it reports
    """Another live process holds the cluster's lock."""


def _describe(info: dict[str, object]) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(str(info.get("since", 0)))))
    return f"pid {info.get('pid')} on {info.get('host')} since {started} ({info.get('command')})"


def play_record(lock_path: Path) -> Path:
    """Where the holder of ``lock_path`` records the process group of its running play."""
    return play_record_of(lock_path)


def holder(lock_path: Path) -> str | None:
    """Who holds the lock at ``lock_path`` now, or None when nobody does."""
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raw = os.pread(fd, 4096, 0).decode(errors="replace")
            try:
                return _describe(json.loads(raw))
            except ValueError:
                return "an unknown process"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


@contextmanager
def cluster_lock(path: Path, command: str) -> Iterator[str | None]:
    """Hold the cluster lock for the block. Yields a note when a stale holder was found, else None.

    Raises :class:`LockHeld` at once (never waits) when another process holds it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raw = os.pread(fd, 4096, 0).decode(errors="replace")
            try:
                holder = _describe(json.loads(raw))
            except ValueError:
                holder = "an unknown process"
            raise LockHeld(
                f"another gpuforge run holds the lock for this cluster: {holder}; "
                f"wait for it to finish (lock file {path})"
            ) from None
        stale: str | None = None
        raw = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        if raw:
            try:
                stale = f"took over a stale lock left by {_describe(json.loads(raw))}, which died"
            except ValueError:
                stale = "took over an unreadable stale lock file"
        orphan = playguard.stop_recorded_play(play_record(path))
        if orphan is not None:
            stopped = f"stopped the play (process group {orphan}) that a killed run left running"
            stale = f"{stale}; {stopped}" if stale else stopped
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        info["command"] = command
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        os.fsync(fd)
        try:
            yield stale
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
