"""A conformance run wired to a real cluster: its fleet, Slurm or SSH, the collector, burn-in.

:func:`run_cluster` is what ``gpuforge conformance run`` calls: it builds the run's
:class:`~gpuforge.conformance.run.Deps` from the cluster (Slurm + the collector's store, or the
node checker over SSH before Slurm), serves the collector in this process for the run when asked
and nobody serves already, and runs :func:`gpuforge.conformance.run.run`. Each piece is a
function of typed inputs, tested against fakes without click (tests/unit/conformance).
"""

from __future__ import annotations

import json
import logging
import shlex
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpuforge.admission import Admission, ValidationWindow
from gpuforge.command import CommandRunner, SshRunner
from gpuforge.conformance import judge, plan, report
from gpuforge.conformance.run import (
    ConformanceDeps,
    ConformanceFleet,
    ConformanceOptions,
    ConformanceOutcome,
    Raw,
    run,
)
from gpuforge.errors import InputError, OperationError
from gpuforge.health import fleet as health_fleet
from gpuforge.history.conformance import ConformanceHistory, NodeResult
from gpuforge.history.store import HistoryStore
from gpuforge.inventory.reader import ClusterView, InventoryDir
from gpuforge.rollout.lock import holder
from gpuforge.slurm import control
from gpuforge.slurm.control import SlurmClient
from gpuforge.ssh import SshTarget
from gpuforge.state_paths import collector_lock_of
from gpuforge.validate import pipeline
from gpuforge.validate.result import BatchSummary, Level, Status

if TYPE_CHECKING:
    from gpuforge.health.collector import CollectorServer

log = logging.getLogger(__name__)

#: Seconds one node checker run over SSH may take (burnin runs DCGM level 2).
SSH_TIMEOUT = {"passive": 120.0, "quick": 300.0, "burnin": 1500.0}
#: Nodes the SSH transport reaches at once.
SSH_PARALLEL = 32
#: The maintenance window level burnin's pairs and NCCL run in.
BURNIN_WINDOW = "gpuforge_conformance_burnin"


def fleet_of(root: Path, hf: health_fleet.Fleet) -> ConformanceFleet:
    """The cluster's GPU nodes with their place, type and generated Slurm settings."""
    generated = InventoryDir.open(root).generated
    path = generated / "topology.json"
    topology = json.loads(path.read_text(encoding="utf-8"))
    types = {
        str(n["hostname"]): str(n.get("node_type") or "")
        for n in topology.get("nodes", [])
        if n.get("role") == "gpu"
    }
    placement = {
        n: report.Placement(
            su=f"su{hf.placement[n].get('su')}" if hf.placement[n].get("su") is not None else "",
            rack=str(hf.placement[n].get("rack") or ""),
            leaf=hf.leaves.get(n, ""),
        )
        for n in hf.nodes
    }
    nodes_conf = generated / "slurm" / "nodes.conf"
    try:
        slurm = judge.desired_slurm(nodes_conf.read_text(encoding="utf-8"))
    except FileNotFoundError:
        slurm = {}  # a fleet without Slurm (--no-slurm): nothing to compare
    except OSError as exc:
        raise InputError(f"{nodes_conf}: {exc.strerror or exc}") from None
    return ConformanceFleet(hf.nodes, placement, types, slurm)


def job_id(out: str) -> str:
    """The job id of ``sbatch --parsable`` output (``123`` or ``123;cluster``)."""
    job = out.strip().split(";", 1)[0]
    if not job.isdigit():
        raise OperationError(f"sbatch answered {out.strip()[:200]!r}, not a job id")
    return job


