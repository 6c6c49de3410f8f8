"""Remediation: reset the GPUs or reboot nodes gpuforge drained for it, re-validate, admit.

The loop (docs/health.md, "Remediation and RMA"; one runbook per action in docs/runbooks/):

1. **Select.** A node is remediated only when it is drained with a gpuforge reason
   (:func:`gpuforge.admission.parse_reason`) whose action is ``reset_gpu`` or ``reboot``, and is
   idle (no job running or completing: :attr:`gpuforge.slurm.control.SlurmNode.busy`). An
   operator's drain is never touched; a busy node is skipped and picked up by a later run.
2. **Act** through Ansible (``playbooks/remediate.yml``): ``nvidia-smi -r`` per GPU, or a reboot.
3. **Re-validate** at level ``burnin`` through the validation pipeline, inside a maintenance
   window with a few idle admitted nodes as ib_write_bw partners (as ``gpuforge deploy`` does).
4. **Admit** through :class:`gpuforge.admission.Admission`: a pass resumes the node; an
   inconclusive run (hold) leaves it as it was; a failure leaves it drained with its reason (the
   window gives it back), and the failure counts.
5. **Escalate** to RMA: after ``Policy.failures`` remediations within ``Policy.window_s`` that
   failed or did not hold (the node came back drained for the same check; two in seven days, as
   NVSentinel and gpud do), and at once for ``inspect`` (a person has to reseat or inspect the
   part). The evidence bundle is written (:mod:`gpuforge.health.rma`), then the node is drained
   ``gpuforge:<check>:rma`` through admission.

Every step is an event in the history store (kind ``remediation`` or ``rma``, step in
``data["step"]``), written before the next step starts. A killed run is safe to run again: a
maintenance window it left is closed first (every node gets its state from before), a node whose
action was done but not judged is validated without acting again, and the failures counted are
only the concluded ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuforge.admission import Admission, ValidationWindow, parse_reason
from gpuforge.errors import GpuforgeError
from gpuforge.execution import plays
from gpuforge.history import HistoryStore
from gpuforge.rollout.lock import cluster_lock
from gpuforge.slurm import control
from gpuforge.slurm.control import NodeAction, SlurmNode
from gpuforge.validate import pipeline
from gpuforge.validate.report import write_reports
from gpuforge.validate.result import (
    BatchSummary,
    CheckResult,
    Level,
    NodeVerdict,
    Status,
    Verdict,
)

if TYPE_CHECKING:
    from gpuforge.health import rma  # rma imports this module's event kinds

#: Drain actions this module carries out itself.
REMEDIABLE = ("reset_gpu", "reboot")
#: Drain actions that need a person's hands: straight to RMA with an evidence bundle.
HANDS = ("inspect",)
#: History event kinds this module writes.
EVENT_REMEDIATION = "remediation"
EVENT_RMA = "rma"
#: The ``source`` of the events and admission actions this module writes.
SOURCE = "remediate"
#: Seconds the remediation play may run per node batch (a reboot waits up to 30 minutes).
PLAY_TIMEOUT_S = 3600


@dataclass(frozen=True)
class Policy:
    """When remediation gives up, and how it re-validates."""

    #: Failed remediations within ``window_s`` that send a node to RMA.
    failures: int = 2
    window_s: float = 7 * 86400.0
    #: Admitted idle nodes taken into the window as ib_write_bw partners.
    partners: int = 2
    #: The maintenance reservation re-validation runs in.
    reservation: str = "gpuforge_remediate"


@dataclass(frozen=True)
class Candidate:
    """A node gpuforge drained for an action, idle now."""

    node: str
    check: str
    action: str
    reason: str


@dataclass(frozen=True)
class RemediationOutcome:
    """What remediation did (or, in a dry run, would do) to one node.

    ``result``: ``resumed`` (passed, back in service), ``failed`` (the action or the
    re-validation failed; stays drained), ``held`` (re-validation inconclusive; as it was),
    ``escalated`` (drained for RMA, bundle written), ``skipped`` (not remediable now: why in
    ``detail``), ``planned`` (dry run: ``detail`` says what would be done).
    """

    node: str
    result: str
    detail: str
    check: str = ""
    action: str = ""
    failures: int = 0
    bundle: str = ""
    slurm: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return asdict(self)


def select(
    states: Iterable[SlurmNode], *, named: bool = False
) -> tuple[list[Candidate], list[RemediationOutcome]]:
    """Split node states into candidates and skipped nodes (with why).

    ``named``: the operator named these nodes, so every node that is not a candidate is
    reported; otherwise only drained ones are (a healthy node is not news).
    """
    candidates: list[Candidate] = []
    skipped: list[RemediationOutcome] = []
    for s in states:
        if not s.drained:
            if named:
                skipped.append(
                    RemediationOutcome(s.name, "skipped", f"not drained ({s.state_text})")
                )
            continue
        reason = parse_reason(s.reason)
        if reason is None:
            why = f"drained by an operator ({s.reason or 'no reason'}): never touched"
            skipped.append(RemediationOutcome(s.name, "skipped", why))
            continue
        base = RemediationOutcome(s.name, "skipped", "", check=reason.check, action=reason.action)
        if reason.action == "rma":
            skipped.append(_with(base, detail=f"waiting for RMA ({s.reason})"))
        elif reason.action not in (*REMEDIABLE, *HANDS):
            skipped.append(
                _with(base, detail=f"{reason.action}: re-validated by deploy/validate, not here")
            )
        elif s.busy:
            skipped.append(_with(base, detail=f"busy ({s.state_text}): a job runs or completes"))
        else:
            candidates.append(Candidate(s.name, reason.check, reason.action, s.reason))
    return candidates, skipped


def _with(outcome: RemediationOutcome, **changes: Any) -> RemediationOutcome:
    return RemediationOutcome(**{**asdict(outcome), **changes})


#: Runs one action on nodes; returns {node: error} for the nodes where it failed.
ActFn = Callable[[Sequence[str], str], Mapping[str, str]]
#: Validates ``nodes`` at level burnin with ``partners`` as known-good peers.
ValidateFn = Callable[[Sequence[str], Sequence[str]], BatchSummary]
#: Writes the RMA evidence bundle of (node, check, why); returns the archive's path.
BundleFn = Callable[[str, str, str], Path]


@dataclass
class Remediator:
    """One remediation run over some candidates (:func:`select`)."""

    admission: Admission
    history: HistoryStore
    act: ActFn
    validate: ValidateFn
    bundle: BundleFn
    #: Nodes that may serve as ib_write_bw partners when idle and in service.
    population: Sequence[str] = ()
    policy: Policy = field(default_factory=Policy)
    clock: Callable[[], float] = time.time

    def failures(self, node: str, check: str) -> int:
        """Remediations of ``node`` within the policy's window that failed or did not hold.

        For a node drained for ``check`` now: a remediation that failed counts, and so does one
        that resumed the node for the same check, since the fault came back (gpud's rule: a
        reboot, then the failure again, is hardware). Interrupted ones do not count.
        """
        since = self.clock() - self.policy.window_s
        count = 0
        for e in self.history.events(node=node, kinds=[EVENT_REMEDIATION], since=since):
            data = e.data or {}
            if data.get("step") != "concluded":
                continue
            outcome = data.get("outcome")
            count += outcome == "failed" or (outcome == "resumed" and e.check == check)
        return count

    def _pending_step(self, node: str) -> str:
        """The step the node's last remediation stopped at ("" when it concluded)."""
        last = self.history.events(node=node, kinds=[EVENT_REMEDIATION])
        step = str((last[-1].data or {}).get("step", "")) if last else ""
        return "" if step == "concluded" else step

    def plan(self, candidates: Sequence[Candidate]) -> list[RemediationOutcome]:
        """What :meth:`run` would do, changing nothing (``--dry-run``)."""
        out: list[RemediationOutcome] = []
        for c in candidates:
            failures = self.failures(c.node, c.check)
            why = self._escalation(c, failures)
            if why:
                detail = f"would escalate to RMA ({why}), write a bundle, drain {c.check}:rma"
            elif self._pending_step(c.node) == "acted":
                detail = f"{c.action} done by a killed run: would re-validate at level burnin"
            else:
                detail = f"would {c.action.replace('_', ' ')}, re-validate at level burnin"
            out.append(RemediationOutcome(c.node, "planned", detail, c.check, c.action, failures))
        return out

    def _escalation(self, c: Candidate, failures: int) -> str:
        if c.action in HANDS:
            return f"{c.action} needs a person"
        if failures >= self.policy.failures:
            days = self.policy.window_s / 86400
            return f"{failures} remediations within {days:g} days failed or did not hold"
        return ""

    def run(self, candidates: Sequence[Candidate]) -> list[RemediationOutcome]:
        """Remediate ``candidates``; one :class:`RemediationOutcome` per node."""
        if self.admission.record.window(self.policy.reservation) is not None:
            self.admission.close_window(self.policy.reservation)  # a killed run's
        out: list[RemediationOutcome] = []
        todo: dict[str, list[Candidate]] = {}
        validate_only: list[Candidate] = []
        for c in candidates:
            why = self._escalation(c, self.failures(c.node, c.check))
            if why:
                out.append(self.escalate(c, why))
            elif self._pending_step(c.node) == "acted":
                validate_only.append(c)
            else:
                todo.setdefault(c.action, []).append(c)
        acted: list[Candidate] = list(validate_only)
        for action, group in sorted(todo.items()):
            for c in group:
                self._event(c, "start", f"{action} started")
            errors = self._act([c.node for c in group], action)
            for c in group:
                if c.node in errors:
                    out.append(self._failed(c, f"{action} failed: {errors[c.node]}"))
                else:
                    self._event(c, "acted", f"{action} done")
                    acted.append(c)
        if acted:
            out += self._revalidate(acted)
        return out

    def _act(self, nodes: list[str], action: str) -> Mapping[str, str]:
        try:
            return self.act(nodes, action)
        except GpuforgeError as exc:
            return dict.fromkeys(nodes, str(exc))

    def _revalidate(self, acted: list[Candidate]) -> list[RemediationOutcome]:
        nodes = [c.node for c in acted]
        others = [n for n in self.population if n not in set(nodes)]
        partners = self.admission.idle_in_service(others, self.policy.partners)
        with ValidationWindow(
            self.admission, self.policy.reservation, [*nodes, *partners]
        ) as window:
            summary = self.validate(nodes, partners)
            verdicts = {v.node: v for v in summary.nodes if v.node in set(nodes)}
            # A failed node is not admitted here: closing the window gives it back its reason.
            admitted = window.admit(
                [v for v in verdicts.values() if v.verdict is not Verdict.QUARANTINE]
            )
        slurm = {a.node: a for a in admitted}
        out: list[RemediationOutcome] = []
        for c in acted:
            verdict = verdicts.get(c.node)
            out.append(self._judged(c, verdict, slurm.get(c.node)))
        return out

    def _judged(
        self, c: Candidate, verdict: NodeVerdict | None, slurm: NodeAction | None
    ) -> RemediationOutcome:
        data = {"verdict": verdict.to_dict() if verdict else None}
        if verdict is None or verdict.verdict is Verdict.HOLD:
            why = ", ".join(verdict.reasons) if verdict else "no verdict"
            return self._conclude(c, "held", f"re-validation inconclusive ({why})", data, slurm)
        if verdict.verdict is Verdict.ADMIT:
            return self._conclude(c, "resumed", "re-validated at level burnin: pass", data, slurm)
        return self._failed(c, "re-validation failed: " + ", ".join(verdict.reasons), data, slurm)

    def _failed(
        self,
        c: Candidate,
        detail: str,
        data: Mapping[str, Any] | None = None,
        slurm: NodeAction | None = None,
    ) -> RemediationOutcome:
        """Record a failed remediation; escalate when it is one too many."""
        outcome = self._conclude(c, "failed", detail, data, slurm)
        why = self._escalation(c, outcome.failures)
        return self.escalate(c, why) if why else outcome

    def _conclude(
        self,
        c: Candidate,
        result: str,
        detail: str,
        data: Mapping[str, Any] | None = None,
        slurm: NodeAction | None = None,
    ) -> RemediationOutcome:
        failures = self.failures(c.node, c.check) + (result == "failed")
        self._event(c, "concluded", detail, {"outcome": result, **(data or {})})
        state = f"{slurm.action}: {slurm.before} -> {slurm.after}" if slurm else ""
        return RemediationOutcome(c.node, result, detail, c.check, c.action, failures, slurm=state)

    def escalate(self, c: Candidate, why: str) -> RemediationOutcome:
        """Write the evidence bundle, then drain ``c.node`` for RMA through admission."""
        self.history.add_event(
            c.node,
            EVENT_RMA,
            at=self.clock(),
            check=c.check,
            action="rma",
            source=SOURCE,
            detail=f"escalating: {why}",
            data={"step": "escalating", "from": c.action},
        )
        try:
            bundle = str(self.bundle(c.node, c.check, why))
        except GpuforgeError as exc:
            bundle = ""
            why += f"; evidence bundle failed: {exc}"
        verdict = rma_verdict(c.node, c.check, why)
        (action,) = self.admission.admit([verdict], actions={c.node: "rma"})
        self.history.add_event(
            c.node,
            EVENT_RMA,
            at=self.clock(),
            check=c.check,
            action="rma",
            source=SOURCE,
            detail=f"escalated to RMA: {why}",
            data={"step": "escalated", "bundle": bundle, "reason": action.reason},
        )
        return RemediationOutcome(
            c.node,
            "escalated",
            f"escalated to RMA: {why}",
            c.check,
            c.action,
            self.failures(c.node, c.check),
            bundle,
            f"{action.action}: {action.before} -> {action.after} ({action.reason})",
        )

    def _event(
        self, c: Candidate, step: str, detail: str, data: Mapping[str, Any] | None = None
    ) -> None:
        self.history.add_event(
            c.node,
            EVENT_REMEDIATION,
            at=self.clock(),
            check=c.check,
            action=c.action,
            source=SOURCE,
            detail=detail,
            data={"step": step, **(data or {})},
        )


