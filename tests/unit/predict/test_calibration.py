"""Calibration on labelled telemetry: reliability per bin, precision@k, recall."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuforge.cli import main
from gpuforge.predict.calibration import BINS, evaluate, failed_after, format_bins
from gpuforge.predict.generate_heldout import HeldoutFleet, HeldoutSpec
from gpuforge.predict.score import Finding, NodeRisk, RiskReport, calibrated
from gpuforge.predict.telemetry import Event, format_time, write_telemetry

DAY = 86_400.0


def _report(scores: dict[str, float]) -> RiskReport:
    nodes = tuple(
        NodeRisk(n, s, (Finding("ecc_sbe_rate", "gpu0", s, "rising: ..."),) if s else ())
        for n, s in sorted(scores.items(), key=lambda kv: -kv[1])
    )
    return RiskReport(at=0.0, window_s=7 * DAY, horizon_s=7 * DAY, nodes=nodes)


def test_reliability_bins_count_mean_score_and_share_failed() -> None:
    scores = {"a": 0.95, "b": 0.9, "c": 0.7, "d": 0.65, "e": 0.5, "f": 0.0, "g": 0.0, "h": 0.1}
    result = evaluate(_report(scores), {"a", "b", "c", "g"}, decoys={"d"})
    assert (result.k, result.hits_at_k, result.failures) == (4, 3, 4)
    assert result.precision_at_k == 0.75 and result.recall_at_k == 0.75
    assert result.decoys_at_k == 1
    assert (result.flagged, result.hits_flagged) == (5, 3)
    top = result.bins[-1]
    assert (top.lo, top.hi, top.nodes, top.failed) == (0.8, 1.0, 2, 2)
    assert top.mean_score == pytest.approx(0.925)
    low = result.bins[0]
    assert (low.nodes, low.failed, low.observed) == (2, 1, 0.5)
    assert sum(b.nodes for b in result.bins) == len(scores)
    lines = format_bins(result.bins)
    assert len(lines) == len(BINS) - 1 and lines[-1].startswith("[0.80, 1.00]")
    data = result.to_dict()
    assert data["reliability"][-1] == {
        "bin": [0.8, 1.0], "nodes": 2, "mean_score": 0.925, "observed": 1.0, "failed": 2,
    }  # fmt: skip


def test_labels_are_failures_and_rmas_within_the_horizon_after_the_scoring_time() -> None:
    events = [
        Event(10.0, "a", "failure"),
        Event(5 * DAY, "b", "rma"),
        Event(8 * DAY + 1, "c", "failure"),  # after the horizon
        Event(-1.0, "d", "failure"),  # before the scoring time
        Event(DAY, "e", "drain", detail="gpuforge:xid:drain"),
    ]
    assert failed_after(events, 0.0, 7 * DAY) == {"a", "b"}


def test_the_calibration_map_keeps_the_order_and_stays_a_probability() -> None:
    values = [calibrated(e) for e in (0.0, 0.02, 0.3, 0.45, 0.6, 0.9, 0.999)]
    assert values[0] == 0.0
    assert values == sorted(values)
    assert all(0 <= v <= 0.99 for v in values)
    assert values[1] < 0.01, "a one-off burst's evidence stays far from any threshold"


def test_scorecard_of_labelled_telemetry_reports_calibration(tmp_path: Path) -> None:
    fleet = HeldoutFleet(HeldoutSpec(nodes=40, failing=3, decoys_each=1, seed=2))
    telemetry = fleet.telemetry()
    for truth in fleet.truth.values():
        if truth.fail_time is not None:
            telemetry.events.append(Event(truth.fail_time, truth.node, "failure"))
    out = io.StringIO()
    write_telemetry(telemetry, out)
    path = tmp_path / "labelled.jsonl"
    path.write_text(out.getvalue())
    args = ["fleet", "risk", "--telemetry", str(path), "--at", format_time(fleet.at), "--scorecard"]
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)["calibration"]
    assert data["failures"] == 3 and data["k"] == 3
    assert data["precision_at_k"] >= 2 / 3
    assert sum(b["nodes"] for b in data["reliability"]) == 40
    text = CliRunner().invoke(main, args)
    assert "calibration on the labelled telemetry (3 nodes failed" in text.output
    assert "[0.80, 1.00]" in text.output
