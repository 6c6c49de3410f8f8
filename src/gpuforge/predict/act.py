"""Acting on a risk ranking: drain the top nodes through admission; score past predictions.

Draining (``gpuforge fleet risk --drain-top N``): the N highest-ranked nodes whose score reaches
``min_score`` are drained with the reason ``gpuforge:predicted.<signal>:validate``
(:data:`~gpuforge.predict.score.PREDICTED_PREFIX`): the check is the prediction, the action is
``validate`` because the remediation loop's answer to a prediction is to test the node
(``gpuforge validate --drain`` resumes it on a pass and quarantines it on a failure). The reason
keeps admission's one format, so gpuforge recognises its own drain and may lift it later.

Only idle nodes are drained by default. A Slurm drain does not kill a running job (the node shows
DRAINING and leaves service when the job ends), so draining a busy node would also be safe for
the job; we still leave busy nodes alone unless ``include_busy`` is set, because a prediction is a
probability: the circuit breaker's budget should go to nodes that leave service now, and the node
is taken at the next run after its job ends. With ``include_busy`` a busy node is drained at once
and leaves service at its next idle moment. Nodes already drained (by anyone) and down nodes are
never touched; every drain goes through :class:`gpuforge.admission.Admission`, so operators'
drains are untouched and the circuit breaker decides.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from gpuforge.admission import Admission, AdmissionRecord, format_reason
from gpuforge.predict.score import PREDICTED_PREFIX, NodeRisk, RiskReport
from gpuforge.predict.telemetry import Event, format_time
from gpuforge.slurm import control
from gpuforge.validate.result import CheckResult, NodeVerdict, Status, Verdict

#: The drain action of a predicted node: test it (``validate``), then resume or quarantine.
PREDICTED_ACTION = "validate"
#: The lowest score drained by default.
MIN_DRAIN_SCORE = 0.5


def predicted_check(signal: str) -> str:
    """The check name a predicted drain carries: ``predicted.<signal>``."""
    return f"predicted.{signal}"


def predicted_reason(signal: str) -> str:
    """The drain reason: ``gpuforge:predicted.<signal>:validate``."""
    return format_reason(predicted_check(signal), PREDICTED_ACTION)


@dataclass(frozen=True)
class DrainOutcome:
    """What happened to one of the top nodes."""

    node: str
    score: float
    signal: str
    action: str  # drain | refused | busy | skipped | none
    reason: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "node": self.node,
            "score": round(self.score, 4),
            "signal": self.signal,
            "action": self.action,
            "reason": self.reason,
            "detail": self.detail,
        }


def drain_candidates(report: RiskReport, top: int, min_score: float) -> list[NodeRisk]:
    """The ``top`` highest-ranked scored nodes with a score of at least ``min_score``."""
    return [r for r in report.ranked if r.score >= min_score and r.findings][:top]


def drain_top(
    report: RiskReport,
    admission: Admission,
    top: int,
    *,
    include_busy: bool = False,
    min_score: float = MIN_DRAIN_SCORE,
    on_drained: Callable[[DrainOutcome], None] | None = None,
    known: Collection[str] | None = None,
) -> list[DrainOutcome]:
    """Drain the top nodes per the module's policy; one outcome per candidate.

    ``known``: the cluster's nodes (the inventory); a candidate outside it is skipped, not asked
    of Slurm (telemetry may hold nodes of another cluster).
    """
    chosen = drain_candidates(report, top, min_score)
    if not chosen:
        return []
    asked = [r.node for r in chosen if known is None or r.node in known]
    states = {
        s.name: s
        for s in (
            control.node_states(admission.slurm, asked, timeout=admission.timeout) if asked else []
        )
    }
    out: list[DrainOutcome] = []
    verdicts: list[NodeVerdict] = []
    by_node: dict[str, NodeRisk] = {}
    for risk in chosen:
        signal = risk.top_signal
        reason = predicted_reason(signal)
        state = states.get(risk.node)
        if state is None:
            out.append(_outcome(risk, "skipped", reason, "not a node of this cluster"))
        elif state.drained:
            who = state.reason or "(no reason)"
            out.append(_outcome(risk, "skipped", reason, f"already drained: {who}"))
        elif state.state in ("DOWN", "FAIL", "FAILING") or "NOT_RESPONDING" in state.flags:
            out.append(_outcome(risk, "skipped", reason, f"{state.state_text}: not in service"))
        elif state.busy and not include_busy:
            out.append(
                _outcome(
                    risk,
                    "busy",
                    reason,
                    f"{state.state_text}: a job runs; not drained (taken at a later run when idle,"
                    " or now with --include-busy)",
                )
            )
        else:
            check = predicted_check(signal)
            finding = risk.findings[0]
            result = CheckResult(
                node=risk.node,
                check=check,
                status=Status.FAIL,
                measured=round(risk.score, 3),
                expected=f"risk below {min_score}",
                message=f"{finding.subject}: {finding.detail}",
            )
            verdicts.append(NodeVerdict(risk.node, Verdict.QUARANTINE, (check,), (), (result,)))
            by_node[risk.node] = risk
    if verdicts:
        actions = admission.admit(verdicts, actions=dict.fromkeys(by_node, PREDICTED_ACTION))
        for act in actions:
            risk = by_node[act.node]
            busy = states[act.node].busy
            detail = act.detail
            if act.action == "drain" and busy:
                detail += "; the running job finishes, the node leaves service when it ends"
            outcome = _outcome(risk, act.action, act.reason, detail)
            out.append(outcome)
            if act.action == "drain" and act.changed and on_drained is not None:
                on_drained(outcome)
    order = {r.node: i for i, r in enumerate(chosen)}
    out.sort(key=lambda o: order[o.node])
    return out


def _outcome(risk: NodeRisk, action: str, reason: str, detail: str) -> DrainOutcome:
    return DrainOutcome(risk.node, risk.score, risk.top_signal, action, reason, detail)


# -- the scorecard --------------------------------------------------------------------------------

#: Events that confirm a predicted fault when they follow the prediction within the horizon.
CONFIRMING = ("failure", "rma")


@dataclass(frozen=True)
class Prediction:
    """One past predicted drain and what became of it."""

    node: str
    time: float
    signal: str
    outcome: str  # confirmed | false_alarm | pending | no_outcome
    evidence: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "node": self.node,
            "time": format_time(self.time),
            "signal": self.signal,
            "outcome": self.outcome,
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class Scorecard:
    """Precision of past predictions, overall and per signal."""

    predictions: tuple[Prediction, ...]
    horizon_s: float

    def counts(self, signal: str | None = None) -> dict[str, int]:
        """Predictions per outcome (of one signal, or all)."""
        out = dict.fromkeys(("confirmed", "false_alarm", "pending", "no_outcome"), 0)
        for p in self.predictions:
            if signal is None or p.signal == signal:
                out[p.outcome] += 1
        return out

    def precision(self, signal: str | None = None) -> float | None:
        """confirmed / (confirmed + false alarms); None before any prediction concluded."""
        c = self.counts(signal)
        decided = c["confirmed"] + c["false_alarm"]
        return c["confirmed"] / decided if decided else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of ``gpuforge fleet risk --scorecard --json``."""
        signals = sorted({p.signal for p in self.predictions})
        return {
            "schema": "gpuforge.scorecard/1",
            "horizon_s": self.horizon_s,
            "counts": self.counts(),
            "precision": self.precision(),
            "by_signal": {
                s: {"counts": self.counts(s), "precision": self.precision(s)} for s in signals
            },
            "predictions": [p.to_dict() for p in self.predictions],
        }


