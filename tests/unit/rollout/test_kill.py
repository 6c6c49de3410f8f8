"""SIGKILL a deploy at random points; the record stays whole and a re-run finishes the job."""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuforge import playguard
from gpuforge.rollout.lock import cluster_lock, play_record
from gpuforge.rollout.state import NodeState, open_store

from .fakes import install_fake_playbook

HOSTS = [f"gpu{i:02d}" for i in range(1, 9)]

_CHILD = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from unit.rollout.fakes import FakeSteps
from gpuforge.rollout.deploy import DeployRequest, deploy_phase
from gpuforge.rollout.state import open_store
store = open_store(Path({db!r}))
steps = FakeSteps(faulty={{"gpu03": "ecc"}}, delay_s=0.02)
request = DeployRequest(phase=1, hosts=tuple({hosts!r}), gate_fraction=0.75, operator="t")
deploy_phase(store, steps, request, lock_path=Path({db!r} + ".lock"))
"""


@pytest.mark.slow
def test_random_sigkill_loses_nothing(tmp_path: Path) -> None:
    db = str(tmp_path / "lab.db")
    code = _CHILD.format(tests=str(Path(__file__).parents[2]), db=db, hosts=HOSTS)
    rng = random.Random(7)
    for _ in range(6):
        child = subprocess.Popen([sys.executable, "-c", code])
        time.sleep(rng.uniform(0.05, 0.8))
        child.kill()
        child.wait(30)
        if Path(db).exists():  # connecting would create an empty one: a record truncated to 0
            with sqlite3.connect(db) as conn:
                assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        _assert_consistent(db)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    store = open_store(Path(db))
    states = {n.hostname: n.state for n in store.nodes(1)}
    assert states.pop("gpu03") is NodeState.QUARANTINED
    assert set(states.values()) == {NodeState.ADMITTED}
    assert store.last_gate(1) is not None
    assert store.runs()[-1].status == "passed"
    _assert_consistent(db)


def _assert_consistent(db: str) -> None:
    """Each node's state is the last transition recorded for it; no run is left 'running' twice."""
    if not Path(db).exists():
        return
    store = open_store(Path(db))
    try:
        for node in store.nodes():
            history = store.transitions(node.hostname)
            expected = history[-1][1] if history else NodeState.NEW.value
            assert node.state.value == expected, node.hostname
        assert sum(r.status == "running" for r in store.runs()) <= 1
    finally:
        store.close()


_PLAY_CHILD = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from unit.rollout.fakes import PlaySteps
from gpuforge.rollout.deploy import DeployRequest, deploy_phase
from gpuforge.rollout.lock import play_record
from gpuforge.rollout.state import open_store
lock = Path({db!r} + ".lock")
store = open_store(Path({db!r}))
steps = PlaySteps(inventory=Path({inventory!r}), play_record=play_record(lock))
request = DeployRequest(phase=1, hosts=tuple({hosts!r}), gate_fraction=1.0, operator="t")
deploy_phase(store, steps, request, lock_path=lock)
"""


def _alive(pid: int) -> bool:
    """Running, not a zombie (a killed play's processes may wait for a reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _play_pids(out: Path) -> list[int]:
    return [
        int(p.name.split("-")[1])
        for p in out.iterdir()
        if p.name.startswith(("running-", "worker-"))
    ]


@pytest.mark.slow
def test_random_sigkill_leaves_no_play_running(tmp_path: Path) -> None:
    """A play outlives no SIGKILLed deploy; a re-run never starts a second play beside one."""
    out = tmp_path / "plays"
    out.mkdir()
    install_fake_playbook(tmp_path / "bin")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")
    db = str(tmp_path / "lab.db")
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "FAKE_PLAY_DIR": str(out),
        "FAKE_PLAY_S": "60",  # outlives the wait below unless something stops it
    }
    code = _PLAY_CHILD.format(
        tests=str(Path(__file__).parents[2]), db=db, hosts=HOSTS, inventory=str(inventory)
    )
    rng = random.Random(11)
    for _ in range(4):
        child = subprocess.Popen([sys.executable, "-c", code], env=env)
        deadline = time.monotonic() + 20
        while not any(p.name.startswith("worker-") for p in out.iterdir()):
            assert time.monotonic() < deadline, "the fake play never started"
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.0))
        child.kill()
        child.wait(30)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in _play_pids(out)):
            assert time.monotonic() < deadline, "the play outlived the deploy that started it"
            time.sleep(0.1)
        for stale in out.iterdir():
            stale.unlink()
    env["FAKE_PLAY_S"] = "0.3"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    assert not [p.name for p in out.iterdir() if p.name.startswith("overlap-")]
    assert open_store(Path(db)).runs()[-1].status == "passed"


@pytest.mark.slow
def test_next_deploy_stops_a_surviving_play(tmp_path: Path) -> None:
    """A play whose guard could not die with gpuforge (no parent-death signal) is stopped."""
    out = tmp_path / "plays"
    out.mkdir()
    playbook = install_fake_playbook(tmp_path / "bin")
    record = play_record(tmp_path / "rollout.lock")
    env = {
        **os.environ,
        "FAKE_PLAY_DIR": str(out),
        "FAKE_PLAY_S": "60",
        playguard.RECORD_ENV: str(record),
    }
    orphan = subprocess.Popen(
        [sys.executable, "-m", "gpuforge.playguard", str(playbook)],
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while not (record.exists() and any(p.name.startswith("worker-") for p in out.iterdir())):
        assert time.monotonic() < deadline, "the orphan play never started"
        time.sleep(0.05)
    with cluster_lock(tmp_path / "rollout.lock", "deploy --phase 1") as note:
        assert note is not None and f"process group {orphan.pid}" in note
        assert orphan.wait(10) is not None
        assert not any(_alive(pid) for pid in _play_pids(out))
    assert not record.exists()
