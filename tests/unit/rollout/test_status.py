"""A truthful record: interrupted and aborted runs, the lock holder, unreadable records."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuforge.cli import main
from gpuforge.database import Step
from gpuforge.errors import InputError, Interrupted
from gpuforge.playbook import run_playbook
from gpuforge.rollout.deploy import DeployRequest, deploy_phase
from gpuforge.rollout.lock import cluster_lock
from gpuforge.rollout.state import NodeState, open_store

from ..conftest import LAB
from .fakes import FakeSteps, install_fake_playbook

HOSTS = ("gpu01", "gpu02", "gpu03", "gpu04")


class _InterruptingSteps(FakeSteps):
    def provision(self, hosts: list[str]) -> dict[str, str]:
        raise KeyboardInterrupt


class _ControllerDown(FakeSteps):
    def preflight(self, hosts: list[str]) -> dict[str, str]:
        return {"ctl01": "unreachable: timed out", "gpu02": "unreachable: timed out"}


def _request() -> DeployRequest:
    return DeployRequest(phase=1, hosts=HOSTS, gate_fraction=1.0, infra=("ctl01",), operator="t")


def test_ctrl_c_records_the_run_as_interrupted(tmp_path: Path) -> None:
    store = open_store(tmp_path / "rollout.db")
    with pytest.raises(KeyboardInterrupt):
        deploy_phase(store, _InterruptingSteps(), _request(), lock_path=tmp_path / "rollout.lock")
    run = store.runs()[-1]
    assert (run.status, run.detail) == ("interrupted", "interrupted by SIGINT (Ctrl-C)")


def test_unreachable_nodes_are_recorded_even_when_the_controller_stops_the_run(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path / "rollout.db")
    with pytest.raises(Exception, match="ctl01: unreachable"):
        deploy_phase(store, _ControllerDown(), _request(), lock_path=tmp_path / "rollout.lock")
    node = store.node("gpu02")
    assert (node.state, node.reason) == (NodeState.UNREACHABLE, "unreachable: timed out")
    assert store.runs()[-1].status == "aborted"


def _state_dir(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    store = open_store(state / "lab" / "rollout.db")
    store.register_nodes((h, 1) for h in HOSTS)
    first = store.start_run(1, "quick", "alice")
    store.finish_run(first, "aborted", "OperationError: preflight failed on ctl01: timed out")
    second = store.start_run(1, "quick", "alice")
    store.finish_run(second, "interrupted", "interrupted by SIGTERM")
    store.start_run(1, "full", "bob")
    store.close()
    return state


def test_status_shows_the_run_in_progress_and_the_runs_that_did_not_finish(
    tmp_path: Path,
) -> None:
    state = _state_dir(tmp_path)
    with cluster_lock(state / "lab" / "rollout.lock", "deploy --phase 1"):
        result = CliRunner().invoke(main, ["status", str(LAB), "--state-dir", str(state)])
    assert result.exit_code == 0, result.output
    assert f"in progress: pid {os.getpid()}" in result.output
    assert "(deploy --phase 1)" in result.output
    assert "aborted: OperationError: preflight failed on ctl01: timed out" in result.output
    assert "interrupted: interrupted by SIGTERM" in result.output
    assert "run 3 phase 1 (full" in result.output and ": running" in result.output


def test_status_calls_a_running_run_without_a_lock_holder_interrupted(tmp_path: Path) -> None:
    state = _state_dir(tmp_path)
    result = CliRunner().invoke(main, ["status", str(LAB), "--state-dir", str(state), "--json"])
    assert result.exit_code == 0, result.output
    assert '"in_progress": null' in result.output
    assert "its gpuforge process died" in result.output


def test_status_requires_a_spec(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["status", "--state-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "SPEC" in result.output


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p.write_bytes(p.read_bytes()[:3000]),  # truncated
        lambda p: p.write_bytes(b"SQLite format 3\x00" + os.urandom(8192)),  # garbage pages
        lambda p: p.write_text("not a database at all\n"),
        lambda p: p.write_bytes(b""),  # SQLite took it for a new record and started over
    ],
    ids=["truncated", "garbage", "text", "empty"],
)
def test_unreadable_record_is_one_line_exit_2_with_recovery(tmp_path: Path, damage: object) -> None:
    state = _state_dir(tmp_path)
    db = state / "lab" / "rollout.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    damage(db)  # type: ignore[operator]
    before = db.read_bytes()
    with pytest.raises(InputError, match="rollout record is unreadable"):
        open_store(db)
    result = CliRunner().invoke(main, ["status", str(LAB), "--state-dir", str(state)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.output.count("\n") == 1
    assert "move it aside" in result.output
    assert db.read_bytes() == before


def test_migration_keeps_a_copy_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "rollout.db"
    open_store(db).close()
    from gpuforge.rollout import state  # noqa: PLC0415

    known = state.SCHEMA.version
    probe = Step("tests", "CREATE TABLE IF NOT EXISTS probe (x INTEGER);")
    monkeypatch.setattr(state, "SCHEMA", replace(state.SCHEMA, steps=(*state.STEPS, probe)))
    open_store(db).close()
    copy = sqlite3.connect(tmp_path / f"rollout.db.v{known}.bak")
    assert copy.execute("PRAGMA user_version").fetchone() == (known,)
    assert copy.execute("SELECT 1 FROM sqlite_master WHERE name = 'probe'").fetchone() is None
    copy.close()
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone() == (known + 1,)
    conn.close()


@pytest.mark.slow
def test_ctrl_c_during_a_play_says_interrupted_and_stops_the_play(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "plays"
    out.mkdir()
    install_fake_playbook(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_PLAY_DIR", str(out))
    monkeypatch.setenv("FAKE_PLAY_S", "30")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")
    before = signal.getsignal(signal.SIGINT)
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    with pytest.raises(Interrupted, match=r"^interrupted by SIGINT during site.yml$"):
        run_playbook("site.yml", inventory, play_record=tmp_path / "rollout.play")
    timer.cancel()
    assert time.monotonic() - started < 20
    assert signal.getsignal(signal.SIGINT) is before
    workers = [int(p.name.split("-")[1]) for p in out.iterdir() if p.name.startswith("worker-")]
    assert workers
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers):
        assert time.monotonic() < deadline, "the play's worker outlived the interrupt"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