def slurm_deps(slurm: SlurmClient, store: HistoryStore) -> ConformanceDeps:
    """The Slurm path: scontrol for states, sbatch, squeue; records from the collector's store."""

    def states() -> Mapping[str, control.SlurmNode]:
        return {s.name: s for s in control.node_states(slurm)}

    def submit(argv: Sequence[str]) -> str:
        res = slurm.run(list(argv), timeout=120)
        if res.rc != 0:
            raise OperationError(f"sbatch failed (rc {res.rc}): {res.stderr.strip()[-500:]}")
        return job_id(res.stdout)

    def active(jobs: Sequence[str]) -> bool:
        res = slurm.run(["squeue", "-h", "-j", ",".join(jobs), "-o", "%i"], timeout=60)
        # squeue exits 1 with "Invalid job id" once a job has left the queue.
        return res.rc == 0 and bool(res.stdout.strip())

    def collect(jobs: Sequence[str]) -> Mapping[str, Raw]:
        wanted = set(jobs)
        out: dict[str, Raw] = {}
        for node, row in store.latest(tier="conformance").items():
            try:
                job = json.loads(row.record_json).get("job_id")
            except ValueError:
                out[node] = row.record_json  # judged: a corrupt result is that node's error
                continue
            if str(job) in wanted:
                out[node] = row.record_json
        return out

    return ConformanceDeps(states=states, submit=submit, active=active, collect=collect)


def ssh_deps(view: ClusterView, runner: CommandRunner | None = None) -> ConformanceDeps:
    """Without Slurm: the same node checker over SSH, :data:`SSH_PARALLEL` nodes at a time."""
    if runner is None:
        meta = view.inventory.get("_meta", {}).get("hostvars", {})
        runner = SshRunner({h: SshTarget.from_hostvars(h, v) for h, v in meta.items()})
    chosen: CommandRunner = runner

    def ssh(nodes: Sequence[str], level: str) -> Mapping[str, Raw]:
        line = (
            f"/usr/bin/python3 {shlex.quote(plan.NODE_PYZ)} conformance --level {level} --no-send"
        )

        def one(node: str) -> tuple[str, Raw | None]:
            res = chosen.run(node, line, timeout=SSH_TIMEOUT[level])
            lines = [x for x in res.stdout.splitlines() if x.strip()]
            return node, lines[-1] if res.rc == 0 and lines else None

        with ThreadPoolExecutor(SSH_PARALLEL) as pool:
            return {n: r for n, r in pool.map(one, nodes) if r is not None}

    return ConformanceDeps(ssh=ssh)


@contextmanager
def collector_for_run(
    listen: str | None, hf: health_fleet.Fleet, store: HistoryStore, admission: Admission
) -> Iterator[str]:
    """Serve the collector in this process for the run when nobody serves on ``listen``.

    One writer per history: when a collector (``gpuforge health serve``, the service) already
    holds this history's writer lock, none is started here; the nodes' records reach the
    history through that one, and the run reads them from the store as always.
    """
    from gpuforge.health.collector import (  # noqa: PLC0415
        Collector,
        HistoryHeld,
        make_server,
        parse_listen,
    )
    from gpuforge.health.decide import Decider  # noqa: PLC0415

    writer = holder(collector_lock_of(store.path))
    if not listen:
        yield (
            f"the collector writing this history ({writer})"
            if writer
            else "a collector serving elsewhere: none writes this history on this host "
            f"(nothing holds {collector_lock_of(store.path)}); give --collector-listen"
        )
        return
    host, port = parse_listen(listen)
    with socket.socket() as probe:
        probe.settimeout(1.0)
        if probe.connect_ex((host if host != "0.0.0.0" else "127.0.0.1", port)) == 0:  # noqa: S104
            yield f"the collector already serving on {host}:{port}"
            return
    collector = Collector(hf, store, Decider(admission, leaves=hf.leaves, store=store))
    try:
        server = make_server(collector, host, port, command="gpuforge conformance run "
                             "(its in-process collector)")  # fmt: skip
    except HistoryHeld:
        yield f"the collector writing this history ({holder(collector_lock_of(store.path))})"
        return
    except OSError as exc:
        raise InputError(f"--collector-listen {listen}: {exc.strerror or exc}") from None
    collector.start()
    thread = threading.Thread(target=_serve, args=(server,), name="collector", daemon=True)
    thread.start()
    try:
        yield f"an in-process collector on {host}:{port} for this run"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)
        collector.stop()


