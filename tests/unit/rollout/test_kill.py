"""SIGKILL a deploy at random points; the record stays whole and a re-run finishes the job."""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuforge.rollout.state import NodeState, open_store

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
