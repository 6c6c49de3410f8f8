"""``gpuforge upgrade run SPEC``: execute the plan's waves on a live cluster, resumably.

Per wave (docs/upgrades.md, "The run"), one after another, the nodes of a wave together:

1. **drain** through :class:`gpuforge.admission.Admission` with the reason
   ``gpuforge:upgrade.<id>:validate`` (admission's one format: gpuforge recognises its own drain
   and lifts it; the ``<id>`` names the upgrade, a digest of the pins). A node an operator drained
   is never touched (skipped, named in the record); a drain the circuit breaker refuses is skipped.
2. **wait** until no job runs on the drained nodes (a Slurm drain kills nothing: the node leaves
   service when its jobs end), up to the deadline; then the policy: ``wait`` (keep waiting),
   ``requeue`` (``scontrol requeue`` the jobs still running there) or ``skip`` (lift the drain,
   the node stays on its old versions until a later run).
3. **apply** the site play limited to the wave's nodes, with ``nvidia_driver_allow_reboot``: the
   driver role reboots exactly when the loaded module differs from the new driver.
4. **validate** at the configured level inside a maintenance window, then **admit**: resumed on a
   pass, drained for ``quarantine`` with the failed check on a failure, left drained when the
   validation was inconclusive.
5. **gate**: the wave passes when its phase's ``min_pass_fraction`` of its nodes are done; a wave
   that fails stops the whole upgrade.

Every step of every node is written to the rollout record (``rollout.db``: the node's lifecycle,
admitted → provisioning → provisioned → validating → admitted | quarantined, and this module's own
tables) before the next starts, under the cluster lock (one operator at a time). A killed run is
re-run with the same command: the nodes it left drained, applied or validating are finished first,
in the first wave, and the nodes it finished are up to date in the new plan.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpuforge.admission import format_reason, is_ours
from gpuforge.errors import InputError, Interrupted
from gpuforge.inventory.render import all_vars
from gpuforge.rollout.deploy import ValidationOutcome
from gpuforge.rollout.lock import cluster_lock
from gpuforge.rollout.state import NodeState, StateStore
from gpuforge.slurm.control import NodeAction, SlurmNode
from gpuforge.topology.cluster import Cluster, passes_needed
from gpuforge.upgrade.plan import UpgradePlan
from gpuforge.validate.result import NodeVerdict, Verdict

POLICIES = ("wait", "requeue", "skip")
"""What happens to a node whose jobs still run at the drain deadline."""

UPGRADE_ACTION = "validate"
"""The drain action of an upgrade: the node is re-validated, then resumed or quarantined."""

RUN_PHASE = 0
"""The rollout record's ``runs.phase`` of an upgrade run (deploy's phases start at 1)."""

IN_FLIGHT = ("draining", "applying", "validating")
"""Node steps a killed run may have left: the next run finishes these nodes first."""


def upgrade_id(pins: Mapping[str, str]) -> str:
    """The upgrade's name: ``u`` and 8 hex digits of the pins' digest.

    The same pins name the same upgrade, so re-running the command resumes it; other pins (a
    rollback) start another one.
    """
    text = json.dumps(dict(sorted(pins.items())), sort_keys=True)
    return "u" + hashlib.sha256(text.encode()).hexdigest()[:8]


def upgrade_check(upgrade: str) -> str:
    """The check name an upgrade drain carries: ``upgrade.<id>``."""
    return f"upgrade.{upgrade}"


def upgrade_reason(upgrade: str) -> str:
    """The drain reason: ``gpuforge:upgrade.<id>:validate`` (parses as gpuforge's own)."""
    return format_reason(upgrade_check(upgrade), UPGRADE_ACTION)


class UpgradeSteps(Protocol):
    """What an upgrade does to real nodes; :mod:`gpuforge.upgrade.steps` wires the real tools."""

    def node_states(self, hosts: list[str]) -> dict[str, SlurmNode]:
        """Slurm's view of ``hosts`` now."""
        ...

    def drain(self, hosts: list[str], check: str) -> list[NodeAction]:
        """Drain ``hosts`` through admission for ``check`` (action ``validate``)."""
        ...

    def release(self, hosts: list[str]) -> list[NodeAction]:
        """Lift gpuforge's drain of ``hosts`` through admission (a skipped node)."""
        ...

    def requeue(self, hosts: list[str]) -> list[str]:
        """Requeue the jobs running on ``hosts``; return their ids."""
        ...

    def apply(self, hosts: list[str]) -> dict[str, str]:
        """Run the roles on ``hosts`` (rebooting where the driver changed); failed hosts, why."""
        ...

    def validate(self, hosts: list[str], level: str, admitted: list[str]) -> ValidationOutcome:
        """Validate ``hosts`` (inside a maintenance window)."""
        ...

    def admit(self, verdicts: Sequence[NodeVerdict]) -> list[NodeAction]:
        """Resume the passed nodes, quarantine the failed ones (closing the window)."""
        ...

    def quarantine(self, reasons: Mapping[str, str]) -> list[NodeAction]:
        """Drain ``reasons``' nodes for ``quarantine`` naming the failed step (no window)."""
        ...


@dataclass(frozen=True, slots=True)
class UpgradeRequest:
    """One invocation of ``upgrade run``."""

    plan: UpgradePlan
    phase_of: Mapping[str, int]  # GPU node -> rollout phase
    gate_fraction: Mapping[int, float]  # phase -> min_pass_fraction
    level: str = "quick"
    drain_deadline_s: float = 3600.0
    policy: str = "wait"
    poll_s: float = 10.0
    operator: str = field(default_factory=getpass.getuser)


@dataclass(slots=True)
class WaveOutcome:
    number: int
    nodes: tuple[str, ...]
    done: list[str]
    quarantined: dict[str, str]
    skipped: dict[str, str]
    passed: bool
    detail: str
    seconds: float


@dataclass(slots=True)
class UpgradeOutcome:
    upgrade: str
    run_id: int
    waves: list[WaveOutcome]
    notes: list[str]
    status: str  # finished | failed | nothing

    @property
    def passed(self) -> bool:
        return self.status in ("finished", "nothing")


Event = Callable[[str], None]


class UpgradeRecord:
    """The upgrade's tables in the rollout record (same file, same transactions).

    The tables are made by the record's migration list (:mod:`gpuforge.upgrade.tables`, the
    steps this module owns), when the record is opened.
    """

    def __init__(self, store: StateStore) -> None:
        self.store = store

    def begin(self, upgrade: str, pins: Mapping[str, str]) -> None:
        now = time.time()
        with self.store.transaction() as db:
            db.execute(
                "INSERT INTO upgrades(id, pins, started_at, updated_at, status)"
                " VALUES (?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET status = 'running',"
                " updated_at = excluded.updated_at",
                (upgrade, json.dumps(dict(pins), sort_keys=True), now, now, "running"),
            )

    def finish(self, upgrade: str, status: str, detail: str) -> None:
        with self.store.transaction() as db:
            db.execute(
                "UPDATE upgrades SET status = ?, detail = ?, updated_at = ? WHERE id = ?",
                (status, detail[:2000], time.time(), upgrade),
            )

    def steps(self, upgrade: str) -> dict[str, str]:
        cur = self._read(
            "SELECT hostname, step FROM upgrade_nodes WHERE upgrade = ? ORDER BY hostname",
            (upgrade,),
        )
        return {r[0]: r[1] for r in cur}

    def _read(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with self.store.transaction() as db:
            return list(db.execute(sql, args).fetchall())

    def set_step(
        self,
        upgrade: str,
        hosts: Sequence[str],
        step: str,
        *,
        wave: int | None = None,
        detail: Mapping[str, str] | None = None,
        timing: Mapping[str, float] | None = None,
        column: str | None = None,
    ) -> None:
        """Move ``hosts`` to ``step``; ``timing`` (host -> seconds) fills ``column``."""
        if column not in (None, "drained_s", "apply_s", "validate_s"):
            raise ValueError(column)
        now = time.time()
        final = step in ("done", "quarantined", "skipped")
        with self.store.transaction() as db:
            for host in hosts:
                db.execute(
                    "INSERT INTO upgrade_nodes(upgrade, hostname, wave, step, detail, started_at)"
                    " VALUES (?,?,?,?,?,?) ON CONFLICT(upgrade, hostname) DO UPDATE SET"
                    " step = excluded.step, detail = excluded.detail,"
                    " wave = COALESCE(?, upgrade_nodes.wave)",
                    (upgrade, host, wave or 0, step, (detail or {}).get(host, ""), now, wave),
                )
                if step == "draining":
                    db.execute(
                        "UPDATE upgrade_nodes SET started_at = ?, finished_at = NULL, drained_s ="
                        " NULL, apply_s = NULL, validate_s = NULL WHERE upgrade = ? AND"
                        " hostname = ?",
                        (now, upgrade, host),
                    )
                if column and timing and host in timing:
                    db.execute(
                        f"UPDATE upgrade_nodes SET {column} = ?"  # noqa: S608 - checked above
                        " WHERE upgrade = ? AND hostname = ?",
                        (round(timing[host], 3), upgrade, host),
                    )
                if final:
                    db.execute(
                        "UPDATE upgrade_nodes SET finished_at = ? WHERE upgrade = ? AND"
                        " hostname = ?",
                        (now, upgrade, host),
                    )

    def next_wave(self, upgrade: str) -> int:
        rows = self._read("SELECT MAX(wave) FROM upgrade_waves WHERE upgrade = ?", (upgrade,))
        return int(rows[0][0] or 0) + 1

    def start_wave(self, upgrade: str, wave: int, nodes: Sequence[str]) -> None:
        with self.store.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO upgrade_waves(upgrade, wave, nodes, started_at)"
                " VALUES (?,?,?,?)",
                (upgrade, wave, json.dumps(list(nodes)), time.time()),
            )

    def end_wave(self, upgrade: str, wave: int, passed: bool, detail: str) -> None:
        with self.store.transaction() as db:
            db.execute(
                "UPDATE upgrade_waves SET finished_at = ?, passed = ?, detail = ?"
                " WHERE upgrade = ? AND wave = ?",
                (time.time(), int(passed), detail[:2000], upgrade, wave),
            )

    def summary(self) -> list[dict[str, Any]]:
        """Every upgrade of the record, newest first: status, node steps, waves, timings."""
        out: list[dict[str, Any]] = []
        ups = self._read(
            "SELECT id, pins, started_at, updated_at, status, detail FROM upgrades"
            " ORDER BY started_at DESC",
            (),
        )
        for uid, pins, started, updated, status, detail in ups:
            nodes = self._read(
                "SELECT hostname, wave, step, detail, drained_s, apply_s, validate_s, started_at,"
                " finished_at FROM upgrade_nodes WHERE upgrade = ? ORDER BY wave, hostname",
                (uid,),
            )
            waves = self._read(
                "SELECT wave, nodes, started_at, finished_at, passed, detail FROM upgrade_waves"
                " WHERE upgrade = ? ORDER BY wave",
                (uid,),
            )
            counts: dict[str, int] = {}
            for n in nodes:
                counts[n[2]] = counts.get(n[2], 0) + 1
            out.append(
                {
                    "id": uid,
                    "pins": json.loads(pins),
                    "started_at": started,
                    "updated_at": updated,
                    "status": status,
                    "detail": detail,
                    "counts": counts,
                    "nodes": [
                        {
                            "hostname": n[0],
                            "wave": n[1],
                            "step": n[2],
                            "detail": n[3],
                            "drained_s": n[4],
                            "apply_s": n[5],
                            "validate_s": n[6],
                            "seconds": None if n[8] is None else round(n[8] - n[7], 3),
                        }
                        for n in nodes
                    ],
                    "waves": [
                        {
                            "wave": w[0],
                            "nodes": json.loads(w[1]),
                            "seconds": None if w[3] is None else round(w[3] - w[2], 3),
                            "passed": None if w[4] is None else bool(w[4]),
                            "detail": w[5],
                        }
                        for w in waves
                    ],
                }
            )
        return out


def upgrade_progress(store: StateStore) -> list[dict[str, Any]]:
    """:meth:`UpgradeRecord.summary` of ``store``, or [] when no upgrade ever ran there."""
    return UpgradeRecord(store).summary() if store.db.has_table("upgrades") else []


def render_progress(upgrade: Mapping[str, Any]) -> str:
    """One line for ``gpuforge status``: the upgrade, its pins, its nodes per step, its waves."""
    pins = ", ".join(f"{k} {v}" for k, v in sorted(upgrade["pins"].items()))
    counts = ", ".join(f"{k} {v}" for k, v in sorted(upgrade["counts"].items())) or "no node yet"
    waves = upgrade["waves"]
    passed = sum(1 for w in waves if w["passed"])
    line = (
        f"upgrade {upgrade['id']} ({pins}): {upgrade['status']}; nodes: {counts}; "
        f"waves: {passed} passed of {len(waves)} started"
    )
    return line + (f": {upgrade['detail']}" if upgrade["detail"] else "")


def run_upgrade(
    store: StateStore,
    steps: UpgradeSteps,
    request: UpgradeRequest,
    *,
    lock_path: Path,
    on_event: Event | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> UpgradeOutcome:
    """Run the plan's waves under the cluster lock (see the module doc)."""
    if request.policy not in POLICIES:
        raise InputError(
            f"--on-deadline must be one of {', '.join(POLICIES)}, not {request.policy!r}"
        )
    say = on_event or (lambda _m: None)
    plan = request.plan
    uid = upgrade_id(plan.pins)
    with cluster_lock(lock_path, f"upgrade run {uid}") as stale:
        notes = [stale] if stale else []
        record = UpgradeRecord(store)
        record.begin(uid, plan.pins)
        store.register_nodes((h, p) for h, p in request.phase_of.items())
        run_id = store.start_run(RUN_PHASE, f"upgrade {uid} {request.level}", request.operator)
        try:
            outcome = _run(store, record, steps, request, uid, run_id, say, sleep, clock)
        except (KeyboardInterrupt, Interrupted) as exc:
            why = str(exc) or "interrupted by SIGINT (Ctrl-C)"
            store.finish_run(run_id, "interrupted", why)
            record.finish(uid, "interrupted", why)
            raise
        except BaseException as exc:
            why = f"{type(exc).__name__}: {exc}"[:1000]
            store.finish_run(run_id, "aborted", why)
            record.finish(uid, "aborted", why)
            raise
        outcome.notes[:0] = notes
        detail = "; ".join(w.detail for w in outcome.waves[-1:]) or "nothing to do"
        store.finish_run(run_id, "passed" if outcome.passed else "failed", detail)
        record.finish(uid, outcome.status, detail)
        return outcome


def _waves(plan: UpgradePlan, in_flight: Sequence[str]) -> list[tuple[str, ...]]:
    """The plan's waves; nodes a killed run left in flight first, as a wave of their own.

    They are out of service already (one wave of the killed run, so within the limits); joining
    them to the plan's first wave could take more nodes out at once than the limits allow.
    """
    waves = [tuple(w.nodes) for w in plan.waves]
    if waves and set(in_flight) <= set(waves[0]):
        return waves
    first = tuple(in_flight)
    return [first, *[tuple(n for n in w if n not in first) for w in waves]]


def _run(  # noqa: PLR0917 - the engine's collaborators
    store: StateStore,
    record: UpgradeRecord,
    steps: UpgradeSteps,
    request: UpgradeRequest,
    uid: str,
    run_id: int,
    say: Event,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> UpgradeOutcome:
    known = record.steps(uid)
    in_flight = [h for h, s in known.items() if s in IN_FLIGHT]
    waves = [w for w in _waves(request.plan, in_flight) if w]
    notes: list[str] = []
    if in_flight:
        notes.append(f"finishing {len(in_flight)} node(s) a killed run left in flight first")
    outcomes: list[WaveOutcome] = []
    for nodes in waves:
        number = record.next_wave(uid)
        say(f"wave {number}: {len(nodes)} node(s): {', '.join(nodes)}")
        outcome = _wave(
            store, record, steps, request, uid, run_id, number, nodes, say, sleep, clock
        )
        outcomes.append(outcome)
        say(f"wave {number}: {'passed' if outcome.passed else 'FAILED'}: {outcome.detail}")
        if not outcome.passed:
            return UpgradeOutcome(uid, run_id, outcomes, notes, "failed")
    return UpgradeOutcome(uid, run_id, outcomes, notes, "finished" if outcomes else "nothing")


def _wave(  # noqa: PLR0912, PLR0917, PLR0915 - one wave, step by step
    store: StateStore,
    record: UpgradeRecord,
    steps: UpgradeSteps,
    request: UpgradeRequest,
    uid: str,
    run_id: int,
    number: int,
    nodes: tuple[str, ...],
    say: Event,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> WaveOutcome:
    start = clock()
    record.start_wave(uid, number, nodes)
    skipped: dict[str, str] = {}
    quarantined: dict[str, str] = {}

    # 1 drain (never an operator's node; never a down one)
    states = steps.node_states(list(nodes))
    # gpuforge's own drains this upgrade may replace: its own, and those of the nodes it left in
    # flight or quarantined (a re-run recovers them). Any other gpuforge drain (a health check's
    # reboot, an RMA, a new node not admitted yet) is for its own process to lift.
    mine = {h for h, st in record.steps(uid).items() if st in (*IN_FLIGHT, "quarantined")}
    own = upgrade_reason(uid)
    for host in nodes:
        state = states.get(host)
        if state is None:
            skipped[host] = "not known to Slurm"
        elif state.drained and not is_ours(state.reason):
            skipped[host] = f"drained by someone else ({state.reason or 'no reason'}): not touched"
        elif state.drained and state.reason != own and host not in mine:
            skipped[host] = f"drained by gpuforge for {state.reason}: not touched, repair it first"
        elif state.state in ("DOWN", "FAIL") or "NOT_RESPONDING" in state.flags:
            skipped[host] = f"{state.state_text} in Slurm: not upgraded"
    todo = [h for h in nodes if h not in skipped]
    record.set_step(uid, todo, "draining", wave=number)
    drain_start = clock()
    for action in steps.drain(todo, upgrade_check(uid)) if todo else []:
        if action.action != "drain":
            skipped[action.node] = f"not drained ({action.action}): {action.detail}"
    todo = [h for h in todo if h not in skipped]

    # 2 wait for the running jobs, up to the deadline, then the policy
    drained_s: dict[str, float] = {}
    waiting = list(todo)
    requeued = False
    while waiting:
        now_states = steps.node_states(waiting)
        for host in list(waiting):
            state = now_states.get(host)
            if state is not None and not state.busy:
                drained_s[host] = clock() - drain_start
                waiting.remove(host)
            elif state is not None and state.drained and not is_ours(state.reason):
                skipped[host] = f"drained by someone else meanwhile ({state.reason})"
                waiting.remove(host)
        if not waiting:
            break
        if clock() - drain_start >= request.drain_deadline_s:
            if request.policy == "skip":
                steps.release(waiting)
                for host in waiting:
                    skipped[host] = (
                        f"jobs still running after {request.drain_deadline_s:.0f}s: drain lifted,"
                        " left on its versions (policy skip)"
                    )
                break
            if request.policy == "requeue" and not requeued:
                jobs = steps.requeue(waiting)
                requeued = True
                say(f"wave {number}: requeued job(s) {', '.join(jobs) or '(none)'} on {waiting}")
        sleep(request.poll_s)
    todo = [h for h in todo if h not in skipped]
    record.set_step(uid, list(skipped), "skipped", wave=number, detail=skipped)
    say(f"wave {number}: drained {len(todo)}, skipped {len(skipped)}")

    # 3 apply (the driver role reboots when the driver changed)
    if todo:
        store.transition(todo, NodeState.PROVISIONING, f"upgrade {uid}: applying", run_id)
        record.set_step(uid, todo, "applying", column="drained_s", timing=drained_s)
        t0 = clock()
        failed = steps.apply(list(todo))
        apply_s = dict.fromkeys(todo, clock() - t0)
        if failed:
            why = {h: f"upgrade {uid}: apply failed: {m}"[:500] for h, m in failed.items()}
            steps.quarantine(dict.fromkeys(failed, "upgrade.apply"))
            store.transition(failed, NodeState.QUARANTINED, "", run_id, reasons=why)
            record.set_step(
                uid, list(failed), "quarantined", detail=why, column="apply_s", timing=apply_s
            )
            quarantined.update(why)
        todo = [h for h in todo if h not in failed]
        store.transition(todo, NodeState.PROVISIONED, f"upgrade {uid}: applied", run_id)
        record.set_step(uid, todo, "validating", column="apply_s", timing=apply_s)

    # 4 validate, admit
    done: list[str] = []
    if todo:
        store.transition(todo, NodeState.VALIDATING, f"upgrade {uid}: {request.level}", run_id)
        admitted = sorted(
            n.hostname
            for n in store.nodes()
            if n.state is NodeState.ADMITTED and n.hostname not in nodes
        )
        t0 = clock()
        validation = steps.validate(list(todo), request.level, admitted)
        store.record_results(run_id, validation.results)
        verdicts = dict(validation.verdicts)
        for host in todo:
            verdicts.setdefault(host, NodeVerdict(host, Verdict.HOLD, ("no validation result",)))
        steps.admit([verdicts[h] for h in todo])
        validate_s = dict.fromkeys(todo, clock() - t0)
        done = [h for h in todo if verdicts[h].verdict is Verdict.ADMIT]
        bad = {
            h: f"upgrade {uid}: validation {verdicts[h].verdict.value}: "
            + (", ".join(verdicts[h].reasons) or "failed")
            for h in todo
            if h not in done
        }
        store.transition(done, NodeState.ADMITTED, f"upgrade {uid}: validated", run_id)
        store.transition(bad, NodeState.QUARANTINED, "", run_id, reasons=bad)
        record.set_step(uid, done, "done", column="validate_s", timing=validate_s)
        record.set_step(
            uid, list(bad), "quarantined", detail=bad, column="validate_s", timing=validate_s
        )
        quarantined.update(bad)

    # 5 the gate: skipped nodes do not count against it (they keep serving on the old versions)
    judged = [h for h in nodes if h not in skipped]
    phases = {request.phase_of.get(h, 1) for h in nodes}
    fraction = max((request.gate_fraction.get(p, 1.0) for p in phases), default=1.0)
    needed = passes_needed(fraction, len(judged))
    passed = len(done) >= needed
    detail = f"wave {number}: {len(done)}/{len(judged)} upgraded and validated, {needed} needed"
    if quarantined:
        detail += "; quarantined: " + ", ".join(
            f"{h} ({m})" for h, m in sorted(quarantined.items())
        )
    if skipped:
        detail += "; skipped: " + ", ".join(f"{h} ({m})" for h, m in sorted(skipped.items()))
    record.end_wave(uid, number, passed, detail)
    return WaveOutcome(number, nodes, done, quarantined, skipped, passed, detail, clock() - start)


#: The roles' version variables, as ``gpuforge inventory generate`` writes them from the spec.
VERSION_VARS = (
    "nvidia_driver_version",
    "cuda_toolkit_version",
    "nccl_version",
    "dcgm_version",
    "slurm_version",
    "doca_ofed_version",
)


def require_generated_pins(cluster: Cluster, inventory: Path, spec: Path) -> None:
    """Refuse (exit 2) when the inventory's generated layer pins other versions than SPEC.

    The roles install what the inventory says, and the validators expect it: a run against an
    inventory generated from the old spec would "upgrade" every node to the versions it has.
    """
    import yaml  # noqa: PLC0415 - only the run reads the generated layer

    path = inventory / "generated" / "group_vars" / "all.yml"
    try:
        have = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"{path}: cannot read the generated inventory: {exc}") from None
    want = all_vars(cluster)
    diff = [
        f"{key} {have.get(key)} (spec: {want.get(key)})"
        for key in VERSION_VARS
        if str(have.get(key)) != str(want.get(key))
    ]
    if diff:
        raise InputError(
            f"{path}: generated from other pins than {spec}: {', '.join(diff)}; run "
            f"`gpuforge inventory generate {spec} --output {inventory}` first"
        )
