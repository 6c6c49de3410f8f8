"""``gpuforge deploy --phase N``: the six steps for one batch, resumable.

preflight → provision → validate → decide → admit → record. Each step works on the batch that the
previous one left; every state change is written to the rollout record before the next step starts,
so a killed run picks up where it stopped:

* admitted nodes are left alone unless ``redo`` (or named in ``only``);
* nodes caught in ``provisioning`` are provisioned again (the play is idempotent);
* nodes caught in ``provisioned``/``validating`` go straight to validation.
"""

from __future__ import annotations

import getpass
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpuforge.errors import InputError, Interrupted, OperationError
from gpuforge.rollout.gate import evaluate_gate, require_previous_gate
from gpuforge.rollout.lock import cluster_lock
from gpuforge.rollout.state import GateRecord, NodeState, ResultRow, StateStore
from gpuforge.slurm.control import NodeAction
from gpuforge.validate.result import NodeVerdict, Verdict

LEVELS = ("quick", "burnin", "full")


@dataclass(frozen=True, slots=True)
class ValidationOutcome:
    """What the validate step returns: a verdict per node, the rows to record, the reports."""

    verdicts: dict[str, NodeVerdict]
    results: tuple[ResultRow, ...] = ()
    report_paths: tuple[Path, ...] = ()


class Steps(Protocol):
    """What a deploy does to real nodes; :mod:`gpuforge.rollout.steps` wires the real tools."""

    def preflight(self, hosts: list[str]) -> dict[str, str]:
        """Return the hosts that cannot be worked on, each with the reason."""
        ...

    def provision(self, hosts: list[str]) -> dict[str, str]:
        """Run the site play on ``hosts``; return the hosts that failed, with their first error."""
        ...

    def validate(self, hosts: list[str], level: str, admitted: list[str]) -> ValidationOutcome:
        """Validate ``hosts``; ``admitted`` nodes may serve as known-good test partners."""
        ...

    def admit(self, verdicts: list[NodeVerdict]) -> list[NodeAction]:
        """Apply ``verdicts`` in Slurm through :mod:`gpuforge.admission`."""
        ...


@dataclass(frozen=True, slots=True)
class DeployRequest:
    phase: int
    hosts: tuple[str, ...]  # the phase's nodes, from the topology spec
    gate_fraction: float  # of the phase's nodes that must be admitted
    # Controllers and login nodes: provisioned with every batch (the play is idempotent) because
    # the batch needs them; not validated as GPU nodes; if one fails, the run stops.
    infra: tuple[str, ...] = ()
    level: str = "full"
    only: tuple[str, ...] = ()
    redo: bool = False
    force_reason: str | None = None
    operator: str = field(default_factory=getpass.getuser)


@dataclass(slots=True)
class DeployOutcome:
    run_id: int
    gate: GateRecord
    stage_seconds: dict[str, float]
    notes: list[str]
    report_paths: list[Path]

    @property
    def passed(self) -> bool:
        return self.gate.passed


StageCallback = Callable[[str, list[str]], None]


def deploy_phase(
    store: StateStore,
    steps: Steps,
    request: DeployRequest,
    *,
    lock_path: Path,
    on_stage: StageCallback | None = None,
) -> DeployOutcome:
    """Run one phase. Raises :class:`GateClosed` when the previous phase has not passed."""
    if request.level not in LEVELS:
        raise InputError(f"--level must be one of {', '.join(LEVELS)}, not {request.level!r}")
    unknown = sorted(set(request.only) - set(request.hosts))
    if unknown:
        raise InputError(f"--only names nodes outside phase {request.phase}: {', '.join(unknown)}")
    with cluster_lock(lock_path, f"deploy --phase {request.phase}") as stale:
        notes = [stale] if stale else []
        forced = require_previous_gate(store, request.phase, request.force_reason, request.operator)
        if forced:
            notes.append(forced)
        store.register_nodes((h, request.phase) for h in request.hosts)
        run_id = store.start_run(request.phase, request.level, request.operator)
        try:
            outcome = _run(store, steps, request, run_id, on_stage or (lambda _s, _h: None))
        except (KeyboardInterrupt, Interrupted) as exc:
            store.finish_run(run_id, "interrupted", str(exc) or "interrupted by SIGINT (Ctrl-C)")
            raise
        except BaseException as exc:
            store.finish_run(run_id, "aborted", f"{type(exc).__name__}: {exc}"[:1000])
            raise
        outcome.notes[:0] = notes
        status = "passed" if outcome.passed else "failed"
        store.finish_run(run_id, status, outcome.gate.detail)
        return outcome


