"""Validation as the rollout runs it: the validators' pipeline, their reports, rows to record.

The verdicts pass through unchanged: deploy and ``gpuforge validate`` share one
:class:`~gpuforge.validate.result.NodeVerdict` and one admission module.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuforge.rollout.deploy import Validation
from gpuforge.rollout.state import ResultRow
from gpuforge.validate import pipeline
from gpuforge.validate.report import write_reports
from gpuforge.validate.result import BatchSummary, Tier


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def result_rows(summary: BatchSummary) -> tuple[ResultRow, ...]:
    """Every check result of ``summary`` as a row of the rollout record."""
    return tuple(
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


def validate_with_validators(
    inventory: Path,
    hosts: list[str],
    level: str,
    report_dir: Path,
    *,
    reservation: str | None = None,
    known_good: Sequence[str] = (),
    peer_reference: Mapping[str, Mapping[str, float]] | None = None,
) -> Validation:
    """Run the validators at ``level`` on ``hosts`` and write their JSON/JUnit/HTML reports.

    ``reservation`` is the Slurm reservation the acceptance jobs run in (nodes not admitted yet);
    ``known_good`` are admitted, idle nodes the multi-node tests may pair suspects with;
    ``peer_reference`` their last measured values (check -> node -> value), which join the
    batch's peer comparisons.
    """
    wiring = pipeline.wire(inventory)
    options = pipeline.Options(
        level=Tier(level),
        work_dir=report_dir,
        reservation=reservation,
        peer_reference=dict(peer_reference or {}),
    )
    summary = pipeline.run_validation(
        wiring.view, hosts, options, wiring.deps, known_good=known_good
    )
    paths = write_reports(summary, report_dir)
    verdicts = {n.node: n for n in summary.nodes}
    return Validation(verdicts, result_rows(summary), tuple(paths.values()))
