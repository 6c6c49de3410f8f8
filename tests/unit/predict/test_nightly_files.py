"""What the nightly ranking leaves behind: its report file and its textfile metrics."""

from __future__ import annotations

import json
from pathlib import Path

from gpuforge.predict import nightly
from gpuforge.predict.act import DrainOutcome
from gpuforge.predict.score import Finding, NodeRisk, RiskReport
from gpuforge.textfile import Family, render

DAY = 86_400.0
NOW = 1_795_000_000.25  # 2026-11-18T11:06:40Z


def _ranking(*nodes: tuple[str, float], thin: int = 0) -> RiskReport:
    risks = [
        NodeRisk(n, s, (Finding("ecc_sbe_rate", "gpu3", s, "rising"),) if s > 0 else ())
        for n, s in nodes
    ]
    risks += [NodeRisk(f"thin{i}", 0.0, status="insufficient_data") for i in range(thin)]
    return RiskReport(at=NOW - 60, window_s=7 * DAY, horizon_s=7 * DAY, nodes=tuple(risks))


def _samples(families: list[Family], name: str) -> list[tuple[dict[str, str], float]]:
    family = next(f for f in families if f.name == name)
    return [(dict(labels), value) for labels, value in family.samples]


def test_the_report_is_named_by_the_run_s_utc_time_and_written_whole(tmp_path: Path) -> None:
    document = json.dumps({"schema": "gpuforge.risk/1"}, indent=2)
    path = nightly.write_report(tmp_path / "reports", document, now=NOW)
    assert path == tmp_path / "reports" / "risk-20261118T110640Z.json"
    assert path.read_text() == document + "\n"
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_metrics_are_bounded_by_the_limit_and_keep_the_nodes_acted_on() -> None:
    report = _ranking(("gpu01", 0.9), ("gpu02", 0.8), ("gpu03", 0.7), ("gpu04", 0.0), thin=2)
    outcomes = [
        DrainOutcome("gpu01", 0.9, "ecc_sbe_rate", "drain", "gpuforge:predicted.x:validate", ""),
        DrainOutcome("gpu03", 0.7, "ecc_sbe_rate", "busy", "gpuforge:predicted.x:validate", ""),
    ]
    families = nightly.metrics(report, outcomes, shadow=True, limit=1, now=NOW)
    assert _samples(families, "gpuforge_predict_node_score") == [
        ({"node": "gpu01"}, 0.9),
        ({"node": "gpu03"}, 0.7),  # beyond --limit, but the run acted on it
    ]
    assert _samples(families, "gpuforge_predict_nodes") == [
        ({"state": "scored"}, 4),
        ({"state": "with_findings"}, 3),
        ({"state": "insufficient_data"}, 2),
    ]
    drains = {
        (lab["mode"], lab["action"]): v for lab, v in _samples(families, "gpuforge_predict_drains")
    }
    assert drains[("shadow", "drain")] == 1 and drains[("shadow", "busy")] == 1
    assert drains[("live", "drain")] == 0 and len(drains) == 2 * len(nightly.OUTCOMES)
    text = render(families)
    assert "gpuforge_predict_last_run_timestamp_seconds 1795000000\n" in text
    assert "gpuforge_predict_scored_at_timestamp_seconds 1794999940\n" in text


def test_a_live_run_counts_in_live_mode_and_limit_0_lists_no_node() -> None:
    report = _ranking(("gpu01", 0.9))
    families = nightly.metrics(report, [], shadow=False, limit=0, now=NOW)
    assert _samples(families, "gpuforge_predict_node_score") == []
    assert all(v == 0 for _, v in _samples(families, "gpuforge_predict_drains"))