def _run(
    store: StateStore,
    steps: Steps,
    request: DeployRequest,
    run_id: int,
    on_stage: StageCallback,
) -> DeployOutcome:
    timings: dict[str, float] = {}
    records = {n.hostname: n for n in store.nodes(request.phase)}
    targets = set(request.only or request.hosts)
    batch = sorted(
        h
        for h in targets
        if request.redo or request.only or records[h].state is not NodeState.ADMITTED
    )
    notes: list[str] = []
    admitted_peers = sorted(
        n.hostname
        for n in store.nodes()
        if n.state is NodeState.ADMITTED and n.hostname not in batch
    )

    def stage(name: str, hosts: list[str]) -> float:
        on_stage(name, hosts)
        return time.monotonic()

    # 1 preflight
    t0 = stage("preflight", batch)
    unreachable = steps.preflight([*request.infra, *batch]) if batch else {}
    infra_down = {h: unreachable.pop(h) for h in request.infra if h in unreachable}
    # Recorded before the run stops for a broken controller: the record says what preflight saw.
    store.transition(unreachable, NodeState.UNREACHABLE, "preflight", run_id, reasons=unreachable)
    _stop_on_infra(request.infra, infra_down, "preflight")
    batch = [h for h in batch if h not in unreachable]
    timings["preflight"] = time.monotonic() - t0

    # 2 provision: everything not already provisioned (or everything with --redo)
    records = {n.hostname: n for n in store.nodes(request.phase)}
    already = {NodeState.PROVISIONED, NodeState.VALIDATING}
    to_provision = [h for h in batch if request.redo or records[h].state not in already]
    t0 = stage("provision", to_provision)
    if to_provision:
        store.transition(to_provision, NodeState.PROVISIONING, "provisioning", run_id)
        failed = steps.provision([*request.infra, *to_provision])
        _stop_on_infra(request.infra, failed, "provisioning")
        store.transition(failed, NodeState.QUARANTINED, "provision failed", run_id, reasons=failed)
        store.transition(
            [h for h in to_provision if h not in failed],
            NodeState.PROVISIONED,
            "provisioned",
            run_id,
        )
        batch = [h for h in batch if h not in failed]
    timings["provision"] = time.monotonic() - t0

    # 3 validate, 4 decide, 5 admit
    t0 = stage("validate", batch)
    verdicts, report_paths = _validate(
        store, steps, request, run_id, batch=batch, peers=admitted_peers
    )
    timings["validate"] = time.monotonic() - t0
    t0 = stage("admit", batch)
    notes.extend(_admit(store, steps, run_id, verdicts))
    timings["admit"] = time.monotonic() - t0

    # 6 record the gate
    t0 = stage("record", list(request.hosts))
    gate = evaluate_gate(store, run_id, request.phase, list(request.hosts), request.gate_fraction)
    timings["record"] = time.monotonic() - t0
    return DeployOutcome(run_id, gate, timings, notes, report_paths)


def _validate(
    store: StateStore,
    steps: Steps,
    request: DeployRequest,
    run_id: int,
    *,
    batch: list[str],
    peers: list[str],
) -> tuple[dict[str, NodeVerdict], list[Path]]:
    if not batch:
        return {}, []
    store.transition(batch, NodeState.VALIDATING, f"validating ({request.level})", run_id)
    validation = steps.validate(batch, request.level, peers)
    store.record_results(run_id, validation.results)
    verdicts = dict(validation.verdicts)
    for host in sorted(set(batch) - set(verdicts)):  # silence from the validators is no pass
        verdicts[host] = NodeVerdict(host, Verdict.HOLD, ("no validation result",))
    return verdicts, list(validation.report_paths)


def _admit(
    store: StateStore, steps: Steps, run_id: int, verdicts: dict[str, NodeVerdict]
) -> list[str]:
    """Slurm first, then the record: a kill in between re-validates and re-admits."""
    if not verdicts:
        return []
    actions = {a.node: a for a in steps.admit([verdicts[h] for h in sorted(verdicts)])}
    admit = sorted(h for h, v in verdicts.items() if v.verdict is Verdict.ADMIT)
    quarantine = {
        h: "; ".join(v.reasons) or "failed"
        for h, v in verdicts.items()
        if v.verdict is not Verdict.ADMIT
    }
    store.transition(admit, NodeState.ADMITTED, "validation passed", run_id)
    store.transition(quarantine, NodeState.QUARANTINED, "", run_id, reasons=quarantine)
    # Admission never lifts someone else's drain: say so for a node that passed but stays out.
    notes = [
        f"{h} passed validation but stays drained: {actions[h].detail}"
        for h in admit
        if h in actions and "DRAIN" in actions[h].after
    ]
    inconclusive = sorted(h for h, v in verdicts.items() if v.verdict is Verdict.HOLD)
    if inconclusive:
        notes.append(
            "validation was inconclusive on "
            + ", ".join(inconclusive)
            + ": not admitted, and left in Slurm as they were (a new node stays drained)"
        )
    return notes


def _stop_on_infra(infra: tuple[str, ...], problems: dict[str, str], step: str) -> None:
    broken = {h: problems.pop(h) for h in infra if h in problems}
    if broken:
        detail = "; ".join(f"{h}: {why}" for h, why in sorted(broken.items()))
        raise OperationError(f"{step} failed on infrastructure node(s) the batch needs: {detail}")
