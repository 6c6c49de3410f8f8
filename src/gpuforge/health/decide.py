"""What the collector does with a node's request: drain, resume, or nothing, through admission.

A node computes its ``request`` from its own hysteresis streaks (``drain`` after ``fail_after``
consecutive FAILs of a non-shadow check, ``resume`` when what failed has passed ``pass_after``
times); the controller decides whether to act on it. :class:`Decider` is the one decider of a
cluster: it takes records in batches under one lock, so a fleet-wide burst (slurmd runs every
node's check at the same moment) meets the circuit breaker one batch at a time and never races
it. Every Slurm change goes through :class:`gpuforge.admission.Admission` (``source="health"``),
which records each decision, refusals included. The rules:

* ``drain`` -> a ``quarantine`` verdict with the requested action, reason
  ``gpuforge:<check>[+n]:<action>``, only when the requested check is FAIL in the record itself
  (a check that could not run, ERROR, never drains: the decision is ``held``) and the action is
  one that takes a node out of service (``monitor`` and ``none`` do not);
* the circuit breaker (:class:`DecisionPolicy`): at most ``max_fraction`` of the fleet and
  ``max_per_leaf`` nodes under one leaf switch (rail 0's) taken out of service per ``window_s``;
  what it refuses is recorded, answered ``refused`` and exported for an alert;
* a ``drain`` from a record taken before the node was last resumed through admission (an
  upgrade or a remediation validated it since) is superseded: a spooled record sent late must not
  take a freshly validated node out again;
* ``resume`` -> only a node drained by gpuforge for a health check that the same record reports
  passing, and only for an action in ``resume_actions`` (default ``quarantine``: conditions that
  clear by themselves). A drain for ``reset_gpu``, ``reboot``, ``inspect`` or ``rma`` is lifted by
  ``gpuforge remediate`` after re-validation; ``gpuforge:join:*``, upgrade and predicted drains
  and every operator's drain are never lifted here.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gpuforge.admission import ACTIONS, Admission, BreakerPolicy, parse_reason
from gpuforge.errors import InputError
from gpuforge.history.store import HistoryEvent, HistoryStore, parse_time
from gpuforge.node import record as node_record
from gpuforge.slurm import control
from gpuforge.slurm.control import NodeAction
from gpuforge.validate.result import NodeVerdict, Status, Verdict

#: Admission's actions that a health drain may carry (``validate`` is the join's, not ours).
DRAIN_ACTIONS = frozenset(a for a in ACTIONS if a != "validate")


@dataclass(frozen=True)
class DecisionPolicy:
    """The collector's limits: the circuit breaker, what it may resume, shadow mode."""

    max_fraction: float = 0.01
    max_per_leaf: int | None = 1
    window_s: float = 600.0
    resume_actions: frozenset[str] = frozenset({"quarantine"})
    shadow: bool = False

    def __post_init__(self) -> None:
        unknown = sorted(self.resume_actions - DRAIN_ACTIONS)
        if unknown:
            raise InputError(
                f"resume actions {', '.join(unknown)} unknown (one of {', '.join(DRAIN_ACTIONS)})"
            )

    def breaker(self, leaves: Mapping[str, str]) -> BreakerPolicy:
        """The admission breaker over ``leaves`` (node -> its rail-0 leaf): the fleet's nodes."""
        return BreakerPolicy(
            population=max(1, len(leaves)),
            max_fraction=self.max_fraction,
            max_per_group=self.max_per_leaf,
            groups=dict(leaves),
            window_s=self.window_s,
        )


@dataclass(frozen=True)
class Decision:
    """What the collector did with one record's request, as it answers the node.

    ``done``: ``drained``, ``resumed``, ``refused`` (circuit breaker), ``shadow`` (decided, not
    done), ``held`` (inconclusive: never drains), ``none`` (nothing to do, or not allowed: the
    detail says why).
    """

    node: str
    request: str  # drain | resume | none
    done: str
    changed: bool = False
    reason: str = ""
    detail: str = ""
    check: str = ""
    action: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The ``decision`` object of the collector's answer."""
        data = asdict(self)
        data.pop("extra")
        return data


@dataclass
class _Todo:
    index: int
    node: str
    check: str
    action: str


