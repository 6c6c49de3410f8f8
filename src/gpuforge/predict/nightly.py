"""Acting on a ranking for a cluster: admission, its circuit breaker, the history record.

What ``gpuforge fleet risk --drain-top N`` and ``--policy FILE`` (the nightly ranking the
services host runs) share: the :class:`~gpuforge.admission.Admission` of the cluster with the
health collector's breaker limits, the per-night budget of a policy (predicted drains already
made in the last 24 h, read from the admission record, count against ``max_per_night``), and the
``drain`` event each drain writes to the cluster's history store, so the scorecard sees it; and
what the nightly run leaves behind: its report (:func:`write_report`, ``risk-<UTC>.json``) and its
node_exporter textfile metrics (:func:`metrics`, through :mod:`gpuforge.textfile`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gpuforge.admission import Admission, AdmissionRecord, BreakerPolicy, record_path
from gpuforge.atomic import write_atomic
from gpuforge.health.decide import DecisionPolicy
from gpuforge.health.fleet import Fleet
from gpuforge.history.store import HistoryStore, history_path
from gpuforge.predict import act
from gpuforge.predict.calibration import Evaluation, evaluate, failed_after
from gpuforge.predict.policy import DrainPolicy
from gpuforge.predict.score import PREDICTED_PREFIX, RiskReport, score_telemetry
from gpuforge.predict.signals import Window
from gpuforge.predict.telemetry import Telemetry
from gpuforge.slurm.control import SlurmClient
from gpuforge.textfile import Family

#: A night: the span over which ``max_per_night`` counts predicted drains.
NIGHT_S = 86_400.0
#: The admission source of predicted drains.
SOURCE = "predict"
#: What a drain outcome says (:class:`~gpuforge.predict.act.DrainOutcome`), every one a series.
OUTCOMES = ("drain", "refused", "busy", "skipped", "none")
#: A report's file name: ``risk-<UTC time of the run>.json``.
REPORT_NAME = "risk-{:%Y%m%dT%H%M%SZ}.json"


@dataclass(frozen=True)
class DrainRequest:
    """How many nodes to consider and under which limits (from flags or a policy file)."""

    top: int
    min_score: float
    include_busy: bool
    shadow: bool
    max_fraction: float


def from_policy(policy: DrainPolicy, already: int) -> DrainRequest:
    """The request of a policy, ``already`` predicted drains having been made tonight."""
    return DrainRequest(
        top=max(policy.max_per_night - already, 0),
        min_score=policy.threshold,
        include_busy=not policy.idle_only,
        shadow=policy.shadow,
        max_fraction=policy.max_fraction,
    )


def breaker(fleet: Fleet, max_fraction: float) -> BreakerPolicy:
    """The health collector's limits (DecisionPolicy) over every GPU node of the inventory.

    A node without a leaf counts towards the total only.
    """
    decide = DecisionPolicy()
    return BreakerPolicy(
        population=len(fleet.nodes),
        max_fraction=max_fraction,
        max_per_group=decide.max_per_leaf,
        groups=dict(fleet.leaves),
        window_s=decide.window_s,
    )


def admission(
    fleet: Fleet, slurm: SlurmClient, state_dir: Path, *, shadow: bool, max_fraction: float
) -> Admission:
    """The cluster's admission for predicted drains."""
    return Admission(
        slurm,
        AdmissionRecord(record_path(state_dir, fleet.name)),
        source=SOURCE,
        breaker=breaker(fleet, max_fraction),
        shadow=shadow,
    )


def drained_tonight(record: AdmissionRecord, *, shadow: bool, now: float) -> int:
    """Predicted drains made in the last :data:`NIGHT_S` (shadow ones when in shadow mode)."""
    count = 0
    for row in record.actions(since=now - NIGHT_S, action="drain"):
        a = row.action
        # a shadow decision changes nothing (changed is false): it counts in shadow mode
        if row.source == SOURCE and a.shadow == shadow and (a.changed or shadow):
            count += a.reason.startswith(PREDICTED_PREFIX)
    return count


def history_recorder(state_dir: Path, cluster: str) -> Callable[[act.DrainOutcome], None]:
    """A callback that writes a drain to the cluster's history store (when it has one)."""
    store_path = history_path(state_dir, cluster)

    def record(outcome: act.DrainOutcome) -> None:
        if not store_path.is_file():
            return
        with HistoryStore.open(store_path, create=False) as store:
            store.add_event(
                outcome.node,
                "drain",
                check=act.predicted_check(outcome.signal),
                action=act.PREDICTED_ACTION,
                source=SOURCE,
                detail=outcome.reason,
            )

    return record


def drain(
    report: RiskReport,
    fleet: Fleet,
    slurm: SlurmClient,
    state_dir: Path,
    request: DrainRequest,
) -> list[act.DrainOutcome]:
    """Drain per ``request`` through the cluster's admission; each drain recorded."""
    if request.top <= 0:
        return []
    gate = admission(
        fleet, slurm, state_dir, shadow=request.shadow, max_fraction=request.max_fraction
    )
    return act.drain_top(
        report,
        gate,
        request.top,
        include_busy=request.include_busy,
        min_score=request.min_score,
        on_drained=history_recorder(state_dir, fleet.name),
        known=set(fleet.nodes),
    )