def rma_verdict(node: str, check: str, why: str) -> NodeVerdict:
    """A failed verdict whose drain reason is ``gpuforge:<check>:rma`` (admission's format)."""
    result = CheckResult(node=node, check=check, status=Status.FAIL, message=why, action="rma")
    return NodeVerdict(node, Verdict.QUARANTINE, (check,), (), (result,))


def candidates_now(
    admission: Admission, nodes: Sequence[str] | None
) -> tuple[list[Candidate], list[RemediationOutcome]]:
    """Read Slurm and :func:`select`: ``nodes`` when named, else every node (``--pending``)."""
    states = control.node_states(admission.slurm, nodes, timeout=admission.timeout)
    return select(states, named=nodes is not None)


def remediate(
    remediator: Remediator, nodes: Sequence[str] | None, *, dry_run: bool, lock_path: Path
) -> list[RemediationOutcome]:
    """``gpuforge remediate``: the outcomes of ``nodes`` (None: every pending node), then the
    skipped ones. A dry run plans and changes nothing; a real one holds the cluster's lock."""
    candidates, skipped = candidates_now(remediator.admission, nodes)
    if dry_run:
        return [*remediator.plan(candidates), *skipped]
    with cluster_lock(lock_path, "remediate"):
        return [*remediator.run(candidates), *skipped]


