"""A conformance row as the history stores it: compact JSON of ``[check, status, action]`` and
``[kind, item, desired, actual]`` lists, read into the result model and written back unchanged."""

from __future__ import annotations

from pathlib import Path

from gpuforge.conformance import judge
from gpuforge.history.conformance import ConformanceHistory, NodeResult
from gpuforge.history.store import HistoryStore
from gpuforge.node.record import Drift
from gpuforge.validate.result import CheckResult, Status, Verdict

#: A row exactly as the conformance history has written it since the tables exist.
FAILED = '[["conformance.drift","fail","quarantine"],["fabric.flaps","warn","monitor"]]'
DRIFT = '[["package","libnccl2","2.21.5-1","2.25.1-1"],["slurm","Weight","10","1"]]'


def _history(tmp_path: Path) -> tuple[ConformanceHistory, int]:
    history = ConformanceHistory(HistoryStore.open(tmp_path / "history.db"))
    run = history.begin("quick", 2, at=1_795_000_000.0)
    with history.store.transaction() as db:
        db.execute(
            "INSERT INTO conformance_results VALUES (?, ?, ?, ?, ?, ?)",
            ("gpu01", run.id, "fail", "conformance.drift", FAILED, DRIFT),
        )
        db.execute(
            "INSERT INTO conformance_results VALUES (?, ?, ?, ?, ?, ?)",
            ("gpu02", run.id, "pass", "", "[]", "[]"),
        )
    return history, run.id


def test_a_stored_row_loads_into_check_results_and_drift(tmp_path: Path) -> None:
    history, run_id = _history(tmp_path)
    got = history.results(run_id)["gpu01"]
    assert got.failed == (
        CheckResult("gpu01", "conformance.drift", Status.FAIL, action="quarantine"),
        CheckResult("gpu01", "fabric.flaps", Status.WARN, action="monitor"),
    )
    assert got.drift == (
        Drift("package", "libnccl2", "2.21.5-1", "2.25.1-1"),
        Drift("slurm", "Weight", "10", "1"),
    )
    assert history.results(run_id)["gpu02"] == NodeResult("gpu02", "pass")
    [(_, seen)] = history.node_history("gpu01")
    assert seen == got
    assert got.to_dict() == {
        "node": "gpu01",
        "outcome": "fail",
        "why": "conformance.drift",
        "failed": [
            {"check": "conformance.drift", "status": "fail", "action": "quarantine"},
            {"check": "fabric.flaps", "status": "warn", "action": "monitor"},
        ],
        "drift": [
            {"kind": "package", "item": "libnccl2", "desired": "2.21.5-1", "actual": "2.25.1-1"},
            {"kind": "slurm", "item": "Weight", "desired": "10", "actual": "1"},
        ],
    }
    v = judge.verdict(got)
    assert v is not None and v.verdict is Verdict.QUARANTINE
    assert (v.reasons, v.warnings, v.action) == (("conformance.drift",), ("fabric.flaps",), "")


def test_a_result_is_written_back_as_the_same_row(tmp_path: Path) -> None:
    history, run_id = _history(tmp_path)
    again = history.begin("quick", 1, at=1_795_086_400.0)
    history.add(again.id, [history.results(run_id)["gpu01"]])
    with history.store.read() as db:
        rows = db.execute(
            "SELECT failed, drift FROM conformance_results WHERE node = 'gpu01' ORDER BY run_id"
        ).fetchall()
    assert rows == [(FAILED, DRIFT), (FAILED, DRIFT)]


def test_a_result_keeps_what_its_row_stores_of_a_check() -> None:
    """A record's full check (evidence, level, its own node name) is kept as the row keeps it,
    so the result read back from the history equals the one the run judged."""
    full = CheckResult("", "gpu.xid", Status.FAIL, measured=79, evidence="Xid 79", action="reboot")
    result = NodeResult("gpu03", "fail", "gpu.xid", (full,))
    assert result.failed == (CheckResult("gpu03", "gpu.xid", Status.FAIL, action="reboot"),)
