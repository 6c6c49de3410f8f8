"""One run of a tier: checks -> hysteresis -> record -> outputs, and the exit status slurmd sees.

Hysteresis lives here (docs/health.md, "Hysteresis, shadow, kill switch"). Per check, the state
keeps consecutive FAILs and consecutive non-FAILs (PASS or WARN). A non-shadow check that FAILs
``fail_after`` runs in a row with an action that drains *latches*: the node asks for a drain on
every run while it is latched; it unlatches after ``pass_after`` non-FAIL runs in a row, and
when every latch is gone the node asks for a resume until the collector has answered once. ERROR
and SKIP leave the streaks as they are (an ERROR never drains and never resumes). A shadowed
check never latches; a disabled check (kill switch) does not run and drops its latch.

The passive and epilog tiers update the streaks; the prolog only reads them.

Exit status (slurmd's view, docs/health.md "Exit status"): ``passive`` and ``epilog`` exit 0
(slurmd ignores HealthCheckProgram's status, and a non-zero Epilog would drain the node behind
the collector's back: the drain goes through the collector, which holds the circuit breaker);
``prolog`` exits 1 only on a FAIL that must keep a job off the node (see :func:`prolog_blocks`),
because a non-zero Prolog makes slurmd drain the node and requeue the job.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from gpuforge.node import output
from gpuforge.node import state as st
from gpuforge.node.commands import Budget, Runner
from gpuforge.node.config import CHECKS, HealthConfig
from gpuforge.node.probes import TIERS, Probe, UnavailableError, skip
from gpuforge.node.record import Record, Request, from_dict, verdict_of
from gpuforge.validate import catalogue
from gpuforge.validate.result import CheckResult
from gpuforge.validate.xid_catalogue import Action

DISABLED = "disabled by config"
#: Oldest passive record the prolog acts on (12 runs at slurmd's usual 300 s interval).
CACHE_MAX_AGE_S = 3600.0


def drains(action: str) -> bool:
    """True for an action that takes the node out of service (``quarantine`` included; none,
    ``""``, does not)."""
    if action == "quarantine":
        return True
    try:
        return Action(action).drains
    except ValueError:
        return False


def hysteresis(
    results: Sequence[CheckResult], config: HealthConfig, state: st.State, *, update: bool
) -> tuple[list[CheckResult], Request | None]:
    """Apply the streaks to this run's results; the record's checks and the node's request."""
    out: list[CheckResult] = []
    for r in results:
        c = config.check(r.check)
        s = state.streak(r.check)
        if update:
            if r.status == "fail":
                s.fails, s.passes = s.fails + 1, 0
            elif r.status in ("pass", "warn"):
                s.fails, s.passes = 0, s.passes + 1
            if r.status != "skip":
                s.last = r.status
            if not c.enabled or c.shadow:
                s.latched, s.action = False, None
            elif r.status == "fail" and s.fails >= c.fail_after and drains(r.action):
                s.latched, s.action = True, r.action
            elif s.latched and r.status in ("pass", "warn") and s.passes >= c.pass_after:
                s.latched, s.action = False, None
        streak = s.fails if r.status == "fail" else s.passes if r.status in ("pass", "warn") else 0
        out.append(replace(r, shadow=c.shadow, streak=streak))
    if update:
        for name in list(state.streaks):
            if name not in CHECKS or not config.check(name).enabled:
                state.streaks[name].latched = False
    request = request_of(state)
    if request == Request("resume") and any(c.status == "fail" and not c.shadow for c in out):
        # Another check fails in this very run (not latched yet: below its fail_after): the
        # node is not healthy enough to return; the resume stays owed for a clean run.
        return out, None
    return out, request


def request_of(state: st.State) -> Request | None:
    """Drain for the latched checks (strongest action first), else resume while one is owed."""
    latched = sorted(
        ((n, s) for n, s in state.streaks.items() if s.latched),
        key=lambda item: (-catalogue.action_rank(item[1].action), item[0]),
    )
    if latched:
        state.resume_pending = True
        name, first = latched[0]
        return Request("drain", name, first.action or "quarantine", len(latched) - 1)
    if state.resume_pending:
        return Request("resume")
    return None


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """A finished run: its record, the exit status, and what delivery did."""

    record: Record
    exit_code: int
    delivery: output.Delivery | None
    note: str = ""