def exit_code(outcomes: Iterable[RemediationOutcome]) -> int:
    """0 nothing failed; 1 a node failed or went to RMA; 2 a re-validation was inconclusive."""
    results = {o.result for o in outcomes}
    if results & {"failed", "escalated"}:
        return 1
    return 2 if "held" in results else 0


# -- the real steps: Ansible, the validation pipeline, the evidence bundle ------------------------


def ansible_act(inventory: Path, run_dir: Path, record: Path) -> ActFn:
    """The action through ``playbooks/remediate.yml`` on the cluster directory ``inventory``.

    ``record``: where the running play's process group is recorded (beside the cluster lock).
    A node the play failed on, could not reach, or never reached has its error.
    """

    def act(nodes: Sequence[str], action: str) -> Mapping[str, str]:
        result = plays.run_play(
            "remediate.yml",
            inventory,
            list(nodes),
            plan=plays.plan_for(inventory),
            extravars={"remediate_action": action},
            artifact_dir=run_dir / "ansible" / action,
            timeout_s=PLAY_TIMEOUT_S,
            play_record=record,
        )
        errors = dict(result.failed)
        errors.update({h: f"unreachable: {m}" for h, m in result.unreachable.items()})
        for node in nodes:
            if node not in result.hosts and node not in errors:
                errors[node] = f"the play never reached it ({result.status}, rc {result.rc})"
        return errors

    return act


