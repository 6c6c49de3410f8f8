"""Validation as the rollout uses it: the validators' pipeline, turned into deploy verdicts."""

from __future__ import annotations

import json
from pathlib import Path

from gpuforge.rollout.deploy import NodeVerdict, Validation
from gpuforge.rollout.state import ResultRow
from gpuforge.validate import pipeline
from gpuforge.validate.report import write_reports
from gpuforge.validate.result import BatchSummary, Tier, Verdict


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def to_validation(summary: BatchSummary, report_paths: tuple[Path, ...] = ()) -> Validation:
    """Map the validators' verdicts (admit / quarantine / hold) onto the rollout's."""
    verdicts = {
        n.node: NodeVerdict(
            n.node,
            admit=n.verdict is Verdict.ADMIT,
            reasons=n.reasons or (("inconclusive",) if n.verdict is Verdict.HOLD else ()),
            inconclusive=n.verdict is Verdict.HOLD,
        )
        for n in summary.nodes
    }
    rows = tuple(
        ResultRow(
            r.node,
            r.check,
            r.status.value,
            _text(r.measured),
            _text(r.expected),
            r.evidence,
            r.duration_s,
        )
        for r in summary.results
    )
    return Validation(verdicts, rows, report_paths)


def validate_with_validators(
    inventory: Path, hosts: list[str], level: str, report_dir: Path, reservation: str | None = None
) -> Validation:
    """Run the validators at ``level`` on ``hosts`` and write their JSON/JUnit/HTML reports.

    ``reservation`` is the Slurm reservation the acceptance jobs run in (nodes not admitted yet).
    """
    wiring = pipeline.wire(inventory)
    options = pipeline.Options(level=Tier(level), work_dir=report_dir, reservation=reservation)
    summary = pipeline.run_validation(wiring.view, hosts, options, wiring.deps)
    paths = write_reports(summary, report_dir)
    return to_validation(summary, tuple(paths.values()))
