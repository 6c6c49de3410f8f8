"""The one validation window (open → validate → admit → close) and an operator's Slurm actions."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuforge.admission import (
    JOIN_REASON,
    OPERATOR,
    Admission,
    AdmissionRecord,
    BreakerPolicy,
    ValidationWindow,
)
from gpuforge.validate.result import NodeVerdict, Verdict
from tests.unit.slurm.fake import FakeSlurm
from tests.unit.test_admission import Clock, make

HANDS = "RMA 4711 waiting for a new HGX board"


@pytest.fixture
def fake() -> FakeSlurm:
    return FakeSlurm(
        {
            "gpu01": ("IDLE", ""),
            "gpu02": ("IDLE", ""),
            "gpu03": ("IDLE+DRAIN", JOIN_REASON),
            "gpu04": ("IDLE+DRAIN", HANDS),
        }
    )


def _adm(fake: FakeSlurm, tmp_path: Path, **kw: object) -> Admission:
    return make(fake, AdmissionRecord(tmp_path / "lab" / "admission.db"), Clock(), **kw)


def test_admit_inside_the_window_then_it_is_closed(fake: FakeSlurm, tmp_path: Path) -> None:
    adm = _adm(fake, tmp_path)
    with ValidationWindow(adm, "gf_val", ["gpu03", "gpu04"]) as window:
        assert fake.reservations  # open: the nodes are resumed inside the reservation
        assert fake.nodes["gpu03"][0] == "IDLE"
        (action,) = window.admit([NodeVerdict("gpu03", Verdict.ADMIT)])
    assert action.action == "resume"
    assert fake.nodes["gpu03"] == ("IDLE", "")
    assert fake.nodes["gpu04"] == ("IDLE+DRAIN", HANDS)  # undecided: its state from before
    assert fake.reservations == {}
    assert adm.open_windows() == []


def test_a_failed_validation_closes_the_window(fake: FakeSlurm, tmp_path: Path) -> None:
    adm = _adm(fake, tmp_path)
    with pytest.raises(RuntimeError), ValidationWindow(adm, "gf_val", ["gpu03"]):
        raise RuntimeError("the validators crashed")
    assert fake.nodes["gpu03"] == ("IDLE+DRAIN", JOIN_REASON)
    assert fake.reservations == {}
    assert adm.open_windows() == []


def test_two_halves_validate_then_admit_close_by_name(fake: FakeSlurm, tmp_path: Path) -> None:
    adm = _adm(fake, tmp_path)
    ValidationWindow(adm, "gf_val", ["gpu03"]).open()  # deploy's validate step
    (action,) = ValidationWindow(adm, "gf_val").admit([NodeVerdict("gpu03", Verdict.ADMIT)])
    assert action.action == "resume"
    assert fake.reservations == {}
    assert adm.open_windows() == []


def test_no_window_admits_outside_one(fake: FakeSlurm, tmp_path: Path) -> None:
    adm = _adm(fake, tmp_path)
    with ValidationWindow(adm, None, ["gpu01"]) as window:
        assert fake.reservations == {}
        (action,) = window.admit([NodeVerdict("gpu01", Verdict.QUARANTINE, ("gpu.count",))])
    assert (action.action, action.reason) == ("drain", "gpuforge:gpu.count:quarantine")


def test_operator_drain_is_recorded_and_not_limited_by_the_breaker(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    adm = _adm(fake, tmp_path, breaker=BreakerPolicy(population=2, max_fraction=0.5))
    changes = adm.operator_drain("gpu[01-02]", "cable swap, ticket 12")
    assert [c.changed for c in changes] == [True, True]  # the breaker would allow one
    assert fake.nodes["gpu01"] == ("IDLE+DRAIN", "cable swap, ticket 12")
    rows = adm.record.actions()
    assert [(r.source, r.action.node, r.out_of_service) for r in rows] == [
        (OPERATOR, "gpu01", True),
        (OPERATOR, "gpu02", True),
    ]
    # The operator's drains do not use up the automatic budget, and are never lifted by it.
    (action,) = adm.admit([NodeVerdict("gpu01", Verdict.ADMIT)])
    assert action.action == "none" and "drained by someone else" in action.detail
    assert fake.nodes["gpu01"] == ("IDLE+DRAIN", "cable swap, ticket 12")
    fake.nodes["gpu03"] = ("IDLE", "")
    (auto,) = adm.admit([NodeVerdict("gpu03", Verdict.QUARANTINE, ("gpu.count",))])
    assert auto.action == "drain"


def test_operator_drain_again_is_unchanged_and_recorded(fake: FakeSlurm, tmp_path: Path) -> None:
    adm = _adm(fake, tmp_path)
    adm.operator_drain("gpu01", "rma")
    (again,) = adm.operator_drain("gpu01", "rma")
    assert not again.changed
    assert [r.out_of_service for r in adm.record.actions()] == [True, False]


def test_operator_resume_lifts_any_drain_and_is_recorded(fake: FakeSlurm, tmp_path: Path) -> None:
    adm = _adm(fake, tmp_path)
    (change,) = adm.operator_resume("gpu04", "board replaced")
    assert change.changed and fake.nodes["gpu04"][0] == "IDLE"
    (row,) = adm.record.actions()
    assert (row.source, row.action.action, row.action.reason) == (
        OPERATOR,
        "resume",
        "board replaced",
    )
