"""Validation as the rollout runs it: the validators' pipeline, their reports, rows to record.

The verdicts pass through unchanged: deploy and ``gpuforge validate`` share one
:class:`~gpuforge.validate.result.NodeVerdict` and one admission module.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuforge.admission import Admission, ValidationWindow
from gpuforge.errors import GpuforgeError
from gpuforge.inventory.reader import ClusterView
from gpuforge.rollout.deploy import ValidationOutcome
from gpuforge.rollout.state import ResultRow
from gpuforge.slurm.control import NodeAction
from gpuforge.validate import pipeline
from gpuforge.validate.report import write_reports
from gpuforge.validate.result import BatchSummary, Level


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
) -> ValidationOutcome:
    """Run the validators at ``level`` on ``hosts`` and write their JSON/JUnit/HTML reports.

    ``reservation`` is the Slurm reservation the acceptance jobs run in (nodes not admitted yet);
    ``known_good`` are admitted, idle nodes the multi-node tests may pair suspects with;
    ``peer_reference`` their last measured values (check -> node -> value), which join the
    batch's peer comparisons.
    """
    wiring = pipeline.wire(inventory)
    options = pipeline.ValidationOptions(
        level=Level(level),
        work_dir=report_dir,
        reservation=reservation,
        peer_reference=dict(peer_reference or {}),
    )
    summary = pipeline.run_validation(
        wiring.view, hosts, options, wiring.deps, known_good=known_good
    )
    paths = write_reports(summary, report_dir)
    verdicts = {n.node: n for n in summary.nodes}
    return ValidationOutcome(verdicts, result_rows(summary), tuple(paths.values()))


def validate_and_admit(
    view: ClusterView,
    hosts: Sequence[str],
    opts: pipeline.ValidationOptions,
    deps: pipeline.ValidationDeps,
    admission: Admission | None,
    *,
    drain: bool,
) -> tuple[BatchSummary, list[NodeAction]]:
    """``gpuforge validate``: validate ``hosts``; with ``drain``, admit the verdicts in Slurm.

    Level full runs its NCCL jobs inside the maintenance window ``opts.reservation`` (opened
    over ``hosts``, closed whatever happens). When Slurm cannot be reached for the admission,
    each node's action says so and the verdicts stand (the validation itself ran).
    """
    window_name = opts.reservation if admission is not None and hosts else None
    actions: list[NodeAction] = []
    if admission is None:
        return pipeline.run_validation(view, list(hosts), opts, deps), actions
    with ValidationWindow(admission, window_name, list(hosts)) as window:
        summary = pipeline.run_validation(view, list(hosts), opts, deps)
        if drain:
            try:
                actions = window.admit(summary.nodes)
            except GpuforgeError as exc:
                actions = [
                    NodeAction(n.node, "none", False, detail=f"slurm unavailable: {exc}")
                    for n in summary.nodes
                ]
    return summary, actions
