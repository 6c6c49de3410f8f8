from __future__ import annotations

import json
import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from gpuforge.rollout.lock import LockHeld, cluster_lock


def _hold(
    path: str, ready: multiprocessing.synchronize.Event, stop: multiprocessing.synchronize.Event
) -> None:
    with cluster_lock(Path(path), "deploy --phase 1"):
        ready.set()
        stop.wait(30)


def test_second_operator_is_refused_with_the_holder_named(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    ready, stop = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(tmp_path / "lab.lock"), ready, stop))
    holder.start()
    try:
        assert ready.wait(30)
        with (
            pytest.raises(LockHeld, match=rf"pid {holder.pid} on .*deploy --phase 1"),
            cluster_lock(tmp_path / "lab.lock", "deploy --phase 2"),
        ):
            pass
    finally:
        stop.set()
        holder.join(30)


def test_lock_of_a_killed_process_is_taken_over_and_reported(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    ready, stop = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(tmp_path / "lab.lock"), ready, stop))
    holder.start()
    assert ready.wait(30)
    assert holder.pid is not None
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(30)
    with cluster_lock(tmp_path / "lab.lock", "deploy --phase 1") as stale:
        assert stale is not None
        assert f"pid {holder.pid}" in stale
        assert json.loads((tmp_path / "lab.lock").read_text())["pid"] == os.getpid()


def test_clean_release_leaves_no_stale_note(tmp_path: Path) -> None:
    with cluster_lock(tmp_path / "lab.lock", "a"):
        pass
    with cluster_lock(tmp_path / "lab.lock", "b") as stale:
        assert stale is None
