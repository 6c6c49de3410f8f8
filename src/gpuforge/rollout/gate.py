"""Gates between phases: phase N starts only after phase N-1 passed its gate, or with --force."""

from __future__ import annotations

import time

from gpuforge.errors import GpuforgeError
from gpuforge.rollout.state import GateRecord, NodeState, StateStore
from gpuforge.topology.cluster import passes_needed


class GateClosed(GpuforgeError):  # noqa: N818 - reads as the outcome it reports
    """The previous phase has not passed its gate; exit 1 with what failed."""

    exit_code = 1


def evaluate_gate(
    store: StateStore, run_id: int, phase: int, hosts: list[str], required: float
) -> GateRecord:
    """Decide whether ``phase`` passed: at least ``required`` of its nodes admitted."""
    by_host = {n.hostname: n for n in store.nodes(phase)}
    admitted = [h for h in hosts if by_host[h].state is NodeState.ADMITTED]
    needed = passes_needed(required, len(hosts))
    passed = len(hosts) > 0 and len(admitted) >= needed
    failing = sorted(
        f"{h} ({by_host[h].state.value}: {by_host[h].reason})"
        for h in hosts
        if by_host[h].state is not NodeState.ADMITTED
    )
    detail = f"{len(admitted)}/{len(hosts)} admitted, {needed} needed ({required:.0%})"
    if failing:
        detail += "; not admitted: " + ", ".join(failing)
    gate = GateRecord(
        run_id, phase, passed, len(admitted), len(hosts), required, detail, time.time()
    )
    store.record_gate(gate)
    return gate


def require_previous_gate(
    store: StateStore, phase: int, force_reason: str | None, operator: str
) -> str | None:
    """Raise :class:`GateClosed` unless phase-1 passed its gate. Returns a note when forced."""
    if phase <= 1:
        return None
    gate = store.last_gate(phase - 1)
    if gate is not None and gate.passed:
        return None
    why = (
        f"phase {phase - 1} has not run yet"
        if gate is None
        else f"phase {phase - 1} failed its gate: {gate.detail}"
    )
    if force_reason is None:
        raise GateClosed(
            f"phase {phase} cannot start: {why}. Repair and re-run phase {phase - 1}, "
            f'or pass --force "REASON" to override (the reason is recorded)'
        )
    store.record_override(None, phase, "force-gate", f"{why}; operator: {force_reason}", operator)
    return f"gate of phase {phase - 1} overridden: {why} (reason recorded: {force_reason})"