def _predicted_signal(event: Event) -> str | None:
    if event.event != "drain" or not event.detail.startswith(PREDICTED_PREFIX):
        return None
    rest = event.detail[len(PREDICTED_PREFIX) :]
    return rest.split(":", 1)[0] or "unknown"


def scorecard(events: Sequence[Event], *, now: float, horizon_s: float) -> Scorecard:
    """Judge every predicted drain in ``events`` by what followed it on the same node.

    Confirmed: a ``failure`` or ``rma`` event, or a drain by a failed check (validation
    quarantined the node), within ``horizon_s`` after the prediction. False alarm: the node was
    resumed (it passed its test) before any of these. Pending: neither yet, horizon not over;
    no outcome: the horizon passed with nothing recorded (not counted in the precision).
    """
    by_node: dict[str, list[Event]] = defaultdict(list)
    for e in sorted(events, key=lambda e: e.time):
        by_node[e.node].append(e)
    out: list[Prediction] = []
    for node, seq in sorted(by_node.items()):
        for i, e in enumerate(seq):
            signal = _predicted_signal(e)
            if signal is None:
                continue
            outcome, evidence = "", ""
            for later in seq[i + 1 :]:
                if later.time > e.time + horizon_s:
                    break
                if _predicted_signal(later) is not None:
                    continue
                if later.event in CONFIRMING or (
                    later.event == "drain" and later.detail.startswith("gpuforge:")
                ):
                    outcome = "confirmed"
                elif later.event == "resume":
                    outcome = "false_alarm"
                if outcome:
                    evidence = f"{later.event} at {format_time(later.time)}" + (
                        f": {later.detail}" if later.detail else ""
                    )
                    break
            if not outcome:
                outcome = "pending" if now < e.time + horizon_s else "no_outcome"
            out.append(Prediction(node, e.time, signal, outcome, evidence))
    out.sort(key=lambda p: (p.time, p.node))
    return Scorecard(tuple(out), horizon_s)


def admission_events(record: AdmissionRecord) -> list[Event]:
    """Drains and resumes the admission record holds, as telemetry events.

    Every automatic Slurm change goes through admission, so its record closes the loop even where
    the history store has no event: a predicted node that ``gpuforge validate --drain`` resumed is
    a false alarm, one it quarantined a confirmed fault. Shadow decisions and refusals are left out.
    """
    out: list[Event] = []
    for row in record.actions():
        a = row.action
        if a.action in ("drain", "resume") and a.changed and not a.shadow:
            out.append(Event(row.at, a.node, a.action, detail=a.reason))
    return out


def merge_events(*sources: Sequence[Event], tolerance_s: float = 120.0) -> list[Event]:
    """Events of several sources, time-ordered; one event seen by two sources counts once.

    Two events are the same when node, kind and detail match and their times differ by at most
    ``tolerance_s`` (the store and the admission record stamp one drain a moment apart).
    """
    merged: list[Event] = []
    seen: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for index, source in enumerate(sources):
        mine: list[tuple[tuple[str, str, str], float]] = []
        for e in source:
            key = (e.node, e.event, e.detail)
            if index and any(abs(e.time - t) <= tolerance_s for t in seen[key]):
                continue
            merged.append(e)
            mine.append((key, e.time))
        for key, t in mine:
            seen[key].append(t)
    merged.sort(key=lambda e: e.time)
    return merged