def nightly(
    report: RiskReport,
    fleet: Fleet,
    slurm: SlurmClient,
    state_dir: Path,
    policy: DrainPolicy,
    *,
    now: float | None = None,
) -> tuple[int, list[act.DrainOutcome]]:
    """Apply a policy: how many predicted drains the night had already, and the outcomes."""
    record = AdmissionRecord(record_path(state_dir, fleet.name))
    already = drained_tonight(record, shadow=policy.shadow, now=time.time() if now is None else now)
    return already, drain(report, fleet, slurm, state_dir, from_policy(policy, already))


def act_on(
    report: RiskReport,
    fleet: Fleet,
    slurm: SlurmClient,
    state_dir: Path,
    *,
    policy: DrainPolicy | None,
    request: DrainRequest,
) -> tuple[int, list[act.DrainOutcome]]:
    """Per the policy when there is one (the nightly ranking), else per the flags' request."""
    if policy is not None:
        return nightly(report, fleet, slurm, state_dir, policy)
    return 0, drain(report, fleet, slurm, state_dir, request)


def scorecard(
    telemetry: Telemetry,
    admitted: Path | None,
    window: Window,
    *,
    horizon_s: float,
    threshold: float,
) -> tuple[act.Scorecard, Evaluation | None]:
    """Past predicted drains judged, and the calibration when the telemetry is labelled.

    The events are the telemetry's merged with the admission record's drains and resumes (when
    ``admitted`` exists). Telemetry with failures or RMAs after ``window.at`` is labelled:
    the ranking at ``window.at`` is evaluated against them (:func:`calibration.evaluate`).
    """
    events = telemetry.events
    if admitted is not None and admitted.is_file():
        events = act.merge_events(events, act.admission_events(AdmissionRecord(admitted)))
    card = act.scorecard(events, now=window.at, horizon_s=horizon_s)
    failed = failed_after(telemetry.events, window.at, horizon_s)
    if not failed:
        return card, None
    report = score_telemetry(telemetry, window, horizon_s=horizon_s)
    return card, evaluate(report, failed, threshold=threshold)


def write_report(directory: Path, document: str, *, now: float) -> Path:
    """``document`` (the ``--json`` text) as ``directory/risk-<UTC now>.json``, atomically."""
    name = REPORT_NAME.format(datetime.fromtimestamp(now, UTC))
    text = document if document.endswith("\n") else document + "\n"
    return write_atomic(directory / name, text)


def metrics(
    report: RiskReport,
    outcomes: Sequence[act.DrainOutcome],
    *,
    shadow: bool,
    limit: int,
    now: float,
) -> list[Family]:
    """The run's textfile metrics (docs/predictive.md, "The nightly run's files").

    Per-node scores for the ``limit`` highest-ranked nodes with findings and every node the run
    acted on (bounded: never the whole fleet); drain outcomes per action for both modes, the
    run's mode counted, the other zero, so the series stay when the policy leaves shadow.
    """
    at_risk = [r for r in report.ranked if r.score > 0]
    shown = {r.node: r.score for r in at_risk[:limit]}
    shown.update((o.node, o.score) for o in outcomes if o.node not in shown)
    counts = dict.fromkeys(OUTCOMES, 0)
    for o in outcomes:
        counts[o.action] = counts.get(o.action, 0) + 1
    mode = "shadow" if shadow else "live"
    return [
        Family.single(
            "gpuforge_predict_last_run_timestamp_seconds",
            "When the predictive ranking last ran (Unix time).",
            int(now),  # whole seconds down, as the report's file name has them
        ),
        Family.single(
            "gpuforge_predict_scored_at_timestamp_seconds",
            "The time the last ranking scored the fleet as of (--at; Unix time).",
            round(report.at),
        ),
        Family(
            "gpuforge_predict_nodes",
            "Nodes of the last ranking: scored, with findings, too little data to score.",
            "gauge",
            [
                ({"state": "scored"}, len(report.ranked)),
                ({"state": "with_findings"}, len(at_risk)),
                ({"state": "insufficient_data"}, len(report.insufficient)),
            ],
        ),
        Family.single(
            "gpuforge_predict_facility_findings",
            "Facility findings (racks or leaves degrading together) of the last ranking.",
            len(report.groups),
        ),
        Family(
            "gpuforge_predict_node_score",
            "Risk score (0-1) of the top-ranked nodes and of those the last run acted on.",
            "gauge",
            [({"node": node}, round(float(score), 4)) for node, score in shown.items()],
        ),
        Family(
            "gpuforge_predict_drains",
            "Drain outcomes of the last run, by action and mode (shadow: decided, not made).",
            "gauge",
            [
                ({"mode": m, "action": a}, n if m == mode else 0)
                for m in ("live", "shadow")
                for a, n in counts.items()
            ],
        ),
    ]
