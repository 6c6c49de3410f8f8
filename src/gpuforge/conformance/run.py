"""One conformance run: lock, pick idle nodes, one sbatch array (or SSH), collect, judge, admit.

The transport is the collector (``gpuforge health serve``): each task POSTs its one record,
which the collector stores in the cluster's history database; the run reads the records of its
own job back from there (``latest`` rows of tier ``conformance`` carrying the run's job id). No
shared file system and no connection from the controller to 12,500 nodes: the controller's work
per node is one row read, one judgement and one row written (docs/conformance.md).

A run is recorded ``running`` before Slurm is touched. A run killed halfway is found by the next
one: if its job is still in Slurm the next run waits for it and finishes it (resume), else what
arrived is kept, the rest is marked ``not_checked`` and the run is closed ``partial``, never
complete. Overlapping runs refuse through the lock (:mod:`gpuforge.rollout.lock`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuforge.admission import Admission, ValidationWindow
from gpuforge.conformance import judge, plan
from gpuforge.conformance.report import (
    MIN_JUDGED,
    Changes,
    Placement,
    compare,
    file_diffs_meta,
)
from gpuforge.errors import InputError, OperationError
from gpuforge.history.conformance import ConformanceHistory, ConformanceRun, NodeResult
from gpuforge.rollout.lock import cluster_lock
from gpuforge.slurm.control import NodeAction, SlurmNode

#: Levels of ``gpuforge conformance run``.
LEVELS = ("passive", "quick", "burnin")
#: Raw records by node, as a transport hands them back.
Raw = str | bytes | Mapping[str, Any]


@dataclass(frozen=True)
class ConformanceOptions:
    """Knobs of one run."""

    level: str = "quick"
    #: Minutes within which every task must have started (sbatch ``--deadline``).
    window_minutes: int = 60
    #: Seconds between two looks at the job while it runs.
    poll_s: float = 10.0
    #: Share (0-1] of the nodes sent a task that must be judged, else the run exits 1.
    min_judged: float = MIN_JUDGED

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise InputError(f"--level: {self.level!r} is not one of {', '.join(LEVELS)}")
        if not 0 < self.min_judged <= 1:
            raise InputError(f"--min-judged: {self.min_judged!r} is not a share in (0, 1]")
        if self.window_minutes < 1:
            raise InputError("--window: must be at least 1 minute")


@dataclass
class ConformanceFleet:
    """What the run knows of the cluster: its GPU nodes, their place and type."""

    nodes: Sequence[str]
    placement: Mapping[str, Placement] = field(default_factory=dict)
    node_types: Mapping[str, str] = field(default_factory=dict)
    #: Each node's Slurm settings as generated (:func:`judge.desired_slurm`).
    slurm: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


@dataclass
class ConformanceDeps:
    """What a run talks to; tests pass fakes.

    With ``states`` (Slurm): ``submit(argv) -> job id``, ``active(job_ids) -> bool``,
    ``collect(job_ids) -> {node: raw record}`` (from the collector's store). Without Slurm:
    ``ssh(nodes, level) -> {node: raw record}``, the node checker run over SSH.
    """

    states: Callable[[], Mapping[str, SlurmNode]] | None = None
    submit: Callable[[Sequence[str]], str] | None = None
    active: Callable[[Sequence[str]], bool] | None = None
    collect: Callable[[Sequence[str]], Mapping[str, Raw]] | None = None
    ssh: Callable[[Sequence[str], str], Mapping[str, Raw]] | None = None
    #: Level burnin: the existing pipeline's pairs and NCCL on the nodes that passed.
    active_tests: Callable[[Sequence[str]], Mapping[str, NodeResult]] | None = None
    admission: Admission | None = None
    #: The maintenance window conformance-drained nodes are re-checked in (reservation name).
    window: str = "gpuforge_conformance"
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep


@dataclass
class ConformanceOutcome:
    """A finished run: its changes report and what admission did."""

    changes: Changes
    actions: list[NodeAction]
    notes: list[str]


def run(
    fleet: ConformanceFleet,
    history: ConformanceHistory,
    opts: ConformanceOptions,
    deps: ConformanceDeps,
    *,
    lock_path: Path,
) -> ConformanceOutcome:
    """One run under the lock (module docstring)."""
    with cluster_lock(lock_path, f"gpuforge conformance run --level {opts.level}") as stale:
        notes = [stale] if stale else []
        leftover = history.unfinished()
        if leftover is not None:
            notes.append(_settle(leftover, fleet, history, opts, deps))
        current = _one(fleet, history, opts, deps, notes)
        changes = compare(history, current, fleet.placement)
        decided = set(current.meta.get("recheck", [])) if current.meta else set()
        actions = _admit(changes, deps, skip=decided)
        return ConformanceOutcome(changes, actions, notes)


def _settle(
    leftover: ConformanceRun,
    fleet: ConformanceFleet,
    history: ConformanceHistory,
    opts: ConformanceOptions,
    deps: ConformanceDeps,
) -> str:
    """Finish a killed run: wait for its job if Slurm still has it, else close it partial."""
    jobs = [str(j) for j in leftover.meta.get("jobs", [])]
    waited = False
    if jobs and deps.active is not None and deps.active(jobs):
        _wait(jobs, deps, opts, deadline=deps.clock() + opts.window_minutes * 60 + 60)
        waited = True
    _collect_into(leftover, fleet, history, deps, jobs, missing="the run was killed before it")
    # A killed run is partial even when all its results arrived later: nobody watched it end.
    history.finish(leftover.id, "partial", at=deps.clock())
    how = "waited for its job and " if waited else ""
    return f"run {leftover.id} was killed halfway: {how}closed it partial"


def _one(
    fleet: ConformanceFleet,
    history: ConformanceHistory,
    opts: ConformanceOptions,
    deps: ConformanceDeps,
    notes: list[str],
) -> ConformanceRun:
    nodes = list(fleet.nodes)
    if deps.states is not None:
        states = deps.states()
        selection = plan.select(nodes, states)
        current = history.begin(
            opts.level,
            len(nodes),
            at=deps.clock(),
            meta={
                "transport": "slurm+collector",
                "idle": len(selection.idle),
                "min_judged": opts.min_judged,
            },
        )
        history.add(
            current.id,
            [NodeResult(n, "not_checked", why) for n, why in selection.skipped.items()],
        )
        results = _through_slurm(current, selection, fleet, history, opts, deps, notes, states)
    elif deps.ssh is not None:
        current = history.begin(
            opts.level,
            len(nodes),
            at=deps.clock(),
            meta={"transport": "ssh", "min_judged": opts.min_judged, "sent": len(nodes)},
        )
        raw = deps.ssh(nodes, opts.level)
        history.update_meta(current.id, file_diffs_meta(raw))
        results = _judge_all(fleet, nodes, raw, "no answer over SSH")
        history.add(current.id, results.values())
    else:
        raise OperationError("neither Slurm nor SSH is available to reach the nodes")
    if opts.level == "burnin" and deps.active_tests is not None:
        passed = [n for n, r in results.items() if r.outcome in {"pass", "warn"}]
        if passed:
            more = deps.active_tests(passed)
            history.add(current.id, [r for r in more.values() if r.outcome in {"fail", "error"}])
            notes.append(f"burnin: pairs and NCCL on {len(passed)} node(s)")
    return history.finish(current.id, "complete", at=deps.clock())


def _through_slurm(  # noqa: PLR0917 - the run's context
    current: ConformanceRun,
    selection: plan.Selection,
    fleet: ConformanceFleet,
    history: ConformanceHistory,
    opts: ConformanceOptions,
    deps: ConformanceDeps,
    notes: list[str],
    states: Mapping[str, SlurmNode],
) -> dict[str, NodeResult]:
    """The idle nodes' array, and the conformance-drained nodes' array in a maintenance window
    (resumed inside it, decided through admission, restored): at most two sbatch calls."""
    adm = deps.admission
    recheck = list(selection.recheck) if adm is not None else []
    history.add(
        current.id,
        [NodeResult(n, "not_checked", "drained by conformance") for n in selection.recheck]
        if not recheck
        else [],
    )
    batches: list[tuple[list[str], str | None]] = [(list(selection.idle), None)]
    window = (
        ValidationWindow(adm, deps.window, recheck).open() if adm is not None and recheck else None
    )
    if window is not None:
        history.update_meta(current.id, {"window": deps.window, "recheck": recheck})
        batches.append((recheck, deps.window))
    # What the run must judge a share of (Changes.short): every node it sends a task to.
    history.update_meta(current.id, {"sent": sum(len(todo) for todo, _ in batches)})
    jobs: list[str] = []
    try:
        for todo, reservation in batches:
            for count in plan.chunks(len(todo)):
                if deps.submit is None:
                    raise OperationError("no way to submit the conformance array")
                argv = plan.sbatch_argv(
                    count,
                    level=opts.level,
                    run_id=current.id,
                    window_minutes=opts.window_minutes,
                    reservation=reservation,
                )
                jobs.append(deps.submit(argv))
                history.update_meta(current.id, {"jobs": jobs, "sbatch_calls": len(jobs)})
        if jobs:
            _wait(jobs, deps, opts, deadline=deps.clock() + opts.window_minutes * 60 + 120)
        results = _collect_into(
            current,
            fleet,
            history,
            deps,
            jobs,
            missing="no result: the task was preempted, did not start before the deadline, "
            "or failed before reporting",
            only=[*selection.idle, *recheck],
            states=states,
        )
        if window is not None:
            verdicts = [v for n in recheck if (v := judge.verdict(results[n])) is not None]
            done = window.admit(verdicts)
            notes.append("re-checked in window: " + ", ".join(f"{a.node} {a.action}" for a in done))
    finally:
        if window is not None:
            window.close()
    return results


def _wait(
    jobs: Sequence[str], deps: ConformanceDeps, opts: ConformanceOptions, *, deadline: float
) -> None:
    if deps.active is None:
        return
    while deps.active(jobs):
        if deps.clock() >= deadline:
            raise OperationError(
                f"conformance job(s) {', '.join(jobs)} still in Slurm after the window; "
                "the run stays open and the next run resumes it"
            )
        deps.sleep(opts.poll_s)


def _judge_all(
    fleet: ConformanceFleet,
    nodes: Sequence[str],
    raw: Mapping[str, Raw],
    missing: str,
    states: Mapping[str, SlurmNode] | None = None,
) -> dict[str, NodeResult]:
    results = {n: judge.judge(n, raw.get(n), missing) for n in nodes}
    firmware = {
        n: judge.firmware_of(r)
        for n, r in raw.items()
        if n in results and isinstance(r, Mapping) and results[n].outcome != "error"
    }
    for node, items in judge.firmware_outliers(firmware, fleet.node_types).items():
        results[node] = judge.with_drift(results[node], items)
    if states:
        desired = {n: fleet.slurm[n] for n in results if n in fleet.slurm}
        for node, items in judge.slurm_drift(desired, states).items():
            results[node] = judge.with_drift(results[node], items)
    return results


def _collect_into(
    current: ConformanceRun,
    fleet: ConformanceFleet,
    history: ConformanceHistory,
    deps: ConformanceDeps,
    jobs: Sequence[str],
    *,
    missing: str,
    only: Sequence[str] | None = None,
    states: Mapping[str, SlurmNode] | None = None,
) -> dict[str, NodeResult]:
    nodes = (
        list(only)
        if only is not None
        else [n for n in fleet.nodes if n not in history.results(current.id)]
    )
    raw = deps.collect(jobs) if deps.collect is not None and jobs else {}
    history.update_meta(current.id, file_diffs_meta(raw))
    results = _judge_all(fleet, nodes, raw, missing, states)
    history.add(current.id, results.values())
    return results


def _admit(changes: Changes, deps: ConformanceDeps, *, skip: set[str]) -> list[NodeAction]:
    if deps.admission is None:
        return []
    verdicts = [
        v
        for _, r in sorted(changes.results.items())
        if r.node not in skip and (v := judge.verdict(r)) is not None
    ]
    return deps.admission.admit(verdicts)
