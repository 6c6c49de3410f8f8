"""Ties a play's lifetime to the gpuforge process that started it.

ansible-runner starts ``ansible-playbook`` in a session of its own (a pseudo-terminal) that ignores
SIGHUP, so a ``kill -9`` of gpuforge used to leave the play and its workers running against the
nodes. :func:`gpuforge.playbook.run_playbook` starts the play through this guard instead::

    python -m gpuforge.playguard /path/to/ansible-playbook ARGS...

The guard asks the kernel for a signal when its parent dies (``PR_SET_PDEATHSIG``), starts the
play in its own process group, writes that group to the play record (beside the cluster lock,
see :mod:`gpuforge.rollout.lock`), and when gpuforge dies stops the whole group: the play and
every worker it forked. A guard that starts after its parent already died starts nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from gpuforge.atomic import write_atomic

RECORD_ENV = "GPUFORGE_PLAY_RECORD"
PARENT_ENV = "GPUFORGE_PLAY_PARENT"
GRACE_S = 5.0
"""How long the play gets after SIGTERM before its group is killed."""

_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(signum: int) -> bool:
    """Ask Linux to send ``signum`` when the parent dies; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return int(libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)) == 0


def start_ticks(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (Linux), to tell a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def write_record(path: Path, pgid: int) -> None:
    """Record the play's process group atomically (pid of its leader and that leader's start)."""
    data = {"pgid": pgid, "start": start_ticks(pgid), "argv0": "gpuforge.playguard"}
    write_atomic(path, json.dumps(data), mode=None)


def stop_group(pgid: int, grace_s: float = GRACE_S) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after ``grace_s``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is still running (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not Path("/proc/self/stat").exists():
        return True  # no /proc: a signal reached someone, assume the play lives
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def stop_recorded_play(play_record: Path) -> int | None:
    """Stop the play whose process group ``play_record`` names, if it still runs.

    Returns the group that was stopped, or None when none ran (or the record is stale: its
    process group leader is gone or is another process that reuses the pid).
    """
    try:
        data = json.loads(play_record.read_text())
        pgid = int(data["pgid"])
        start = data.get("start")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    alive = group_alive(pgid)
    leader_start = start_ticks(pgid)
    if leader_start is not None and start is not None and leader_start != start:
        alive = False  # the pid was reused by something that is not our play
    if alive:
        stop_group(pgid)
    with contextlib.suppress(OSError):
        play_record.unlink()
    return pgid if alive else None


def main(argv: list[str]) -> int:
    """Run ``argv`` as the guarded play; return its exit status."""
    if not argv:
        sys.stderr.write("usage: python -m gpuforge.playguard COMMAND [ARGS...]\n")
        return 2
    expected_parent = int(os.environ.get(PARENT_ENV, "0") or 0)
    set_parent_death_signal(signal.SIGTERM)
    if expected_parent and os.getppid() != expected_parent:
        return 1  # gpuforge died before the guard was armed: start nothing
    with contextlib.suppress(PermissionError):
        os.setpgid(0, 0)  # already the leader when started in a session of its own
    pgid = os.getpgrp()
    record = os.environ.get(RECORD_ENV)
    if record:
        write_record(Path(record), pgid)
    stopping = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group signal below reaches us too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            play.wait(GRACE_S)
        os.killpg(pgid, signal.SIGKILL)  # the workers the play left, and this guard

    play = subprocess.Popen(argv)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, stop)
    if expected_parent and os.getppid() != expected_parent:
        stop(signal.SIGTERM, None)  # the parent died while the play was starting
    return play.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
