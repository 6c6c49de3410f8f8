"""The conformance run's real wiring against fakes: sbatch ids, the SSH fan-out, burn-in."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from gpuforge.admission import Admission, AdmissionRecord
from gpuforge.command import CommandResult
from gpuforge.conformance import wiring
from gpuforge.errors import OperationError
from gpuforge.inventory.reader import ClusterView, InventoryDir
from gpuforge.slurm.control import SlurmClient
from gpuforge.validate.result import BatchSummary, CheckResult, Level, Status
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
        (("fabric.ib_bw[0]", "fail", "inspect"),),
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