def pipeline_validate(
    wiring: pipeline.Wiring, run_dir: Path, gpu_burn_seconds: int, dcgm_level: int
) -> ValidateFn:
    """Re-validation at level burnin through the validation pipeline; reports in ``run_dir``."""

    def validate(nodes: Sequence[str], partners: Sequence[str]) -> BatchSummary:
        opts = pipeline.ValidationOptions(
            level=Level.BURNIN,
            gpu_burn_seconds=gpu_burn_seconds,
            dcgm_level=dcgm_level,
            work_dir=run_dir / "validation",
        )
        summary = pipeline.run_validation(
            wiring.view, list(nodes), opts, wiring.deps, known_good=partners
        )
        write_reports(summary, run_dir / "validation", extra={"remediation": True})
        return summary

    return validate


def bundle_inputs(
    wiring: pipeline.Wiring, history: HistoryStore, cluster_reports: Path
) -> rma.BundleInputs:
    """What an evidence bundle reads: the nodes, the history, past validation reports."""
    from gpuforge.health import rma  # noqa: PLC0415 - rma imports this module's event kinds

    return rma.BundleInputs(
        runner=wiring.deps.runner,
        history=history,
        report_dirs=(cluster_reports, Path("build") / "validate"),
    )


def rma_bundle(inputs: rma.BundleInputs, cluster_reports: Path) -> BundleFn:
    """The evidence bundle under ``<cluster reports>/rma``."""

    from gpuforge.health import rma  # noqa: PLC0415 - rma imports this module's event kinds

    def bundle(node: str, check: str, why: str) -> Path:
        inputs.errors.clear()
        return rma.build_bundle(node, cluster_reports / "rma", inputs, check=check, why=why).archive

    return bundle