def _serve(server: CollectorServer) -> None:
    """The in-process collector's loop: an error ends it with one line, never a traceback."""
    try:
        server.serve_forever(poll_interval=0.5)
    except Exception as exc:
        log.error("the in-process collector stopped: %s: %s", type(exc).__name__, exc)


#: Runs the validation pipeline on nodes inside a reservation (the real one: :func:`_pipeline`).
BurninFn = Callable[[Sequence[str], str], BatchSummary]


def burnin_results(summary: BatchSummary) -> dict[str, NodeResult]:
    """The nodes that failed (or could not be judged) in ``summary``, as conformance results."""
    out: dict[str, NodeResult] = {}
    for v in summary.nodes:
        bad = tuple(r for r in v.results if r.status in {Status.FAIL, Status.ERROR})
        if bad:
            worst = "fail" if any(r.status is Status.FAIL for r in bad) else "error"
            out[v.node] = NodeResult(v.node, worst, ",".join(v.reasons), bad)
    return out


def burnin_tests(
    admission: Admission, validate: BurninFn
) -> Callable[[Sequence[str]], Mapping[str, NodeResult]]:
    """Level burnin's fabric part through the validation pipeline, in a maintenance window.

    ib_write_bw pairs per rail and NCCL in leaf groups (with the pipeline's culprit
    localization when a group underperforms) on the nodes whose task passed; user jobs are kept
    off them by the window's reservation. Nothing is admitted in the window: its failures join
    the run's results, which the run admits with the rest.
    """

    def tests(nodes: Sequence[str]) -> Mapping[str, NodeResult]:
        with ValidationWindow(admission, BURNIN_WINDOW, list(nodes)):
            summary = validate(nodes, BURNIN_WINDOW)
        return burnin_results(summary)

    return tests


def pipeline_burnin(root: Path, report_dir: Path) -> BurninFn:
    """The pipeline's tiers run whole (its DCGM level 2 repeats the task's, its gpu-burn is cut
    to 60 s): one code path for acceptance and nightly burn-in."""

    def validate(nodes: Sequence[str], reservation: str) -> BatchSummary:
        wiring = pipeline.wire(root, need_slurm=False)
        return pipeline.run_validation(
            wiring.view,
            list(nodes),
            pipeline.ValidationOptions(
                level=Level.FULL,
                gpu_burn_seconds=60,
                dcgm_level=2,
                reservation=reservation,
                work_dir=report_dir / "burnin",
            ),
            wiring.deps,
        )

    return validate


@dataclass(frozen=True)
class RunTarget:
    """What :func:`run_cluster` needs of the cluster; the CLI builds it from its context."""

    root: Path  # the cluster directory
    fleet: health_fleet.Fleet
    #: None: reach the nodes over SSH (before Slurm); the view gives their connection settings.
    admission: Admission | None
    view: Callable[[], ClusterView]


def run_cluster(
    cluster: RunTarget,
    history: ConformanceHistory,
    opts: ConformanceOptions,
    *,
    lock_path: Path,
    report_dir: Path,
    collector_listen: str | None = None,
) -> ConformanceOutcome:
    """One conformance run on ``cluster``: wire its transport, serve the collector if asked, run.

    With admission (Slurm): one job array, records through the collector, verdicts admitted;
    level burnin adds the pipeline's pairs and NCCL in a window. Without: the node checker over
    SSH, nothing admitted.
    """
    fleet = fleet_of(cluster.root, cluster.fleet)
    if cluster.admission is None:
        return run(fleet, history, opts, ssh_deps(cluster.view()), lock_path=lock_path)
    admission = cluster.admission
    deps = slurm_deps(admission.slurm, history.store)
    deps.admission = admission
    if opts.level == "burnin":
        deps.active_tests = burnin_tests(admission, pipeline_burnin(cluster.root, report_dir))
    with collector_for_run(collector_listen, cluster.fleet, history.store, admission) as how:
        outcome = run(fleet, history, opts, deps, lock_path=lock_path)
        outcome.notes.append(f"records through {how}")
    return outcome