def run_tier(
    config: HealthConfig,
    tier: str,
    *,
    env: Mapping[str, str] | None = None,
    proc_root: Path = Path("/proc"),
    job_id: str | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    runner: Runner | None = None,
) -> RunOutcome:
    """Run ``tier``'s checks on this node and write and send the record."""
    budget = Budget(config.timeout(tier))
    runner = runner or Runner(budget, env=env)
    state_path = config.state_dir / "state.json"
    state = st.load(state_path)
    started = now()
    probe = Probe(config, runner, state, started, tier, proc_root=proc_root)
    if tier == "passive":
        probe.prefetch([name for name in TIERS[tier] if config.check(name).enabled])
    results = []
    for name, check in TIERS[tier].items():
        if not config.check(name).enabled:
            results.append(skip(name, DISABLED))
            continue
        results.append(check(probe))
    update = tier != "prolog"
    if tier == "passive":
        # gpu.xid moves the boot with its cursor; kept here too for when it is disabled.
        state.boot_id = _boot_or_none(probe) or state.boot_id
    checks, request = hysteresis(results, config, state, update=update)
    if tier == "prolog":
        request = _prolog_request(checks, config, state)
    record = Record(
        node=config.node,
        tier=tier,
        started=started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        duration_s=round(budget.elapsed(), 3),
        verdict=verdict_of(checks),
        checks=tuple(checks),
        job_id=job_id,
        config_digest=config.digest or None,
        counters=dict(probe.counters),
        events=tuple(probe.events),
        request=request,
    )
    exit_code = 0
    if tier == "prolog":
        exit_code = prolog_blocks(record, config, current_boot=_boot_or_none(probe), now=started)
    delivery = _write(config, record, state, budget, update=update, blocked=exit_code == 1)
    xid = record.check("gpu.xid")
    if exit_code == 1 and xid is not None and _blocks_now(xid, config):
        exit_code = prolog_consent(xid, delivery)
    return RunOutcome(record, exit_code, delivery, state.note)


#: The collector's answers that refuse a drain: its circuit breaker, a hold, shadow mode.
REFUSED = ("refused", "held", "shadow")


def prolog_consent(xid: CheckResult, delivery: output.Delivery | None) -> int:
    """The prolog's exit for a new Xid that drains, once it has asked the collector (1 blocks).

    The prolog sent its record (with the drain request) before this: the collector's answer
    decides. ``drained``: the collector drained the node with a gpuforge reason, counted by its
    breaker; 1 keeps this job off (slurmd's own ``Prolog error`` drain lands on a drained node).
    ``refused``, ``held``, ``shadow``: the breaker (or an operator) said no; 0, the prolog must
    not undo it. No answer (no collector, unreachable, out of the prolog's budget) or one that
    decided nothing: 1 only for a fatal class, an Xid whose action is ``reboot`` or stronger (the
    GPU is lost until a reboot, the job would crash); a ``reset_gpu`` Xid lets the job run and
    waits for the passive tier and the collector.
    """
    # The spool is sent oldest first and the prolog's record is the newest: only a round that
    # sent everything ends with the answer to this record.
    answer = delivery.answer if delivery is not None and not delivery.error else None
    decision = answer.get("decision") if isinstance(answer, Mapping) else None
    done = decision.get("done") if isinstance(decision, Mapping) else None
    if done == "drained":
        return 1
    if done in REFUSED:
        return 0
    return 1 if catalogue.action_rank(xid.action) >= Action.REBOOT.rank else 0


def _prolog_request(
    checks: Sequence[CheckResult], config: HealthConfig, state: st.State
) -> Request | None:
    """The cached request (the passive tier's), or a drain for a new Xid that drains now."""
    xid = next((c for c in checks if c.check == "gpu.xid"), None)
    if xid is not None and _blocks_now(xid, config):
        return Request("drain", "gpu.xid", xid.action, 0)
    latched = [(n, s) for n, s in state.streaks.items() if s.latched]
    return request_of(state) if latched else None


