"""The conformance run's real wiring against fakes: sbatch ids, the SSH fan-out, burn-in."""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpuforge.admission import Admission, AdmissionRecord
from gpuforge.command import CommandResult
from gpuforge.conformance import wiring
from gpuforge.errors import OperationError
from gpuforge.health.collector import HistoryHeld, claim_history
from gpuforge.health.fleet import Fleet
from gpuforge.history.store import HistoryStore
from gpuforge.inventory.reader import ClusterView, InventoryDir
from gpuforge.rollout.lock import holder
from gpuforge.slurm.control import SlurmClient
from gpuforge.state_paths import collector_lock_of
from gpuforge.validate.result import BatchSummary, CheckResult, Level, Status
from tests.unit.health.test_collector_hostile import slow_ingest
from tests.unit.history.records import record
from tests.unit.slurm.fake import FakeSlurm


@pytest.mark.parametrize(("out", "job"), [("123\n", "123"), ("77;cluster\n", "77")])
def test_job_id_of_sbatch_parsable(out: str, job: str) -> None:
    assert wiring.job_id(out) == job


def test_sbatch_answering_something_else_is_an_operation_error() -> None:
    with pytest.raises(OperationError, match="not a job id"):
        wiring.job_id("sbatch: error: Batch job submission failed\n")


class _Runner:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, float]] = []

    def run(self, host: str, command: str, *, timeout: float) -> CommandResult:
        self.seen.append((host, command, timeout))
        if host == "gpu02":
            return CommandResult(host, command, 255, "", "ssh: connect refused")
        return CommandResult(host, command, 0, f'log line\n{{"node": "{host}"}}\n', "")


def test_ssh_deps_keep_each_nodes_last_line_and_drop_the_silent(tmp_path: Path) -> None:
    runner = _Runner()
    view = ClusterView(InventoryDir(tmp_path), {}, {})
    deps = wiring.ssh_deps(view, runner)
    assert deps.ssh is not None
    raw = deps.ssh(["gpu01", "gpu02", "gpu03"], "quick")
    assert raw == {"gpu01": '{"node": "gpu01"}', "gpu03": '{"node": "gpu03"}'}
    assert {t for _, _, t in runner.seen} == {wiring.SSH_TIMEOUT["quick"]}
    assert all("conformance --level quick --no-send" in c for _, c, _ in runner.seen)


def test_burnin_runs_in_a_window_admits_nothing_and_returns_the_failures(
    tmp_path: Path,
) -> None:
    fake = FakeSlurm({"gpu01": ("IDLE", ""), "gpu02": ("IDLE", "")})
    adm = Admission(SlurmClient(fake, "ctl01"), AdmissionRecord(tmp_path / "admission.db"))
    seen: list[tuple[list[str], str, dict[str, str]]] = []

    def validate(nodes: Sequence[str], reservation: str) -> BatchSummary:
        seen.append((list(nodes), reservation, dict(fake.reservations)))
        results = [
            CheckResult("gpu01", "fabric.ib_bw[0]", Status.PASS, level=Level.FULL),
            CheckResult(
                "gpu02", "fabric.ib_bw[0]", Status.FAIL, level=Level.FULL, action="inspect"
            ),
        ]
        return BatchSummary.build(nodes, results, level=Level.FULL)

    out = wiring.burnin_tests(adm, validate)(["gpu01", "gpu02"])
    ((nodes, reservation, reservations),) = seen
    assert (nodes, reservation) == (["gpu01", "gpu02"], wiring.BURNIN_WINDOW)
    assert wiring.BURNIN_WINDOW in reservations  # the pipeline ran inside the window
    assert fake.reservations == {}  # and it was closed
    assert adm.record.actions(action="drain") == []  # nothing admitted in the window
    assert list(out) == ["gpu02"]
    assert (out["gpu02"].outcome, out["gpu02"].failed) == (
        "fail",
        (CheckResult("gpu02", "fabric.ib_bw[0]", Status.FAIL, action="inspect"),),
    )