class Decider:
    """The one decider of a cluster: requests in, admission decisions out, serialized."""

    def __init__(
        self,
        admission: Admission,
        *,
        policy: DecisionPolicy | None = None,
        leaves: Mapping[str, str] | None = None,
        store: HistoryStore | None = None,
    ) -> None:
        self.policy = policy or DecisionPolicy()
        # A copy: the caller's admission (conformance shares one) keeps its own source and breaker.
        self.admission = replace(
            admission,
            source="health",
            shadow=self.policy.shadow,
            breaker=self.policy.breaker(leaves or {}),
        )
        self.store = store
        self._lock = threading.Lock()

    def decide(
        self,
        records: Sequence[Mapping[str, Any]],
        *,
        taken: Sequence[float | None] | None = None,
    ) -> list[Decision]:
        """One :class:`Decision` per record, in order; one admission call for the batch.

        ``taken``: when each record was taken, on the collector's clock
        (:func:`gpuforge.health.collector.taken_at`); None (or a None for one record): its
        ``started``, the node's clock.
        """
        if taken is not None and len(taken) != len(records):
            raise ValueError("one time per record")
        with self._lock:
            return self._decide(records, taken or [None] * len(records))

    def _decide(
        self, records: Sequence[Mapping[str, Any]], taken: Sequence[float | None]
    ) -> list[Decision]:
        out: list[Decision | None] = [None] * len(records)
        drains: list[tuple[_Todo, NodeVerdict]] = []
        resumes: list[tuple[int, Mapping[str, Any]]] = []
        for i, rec in enumerate(records):
            node = str(rec["node"])
            raw = rec.get("request")
            req: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
            op = str(req.get("op") or "")
            if not op:
                out[i] = Decision(node, "none", "none", detail="no request")
            elif op == "drain":
                out[i], verdict = self._drain_plan(i, node, rec, req, taken[i])
                if verdict is not None:
                    drains.append(verdict)
            elif op == "resume":
                resumes.append((i, rec))
            else:
                out[i] = Decision(node, "none", "none", detail=f"unknown request op {op!r}")
        admitted = self._resume_plan(resumes, out)
        verdicts = [v for _, v in drains] + [v for _, v in admitted]
        todo = [t for t, _ in drains] + [t for t, _ in admitted]
        if verdicts:
            # Several records of one node in a batch: the last one received is acted on.
            last: dict[str, int] = {}
            for j, t in enumerate(todo):
                if t.node not in last or t.index > todo[last[t.node]].index:
                    last[t.node] = j
            keep = sorted(last.values())
            actions = self.admission.admit(
                [verdicts[j] for j in keep],
                actions={todo[j].node: todo[j].action for j in keep if todo[j].action},
            )
            by_node = {a.node: a for a in actions}
            for j, t in enumerate(todo):
                out[t.index] = (
                    _from_action(t, by_node[t.node])
                    if last[t.node] == j
                    else Decision(t.node, "drain" if t.action else "resume", "none",
                                  detail="superseded by a later record of the node")
                )  # fmt: skip
        decisions = [d for d in out if d is not None]  # every index was decided above
        self._record(decisions)
        return decisions

    def _drain_plan(
        self,
        index: int,
        node: str,
        rec: Mapping[str, Any],
        req: Mapping[str, Any],
        taken: float | None,
    ) -> tuple[Decision | None, tuple[_Todo, NodeVerdict] | None]:
        check = str(req.get("check") or "")
        action = str(req.get("action") or "quarantine")
        checks = [c for c in rec.get("checks") or [] if isinstance(c, Mapping)]
        status = {str(c.get("check")): str(c.get("status")) for c in checks}
        if status.get(check) != Status.FAIL.value:
            found = status.get(check, "missing")
            return Decision(
                node,
                "drain",
                "held",
                check=check,
                action=action,
                detail=f"drain requested for {check or '(no check)'} but its status in the record "
                f"is {found}: only a FAIL drains",
            ), None
        resumed = self._resumed_since(node, rec, taken)
        if resumed:
            return Decision(
                node,
                "drain",
                "none",
                check=check,
                action=action,
                detail=f"superseded: the record was taken before {resumed}",
            ), None
        if action not in DRAIN_ACTIONS:
            return Decision(
                node,
                "drain",
                "none",
                check=check,
                action=action,
                detail=f"action {action} does not take a node out of service",
            ), None
        verdict = node_record.node_verdict(node, node_record.checks_of(rec), first=check)
        return None, (_Todo(index, node, check, action), verdict)

    def _resumed_since(self, node: str, rec: Mapping[str, Any], taken: float | None) -> str:
        """Who resumed ``node`` after ``rec`` was taken (validated since: an upgrade, a
        remediation), or empty. A spooled record sent late must not drain the node again.

        ``taken`` is the collector's clock, as the admission record's times are; without it the
        record's ``started`` (a node whose clock is behind would look taken before a resume)."""
        if taken is None:
            try:
                taken = parse_time(rec.get("started"), "record.started")
            except InputError:
                return ""
        for row in reversed(self.admission.record.actions(since=taken, action="resume")):
            if row.action.node == node and row.action.changed and not row.action.shadow:
                return f"the node was resumed by {row.source} ({row.action.detail or 'admitted'})"
        return ""

    def _resume_plan(
        self, resumes: list[tuple[int, Mapping[str, Any]]], out: list[Decision | None]
    ) -> list[tuple[_Todo, NodeVerdict]]:
        if not resumes:
            return []
        nodes = list(dict.fromkeys(str(r["node"]) for _, r in resumes))
        states = {s.name: s for s in control.node_states(self.admission.slurm, nodes)}
        plans: list[tuple[_Todo, NodeVerdict]] = []
        for i, rec in resumes:
            node = str(rec["node"])
            state = states[node]
            why = self._resume_refusal(state.drained, state.reason, rec)
            if why:
                out[i] = Decision(node, "resume", "none", reason=state.reason, detail=why)
                continue
            parsed = parse_reason(state.reason)
            todo = _Todo(i, node, parsed.check if parsed else "", "")
            plans.append((todo, NodeVerdict(node=node, verdict=Verdict.ADMIT)))
        return plans

    def _resume_refusal(self, drained: bool, reason: str, rec: Mapping[str, Any]) -> str:
        if not drained:
            return "not drained: nothing to resume"
        parsed = parse_reason(reason)
        if parsed is None:
            return f"drained by someone else ({reason}): only they resume it"
        checks = [c for c in rec.get("checks") or [] if isinstance(c, Mapping)]
        passing = {str(c.get("check")) for c in checks if c.get("status") == Status.PASS.value}
        name = parsed.check.rstrip("~")
        named = any(c.startswith(name) for c in passing) if parsed.truncated else name in passing
        if not named:
            return (
                f"drained for {parsed.check}:{parsed.action} ({reason}), which this record does "
                "not report passing: not a health drain this check can lift"
            )
        if parsed.action not in self.policy.resume_actions:
            return (
                f"drained for action {parsed.action}: resumed by `gpuforge remediate` after "
                "re-validation, not by a passing health check"
            )
        return ""

    def _record(self, decisions: Sequence[Decision]) -> None:
        """Write the decisions that did or refused something into the history's events."""
        if self.store is None:
            return
        kinds = {"drained": "drain", "resumed": "resume", "refused": "refused", "held": "hold"}
        events = [
            HistoryEvent(
                at=self.admission.clock(),
                node=d.node,
                kind=kinds[d.done],
                check=d.check,
                action=d.action,
                source="health",
                detail=d.detail,
                data={"reason": d.reason, "changed": d.changed},
            )
            for d in decisions
            if d.done in kinds and (d.changed or d.done in ("refused", "held"))
        ]
        if events:
            self.store.add_events(events)


def _from_action(todo: _Todo, action: NodeAction) -> Decision:
    request = "drain" if todo.action else "resume"
    if action.shadow and action.action in ("drain", "resume"):
        done = "shadow"
    else:
        done = {"drain": "drained", "resume": "resumed", "refused": "refused", "hold": "held"}.get(
            action.action, "none"
        )
    return Decision(
        node=todo.node,
        request=request,
        done=done,
        changed=action.changed,
        reason=action.reason,
        detail=action.detail,
        check=todo.check,
        action=todo.action,
        extra={"before": action.before, "after": action.after},
    )