def _blocks_now(check: CheckResult, config: HealthConfig) -> bool:
    c = config.check(check.check)
    return (
        check.status == "fail"
        and c.enabled
        and not c.shadow
        and c.fail_after <= 1
        and drains(check.action)
    )


def _boot_or_none(probe: Probe) -> str | None:
    try:
        return probe.boot()[0]
    except UnavailableError:
        return None


def prolog_blocks(
    record: Record,
    config: HealthConfig,
    *,
    current_boot: str | None = None,
    now: datetime | None = None,
    state: st.State | None = None,
) -> int:
    """1 when the job must not start here, else 0 (a non-zero Prolog drains the node).

    Blocks on (a) a drain-worthy Xid newer than the passive run (a GPU that broke between
    checks: the job would crash), non-shadow, enabled, ``fail_after`` 1; or (b) a drain the
    collector has accepted (``decision.json`` says ``drained``) that Slurm has not applied to this
    allocation yet, judged from a passive record of this boot at most :data:`CACHE_MAX_AGE_S`
    old (a node remediated since, or rebooted, is judged afresh by its next passive run). A
    cached FAIL the collector refused (circuit breaker), held or shadowed never blocks: the
    prolog must not undo the breaker.
    """
    xid = record.check("gpu.xid")
    if xid is not None and _blocks_now(xid, config):
        return 1
    known = state if state is not None else st.load(config.state_dir / "state.json")
    if current_boot is None or known.boot_id != current_boot:
        return 0
    answer = output.read_json(output.decision_path(config)) or {}
    decision = answer.get("decision")
    if not isinstance(decision, dict) or decision.get("done") != "drained":
        return 0
    last = _cached_passive(config, now or datetime.now(UTC))
    req = last.request if last is not None else None
    if last is None or req is None or req.op != "drain" or req.check is None:
        return 0
    failed = last.check(req.check)
    c = config.check(req.check)
    still = failed is not None and failed.status == "fail" and c.enabled and not c.shadow
    return 1 if still else 0


def _cached_passive(config: HealthConfig, now: datetime) -> Record | None:
    """last-passive.json when readable and at most :data:`CACHE_MAX_AGE_S` old."""
    path = output.last_path(config, "passive")
    cached = output.read_json(path)
    if cached is None:
        return None
    try:
        last = from_dict(cached, str(path))
    except ValueError:
        return None
    if (now - _started(last.started)).total_seconds() > CACHE_MAX_AGE_S:
        return None
    return last


def _started(text: str) -> datetime:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return datetime.fromtimestamp(0, UTC)


def _write(
    config: HealthConfig,
    record: Record,
    state: st.State,
    budget: Budget,
    *,
    update: bool,
    blocked: bool = False,
) -> output.Delivery | None:
    output.write_last(config, record)
    delivery = None
    deadline = time.monotonic() + max(budget.total_s - budget.elapsed() - 0.2, 0.0)
    if record.tier == "prolog":
        # A job is waiting: send only when it blocks the job (the collector then drains with a
        # gpuforge reason), and only within what is left.
        if blocked and record.request is not None and record.request.op == "drain":
            output.spool(config, record, state)
            delivery = output.deliver(config, deadline=deadline, limit=None)
    else:
        output.spool(config, record, state)
        delivery = output.deliver(config, deadline=deadline)
        if delivery.sent and not delivery.error and record.request == Request("resume"):
            state.resume_pending = False
        if delivery.clock is not None:  # judged by node.clock on the next run
            state.clock = delivery.clock
    if update:
        st.save(config.state_dir / "state.json", state)
    output.write_metrics(record, config, state, spooled=len(output.spooled(config)))
    return delivery


def job_id_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """``SLURM_JOB_ID`` as slurmd sets it for Prolog and Epilog."""
    value = (environ if environ is not None else os.environ).get("SLURM_JOB_ID", "").strip()
    return value or None