def test_a_crashed_burnin_still_closes_its_window(tmp_path: Path) -> None:
    fake = FakeSlurm({"gpu01": ("IDLE+DRAIN", "gpuforge:conformance.drift:quarantine")})
    adm = Admission(SlurmClient(fake, "ctl01"), AdmissionRecord(tmp_path / "admission.db"))

    def validate(_nodes: Sequence[str], _reservation: str) -> BatchSummary:
        raise OperationError("ib_write_bw: timed out")

    with pytest.raises(OperationError):
        wiring.burnin_tests(adm, validate)(["gpu01"])
    assert fake.reservations == {}
    assert fake.nodes["gpu01"] == ("IDLE+DRAIN", "gpuforge:conformance.drift:quarantine")


# -- the in-process collector: one writer per history, a client gone is one line ---------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _collector_rig(tmp_path: Path) -> tuple[Fleet, HistoryStore, Admission]:
    fake = FakeSlurm({"gpu01": ("IDLE", "")})
    adm = Admission(SlurmClient(fake, "ctl01"), AdmissionRecord(tmp_path / "admission.db"))
    fleet = Fleet("lab", ("gpu01",), {"gpu01": "127.0.0.1"}, {"gpu01": "leaf-a"}, {})
    return fleet, HistoryStore.open(tmp_path / "history.db"), adm


def test_the_in_process_collector_survives_a_client_gone_with_one_line(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO)
    fleet, store, adm = _collector_rig(tmp_path)
    slow_ingest(monkeypatch, store, 0.4)  # the task is gone before its record is answered
    port = _free_port()
    body = json.dumps(record("gpu01", tier="conformance")).encode()
    head = f"POST /v1/records HTTP/1.1\r\nHost: c\r\nContent-Length: {len(body)}\r\n\r\n"
    with wiring.collector_for_run(f"127.0.0.1:{port}", fleet, store, adm) as how:
        assert how == f"an in-process collector on 127.0.0.1:{port} for this run"
        for cut in (len(body), 10):  # the whole record, or part of its body; then RST
            conn = socket.create_connection(("127.0.0.1", port), timeout=10)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.sendall(head.encode() + body[:cut])
            time.sleep(0.1)
            conn.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(_gone(caplog)) < 2:
            time.sleep(0.05)
    lines = _gone(caplog)
    assert len(lines) == 2 and all(
        x.startswith("127.0.0.1 (gpu01) POST /v1/records: ") for x in lines
    )
    assert not [r for r in caplog.records if r.exc_info or r.stack_info]
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "BrokenPipeError" not in out + err
    assert holder(collector_lock_of(store.path)) is None  # let go when the run ended
    assert "gpu01" in store.latest()  # the record that came whole is stored all the same


def _gone(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if "went away" in r.getMessage() or "mid-request" in r.getMessage()
    ]


def test_a_collector_service_on_the_history_is_used_not_doubled(tmp_path: Path) -> None:
    fleet, store, adm = _collector_rig(tmp_path)
    port = _free_port()
    with claim_history(store.path, "gpuforge health serve"):  # the service, elsewhere on the host
        with wiring.collector_for_run(f"127.0.0.1:{port}", fleet, store, adm) as how:
            assert how.startswith("the collector writing this history (pid ")
            with socket.socket() as probe:  # nothing was started here
                assert probe.connect_ex(("127.0.0.1", port)) != 0
        with wiring.collector_for_run(None, fleet, store, adm) as how:
            assert how.startswith("the collector writing this history (pid ")
    with wiring.collector_for_run(None, fleet, store, adm) as how:
        assert "none writes this history on this host" in how


def test_claim_history_refuses_a_second_writer_naming_the_first(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    with claim_history(path, "gpuforge health serve"):
        with pytest.raises(HistoryHeld) as err:
            claim_history(path, "gpuforge health serve")
        assert err.value.exit_code == 2
        assert f"pid {os.getpid()} on " in str(err.value)
        assert "(gpuforge health serve)" in str(err.value)
        assert str(collector_lock_of(path)) in str(err.value)
    claim_history(path, "again").close()  # free once the first let go
