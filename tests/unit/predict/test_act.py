"""--drain-top through admission (fake Slurm): idle only, operators untouched; the scorecard."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuforge.admission import Admission, AdmissionRecord, BreakerPolicy, is_ours, parse_reason
from gpuforge.predict.act import drain_top, merge_events, predicted_reason, scorecard
from gpuforge.predict.score import Finding, NodeRisk, RiskReport
from gpuforge.predict.telemetry import Event
from gpuforge.slurm.control import SlurmClient
from tests.unit.slurm.fake import FakeSlurm

OPERATOR = "RMA 4711 waiting for a new HGX board"
DAY = 86_400.0


def risk(node: str, score: float, signal: str = "ecc_sbe_rate") -> NodeRisk:
    return NodeRisk(node, score, (Finding(signal, "gpu3", score, "rising: ...", 400.0),))


def report(*risks: NodeRisk) -> RiskReport:
    return RiskReport(at=0.0, window_s=7 * DAY, horizon_s=7 * DAY, nodes=risks)


@pytest.fixture
def fake() -> FakeSlurm:
    return FakeSlurm(
        {
            "gpu01": ("IDLE", ""),
            "gpu02": ("ALLOCATED", ""),
            "gpu03": ("IDLE+DRAIN", OPERATOR),
            "gpu04": ("IDLE", ""),
            "gpu05": ("MIXED", ""),
            "gpu06": ("IDLE", ""),
        }
    )


def admission(fake: FakeSlurm, tmp_path: Path, breaker: BreakerPolicy | None = None) -> Admission:
    return Admission(
        SlurmClient(fake), AdmissionRecord(tmp_path / "admission.db"), "predict", breaker
    )


def test_reason_is_admissions_format_and_recognised_as_gpuforges() -> None:
    reason = predicted_reason("ecc_sbe_rate")
    assert reason == "gpuforge:predicted.ecc_sbe_rate:validate"
    parsed = parse_reason(reason)
    assert parsed is not None and parsed.check == "predicted.ecc_sbe_rate"
    assert is_ours(reason)


def test_idle_top_node_is_drained_busy_and_operator_drained_are_not(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    ranking = report(risk("gpu02", 0.9), risk("gpu03", 0.8), risk("gpu01", 0.7, "row_remap"))
    out = drain_top(ranking, admission(fake, tmp_path), 3)
    assert [(o.node, o.action) for o in out] == [
        ("gpu02", "busy"),
        ("gpu03", "skipped"),
        ("gpu01", "drain"),
    ]
    assert fake.nodes["gpu01"] == ("IDLE+DRAIN", "gpuforge:predicted.row_remap:validate")
    assert fake.nodes["gpu02"] == ("ALLOCATED", "")
    assert fake.nodes["gpu03"] == ("IDLE+DRAIN", OPERATOR)
    assert "already drained: " + OPERATOR in out[1].detail


def test_include_busy_drains_a_busy_node_which_keeps_its_job(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    out = drain_top(report(risk("gpu05", 0.9)), admission(fake, tmp_path), 1, include_busy=True)
    assert [(o.node, o.action) for o in out] == [("gpu05", "drain")]
    assert fake.nodes["gpu05"][0] == "MIXED+DRAIN"  # Slurm: DRAINING until the job ends
    assert "leaves service when it ends" in out[0].detail


def test_low_scores_are_never_drained(fake: FakeSlurm, tmp_path: Path) -> None:
    out = drain_top(report(risk("gpu01", 0.3)), admission(fake, tmp_path), 5)
    assert out == []
    assert fake.updates() == []


def test_circuit_breaker_refuses_beyond_its_limit(fake: FakeSlurm, tmp_path: Path) -> None:
    breaker = BreakerPolicy(population=100, max_fraction=0.01)  # one node per window
    ranking = report(risk("gpu01", 0.9), risk("gpu04", 0.8), risk("gpu06", 0.7))
    out = drain_top(ranking, admission(fake, tmp_path, breaker), 3)
    assert [o.action for o in out] == ["drain", "refused", "refused"]
    assert fake.nodes["gpu04"] == ("IDLE", "")
    assert "circuit breaker" in out[1].detail
    again = drain_top(report(risk("gpu06", 0.9)), admission(fake, tmp_path, breaker), 1)
    assert [o.action for o in again] == ["refused"], "the breaker remembers earlier drains"


def test_drain_callback_records_only_real_drains(fake: FakeSlurm, tmp_path: Path) -> None:
    seen: list[str] = []
    adm = admission(fake, tmp_path)
    drain_top(report(risk("gpu01", 0.9)), adm, 1, on_drained=lambda o: seen.append(o.node))
    drain_top(report(risk("gpu01", 0.9)), adm, 1, on_drained=lambda o: seen.append(o.node))
    assert seen == ["gpu01"]  # the second run finds it already drained


def test_scorecard_judges_each_prediction_by_what_followed() -> None:
    reason = predicted_reason("ecc_sbe_rate")
    events = [
        Event(0.0, "gpu01", "drain", detail=reason),
        Event(1 * DAY, "gpu01", "drain", detail="gpuforge:gpu.dcgm_diag:quarantine"),
        Event(0.0, "gpu02", "drain", detail=predicted_reason("row_remap")),
        Event(0.5 * DAY, "gpu02", "resume", detail="gpuforge: admitted"),
        Event(0.0, "gpu03", "drain", detail=reason),
        Event(9 * DAY, "gpu03", "failure"),  # after the horizon: not this prediction's
        Event(9 * DAY, "gpu04", "drain", detail=reason),
        Event(1 * DAY, "gpu05", "drain", detail="gpuforge:gpu.xid:reboot"),  # not a prediction
    ]
    card = scorecard(events, now=10 * DAY, horizon_s=7 * DAY)
    outcomes = {p.node: p.outcome for p in card.predictions}
    assert outcomes == {
        "gpu01": "confirmed",
        "gpu02": "false_alarm",
        "gpu03": "no_outcome",
        "gpu04": "pending",
    }
    assert card.precision() == 0.5
    assert card.precision("ecc_sbe_rate") == 1.0
    assert card.precision("row_remap") == 0.0


def test_a_node_outside_the_cluster_is_skipped_not_asked_of_slurm(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    ranking = report(risk("gpu99", 0.9), risk("gpu01", 0.8))
    out = drain_top(ranking, admission(fake, tmp_path), 2, known=set(fake.nodes))
    assert [(o.node, o.action) for o in out] == [("gpu99", "skipped"), ("gpu01", "drain")]
    assert all("gpu99" not in " ".join(c) for c in fake.calls)


def test_one_drain_seen_by_the_store_and_the_admission_record_counts_once() -> None:
    reason = predicted_reason("ecc_sbe_rate")
    store = [Event(100.0, "gpu01", "drain", detail=reason)]
    admitted = [
        Event(99.5, "gpu01", "drain", detail=reason),
        Event(5000.0, "gpu01", "resume", detail="gpuforge: admitted"),
    ]
    merged = merge_events(store, admitted)
    assert [(e.event, e.time) for e in merged] == [("drain", 100.0), ("resume", 5000.0)]
    card = scorecard(merged, now=6000.0, horizon_s=7 * DAY)
    assert [p.outcome for p in card.predictions] == ["false_alarm"]
