"""The deploy's validate and admit steps go through the admission module (fake Slurm)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuforge.admission import JOIN_REASON, Admission, AdmissionRecord
from gpuforge.rollout.deploy import ValidationOutcome
from gpuforge.rollout.steps import AnsibleSteps
from gpuforge.slurm.control import SlurmClient
from gpuforge.validate.result import NodeVerdict, Verdict
from tests.unit.slurm.fake import FakeSlurm


@pytest.fixture
def fake() -> FakeSlurm:
    nodes = {f"gpu0{i}": ("IDLE+DRAIN", JOIN_REASON) for i in range(1, 5)}
    nodes["gpu04"] = ("IDLE+DRAIN", "RMA 4711")  # an operator's, since it joined
    nodes["gpu08"] = ("IDLE", "")  # admitted in an earlier phase
    nodes["gpu09"] = ("ALLOCATED", "")  # admitted, running a user's job
    return FakeSlurm(nodes)


def steps(fake: FakeSlurm, tmp_path: Path, seen: dict[str, object]) -> AnsibleSteps:
    def validate_fn(hosts: list[str], level: str, partners: list[str]) -> ValidationOutcome:
        seen["partners"] = partners
        seen["reservations"] = dict(fake.reservations)
        seen["states"] = {h: fake.nodes[h][0] for h in hosts}
        return ValidationOutcome({})

    return AnsibleSteps(
        inventory=tmp_path,
        artifacts=tmp_path,
        validate_fn=validate_fn,
        admission=Admission(
            SlurmClient(fake, "ctl01"), AdmissionRecord(tmp_path / "admission.db"), "deploy"
        ),
        reservation="gf_phase01",
    )


def test_batch_is_validated_in_a_window_with_idle_admitted_partners(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    seen: dict[str, object] = {}
    s = steps(fake, tmp_path, seen)
    s.validate(["gpu01", "gpu02", "gpu03", "gpu04"], "burnin", ["gpu08", "gpu09"])
    assert seen["partners"] == ["gpu08"]  # the busy one is left to its job
    assert seen["reservations"] == {"gf_phase01": "gpu[01-04,08]"}
    assert set(seen["states"].values()) == {"IDLE"}  # type: ignore[union-attr]
    actions = s.admit(
        [
            NodeVerdict("gpu01", Verdict.ADMIT),
            NodeVerdict("gpu02", Verdict.QUARANTINE, ("nccl.allreduce_nvlink",)),
            NodeVerdict("gpu03", Verdict.HOLD, ("burnin.ib_write_bw",)),
            NodeVerdict("gpu04", Verdict.ADMIT),
        ]
    )
    assert fake.reservations == {}
    assert fake.nodes["gpu01"] == ("IDLE", "")
    assert fake.nodes["gpu02"] == ("IDLE+DRAIN", "gpuforge:nccl.allreduce_nvlink:quarantine")
    assert fake.nodes["gpu03"] == ("IDLE+DRAIN", JOIN_REASON)  # held: as it joined
    assert fake.nodes["gpu04"] == ("IDLE+DRAIN", "RMA 4711")  # passed, still the operator's
    assert fake.nodes["gpu08"] == ("IDLE", "")  # the partner is back in service
    assert [a.action for a in actions] == ["resume", "drain", "hold", "none"]


def test_a_failing_validation_closes_the_window(fake: FakeSlurm, tmp_path: Path) -> None:
    s = steps(fake, tmp_path, {})

    def boom(hosts: list[str], level: str, partners: list[str]) -> ValidationOutcome:
        raise RuntimeError("validators crashed")

    s.validate_fn = boom
    with pytest.raises(RuntimeError):
        s.validate(["gpu01", "gpu04"], "full", [])
    assert fake.reservations == {}
    assert fake.nodes["gpu01"] == ("IDLE+DRAIN", JOIN_REASON)
    assert fake.nodes["gpu04"] == ("IDLE+DRAIN", "RMA 4711")


def test_quick_level_takes_no_partners(fake: FakeSlurm, tmp_path: Path) -> None:
    seen: dict[str, object] = {}
    steps(fake, tmp_path, seen).validate(["gpu01"], "quick", ["gpu08"])
    assert seen["partners"] == []
