"""The generator: truth kept apart, the JSON Lines path scores like the array path."""

from __future__ import annotations

import io

import numpy as np

from gpuforge.predict.generate import FleetSpec, GeneratedFleet
from gpuforge.predict.score import FleetFeatures, score, score_telemetry
from gpuforge.predict.signals import DAY_S, Window
from gpuforge.predict.telemetry import read_lines, write_telemetry

SPEC = FleetSpec(
    nodes=16, days=8, step_s=3600, gpus=4, ports=2, seed=0, fail_fraction=0.5, spike_fraction=0.2
)


def test_failure_times_are_kept_apart_from_the_telemetry() -> None:
    fleet = GeneratedFleet(SPEC)
    telemetry = fleet.telemetry()
    assert not [e for e in telemetry.events if e.event == "failure"]
    failing = [t for t in fleet.truth.values() if t.fail_time is not None]
    assert failing and all(t.fail_time > SPEC.at for t in failing)
    assert fleet.fails_within(7 * DAY_S) <= {t.node for t in failing}


def test_a_node_is_the_same_alone_or_in_the_fleet() -> None:
    fleet = GeneratedFleet(SPEC)
    alone, _ = fleet.node("gpu00007")
    fleet.node("gpu00003")
    again, _ = fleet.node("gpu00007")
    for (m1, _, _, x1), (m2, _, _, x2) in zip(alone, again, strict=True):
        assert m1 == m2 and np.array_equal(x1, x2)


def test_the_json_lines_path_scores_exactly_like_the_array_path() -> None:
    fleet = GeneratedFleet(SPEC)
    window = Window(SPEC.at)
    features = FleetFeatures(window)
    events = []
    for name, blocks, node_events in fleet.iter_nodes():
        for metric, subjects, t, x in blocks:
            features.add(name, metric, subjects, t, x)
        events += node_events
    direct = score(features, sorted(events, key=lambda e: e.time), fleet.labels)
    text = io.StringIO()
    write_telemetry(fleet.telemetry(), text)
    via_file = score_telemetry(read_lines(text.getvalue().splitlines(), source="g"), window)
    assert [(r.node, round(r.score, 9), r.top_signal) for r in direct.nodes] == [
        (r.node, round(r.score, 9), r.top_signal) for r in via_file.nodes
    ]
    assert direct.groups == via_file.groups
    assert any(r.findings for r in direct.ranked), "a comparison of empty rankings proves nothing"
