"""The held-out generator, and issue 30's acceptance: the ranking holds on fleets it was not
tuned on (precision@k >= 0.8, at most one decoy in the top k, the warming rack kept)."""

from __future__ import annotations

import io

import pytest

from gpuforge.predict.calibration import evaluate
from gpuforge.predict.generate_heldout import DECOYS, HeldoutFleet, HeldoutSpec
from gpuforge.predict.score import FleetFeatures, RiskReport, score, score_telemetry
from gpuforge.predict.signals import DAY_S, Window
from gpuforge.predict.telemetry import read_lines, write_telemetry

HORIZON = 7 * DAY_S


def _score(fleet: HeldoutFleet) -> RiskReport:
    features = FleetFeatures(Window(fleet.at))
    for name in fleet.names:
        blocks, _ = fleet.node(name)
        for metric, subjects, t, x in blocks:
            features.add(name, metric, subjects, t, x)
    return score(features, [], fleet.labels, horizon_s=HORIZON)


def test_the_fleet_is_the_testers_shape_with_its_truth_apart() -> None:
    fleet = HeldoutFleet(HeldoutSpec(seed=4))
    assert len(fleet.names) == 128
    assert len(fleet.fails_within(HORIZON)) == 9
    kinds = {t.kind for t in fleet.truth.values()}
    assert set(DECOYS) <= kinds
    telemetry = fleet.telemetry(fleet.names[:2])
    t, _ = next(iter(telemetry.series.values()))
    assert len(t) == 14 * 4  # a sample every 6 hours
    assert t[-1] <= fleet.at
    assert all(e.event != "failure" for e in telemetry.events)
    assert {v["node_type"] for v in fleet.labels.values()} == {"h200-sxm-8x", "a100-sxm4-8x"}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ranking_holds_on_held_out_fleets(seed: int) -> None:
    fleet = HeldoutFleet(HeldoutSpec(seed=seed))
    report = _score(fleet)
    result = evaluate(report, fleet.fails_within(HORIZON), decoys=fleet.decoys())
    assert result.k == 9
    assert result.precision_at_k >= 0.8
    assert result.decoys_at_k <= 1
    cooling = [g.group for g in report.groups if g.kind == "cooling"]
    assert cooling == [fleet.cooling_rack], "the warming rack is a facility finding"
    warm = set(next(g.nodes for g in report.groups if g.kind == "cooling"))
    assert not [r for r in report.ranked if r.node in warm and r.score >= 0.5]
    assert not [r for r in report.ranked if r.node in fleet.decoys() and r.score >= 0.5]


def test_held_out_file_path_scores_like_the_array_path() -> None:
    fleet = HeldoutFleet(HeldoutSpec(nodes=40, failing=3, decoys_each=1, seed=5))
    direct = _score(fleet)
    text = io.StringIO()
    write_telemetry(fleet.telemetry(), text)
    via_file = score_telemetry(
        read_lines(text.getvalue().splitlines(), source="h"), Window(fleet.at), horizon_s=HORIZON
    )
    assert [(r.node, round(r.score, 9), r.top_signal) for r in direct.nodes] == [
        (r.node, round(r.score, 9), r.top_signal) for r in via_file.nodes
    ]
    assert any(r.findings for r in via_file.ranked)
