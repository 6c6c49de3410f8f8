"""Which nodes a run checks, and the one ``sbatch`` call that reaches them.

A node is checked only when Slurm shows it idle and in service: a node running a job is busy
(its job is never disturbed, the node is reported ``not_checked``), a drained or down node is
out of service. The whole run is one job array in the hidden ``conformance`` partition (lowest
priority tier; a job of any other partition preempts a task at once), one task per idle node,
each with its own time limit, all of it bounded by a deadline after which Slurm drops the tasks
still pending: one ``sbatch`` call whatever the number of nodes. Nodes a conformance run drained
get a second array inside a maintenance reservation (resumed there, decided, restored), so a
fixed node comes back: at most two calls per run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuforge.admission import parse_reason
from gpuforge.slurm.control import SlurmNode

#: The hidden partition the slurm role defines (``slurm_conformance_partition``).
PARTITION = "conformance"
#: The node checker the health role installs.
NODE_PYZ = "/opt/gpuforge/gpuforge-node.pyz"
#: Minutes one task may run, per level (burnin runs DCGM level 2: up to 15 minutes).
TASK_MINUTES = {"passive": 3, "quick": 5, "burnin": 25}
#: Base states in which a node runs nothing and can take a task.
IDLE_STATES = frozenset({"IDLE"})
#: Slurm's ``MaxArraySize`` as the slurm role sets it (array indices stay below it).
MAX_ARRAY_SIZE = 50_001


@dataclass(frozen=True)
class Selection:
    """Nodes to check now, nodes a conformance run drained (re-checked in a maintenance
    window, the only way a drained node runs a job), and every other node with why not."""

    idle: tuple[str, ...]
    skipped: Mapping[str, str] = field(default_factory=dict)
    recheck: tuple[str, ...] = ()


def drained_by_conformance(state: SlurmNode) -> bool:
    """True when a gpuforge conformance verdict drained the node (its reason names one)."""
    reason = parse_reason(state.reason) if state.drained else None
    return reason is not None and reason.check.startswith("conformance.")


def select(nodes: Sequence[str], states: Mapping[str, SlurmNode]) -> Selection:
    """Split ``nodes`` by their Slurm state (module docstring)."""
    idle: list[str] = []
    recheck: list[str] = []
    skipped: dict[str, str] = {}
    for name in nodes:
        state = states.get(name)
        if state is None:
            skipped[name] = "not in Slurm"
        elif drained_by_conformance(state) and state.state in IDLE_STATES:
            recheck.append(name)
        elif state.drained:
            skipped[name] = f"out of service ({state.state_text}: {state.reason or 'no reason'})"
        elif state.state in IDLE_STATES and not set(state.flags) & {"NOT_RESPONDING", "MAINT"}:
            idle.append(name)
        else:
            skipped[name] = f"{not_idle_why(state)} ({state.state_text})"
    return Selection(tuple(idle), skipped, tuple(recheck))


def not_idle_why(state: SlurmNode) -> str:
    """Why an undrained node that is not idle was not checked, in an operator's words."""
    words = {state.state, *state.flags}
    if state.busy:
        return "busy"
    never_registered = state.fields.get("SlurmdStartTime") == "None"
    if words & {"FUTURE", "CLOUD"} or (never_registered and not state.busy):
        return "not deployed yet"  # declared in slurm.conf, its slurmd never registered
    if words & {"DOWN", "NOT_RESPONDING", "FAIL", "FAILING"}:
        return "down"
    if "MAINT" in words or "RESERVED" in words:
        return "in a maintenance reservation"
    return "not idle"


def sbatch_argv(
    count: int,
    *,
    level: str,
    run_id: int,
    window_minutes: int,
    partition: str = PARTITION,
    pyz: str = NODE_PYZ,
    reservation: str | None = None,
) -> list[str]:
    """The one ``sbatch`` call of a run: an array of ``count`` exclusive one-node tasks.

    ``--exclusive`` puts one task per node, so ``count`` tasks started together land on the
    ``count`` idle nodes; ``--deadline`` ends what could not start within the window (a node
    taken by a real job meanwhile); ``--no-requeue`` keeps a preempted task from coming back
    on a node that now runs real work. Output goes nowhere: each task posts its record to the
    collector, so no shared file system is needed.
    """
    if count < 1:
        raise ValueError("no node to check")
    minutes = TASK_MINUTES[level]
    return [
        "sbatch",
        "--parsable",
        f"--job-name=gpuforge-conformance-{run_id}",
        f"--partition={partition}",
        f"--array=0-{count - 1}",
        "--nodes=1",
        "--ntasks=1",
        "--exclusive",
        f"--time={minutes}",
        f"--deadline=now+{max(window_minutes, minutes + 1)}minutes",
        "--no-requeue",
        "--output=/dev/null",
        "--error=/dev/null",
        f"--comment=gpuforge conformance run {run_id}",
        *([f"--reservation={reservation}"] if reservation else []),
        "--wrap",
        f"/usr/bin/python3 {pyz} conformance --level {level}",
    ]


def chunks(count: int, max_array_size: int = MAX_ARRAY_SIZE) -> list[int]:
    """Task counts of the ``sbatch`` calls for ``count`` idle nodes: one array while the count
    fits under Slurm's ``MaxArraySize`` (the slurm role sets it above the fleet), else as few
    arrays as fit. Independent of the node count on a cluster the role configured."""
    per = max(max_array_size - 1, 1)
    return [min(per, count - i) for i in range(0, count, per)]
