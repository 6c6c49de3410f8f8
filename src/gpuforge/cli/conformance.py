"""``gpuforge conformance``: the nightly fleet conformance run, its report and its history.

``run`` reaches the idle nodes through one Slurm job array (or SSH before Slurm), collects each
node's record through the collector, judges, admits and writes the report of what changed;
``report`` rewrites the report of a past run; ``history`` shows one node's nights; ``prune``
applies the retention policy (docs/conformance.md).
"""

from __future__ import annotations

import json
import shlex
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import click

from gpuforge.admission import Admission, AdmissionRecord, BreakerPolicy, record_path
from gpuforge.cli.common import echo_json, json_option, state_option
from gpuforge.command import CommandRunner, SshRunner
from gpuforge.conformance import judge, plan, report
from gpuforge.conformance.run import LEVELS, Deps, Fleet, Options, Outcome, Raw, run
from gpuforge.errors import InputError, OperationError
from gpuforge.health import fleet as health_fleet
from gpuforge.history.conformance import ConformanceHistory, NodeResult
from gpuforge.history.store import HistoryStore, history_path
from gpuforge.inventory.reader import ClusterView, InventoryDir, host_vars
from gpuforge.slurm import control
from gpuforge.slurm.control import SlurmClient
from gpuforge.ssh import SshTarget
from gpuforge.validate import pipeline
from gpuforge.validate.result import Tier

#: Seconds one node checker run over SSH may take (burnin runs DCGM level 2).
SSH_TIMEOUT = {"passive": 120.0, "quick": 300.0, "burnin": 1500.0}


def cluster_dir(cluster: str | None, inventory: Path | None) -> Path:
    """The cluster directory: ``--inventory DIR``, else ``inventory/CLUSTER``; exit 2 if none."""
    if cluster and inventory:
        raise InputError("give CLUSTER or --inventory, not both")
    root = inventory if inventory is not None else Path("inventory") / cluster if cluster else None
    if root is None:
        raise InputError("give CLUSTER (inventory/CLUSTER) or --inventory DIR")
    if not (root / "generated").is_dir():
        raise InputError(f"unknown cluster: {root} is not a cluster directory (no generated/)")
    return root


def _fleet(root: Path) -> tuple[str, Fleet]:
    """The cluster's name and its GPU nodes with their place and type (topology.json)."""
    hf = health_fleet.Fleet.load(root)
    path = InventoryDir.open(root).generated / "topology.json"
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
    nodes_conf = InventoryDir.open(root).generated / "slurm" / "nodes.conf"
    try:
        slurm = judge.desired_slurm(nodes_conf.read_text(encoding="utf-8"))
    except FileNotFoundError:
        slurm = {}  # a fleet without Slurm (--no-slurm): nothing to compare
    except OSError as exc:
        raise InputError(f"{nodes_conf}: {exc.strerror or exc}") from None
    return hf.name, Fleet(hf.nodes, placement, types, slurm)


def _history(
    state_dir: Path, cluster: str, *, create: bool, readonly: bool = False
) -> ConformanceHistory:
    path = history_path(state_dir, cluster)
    return ConformanceHistory(HistoryStore.open(path, create=create, readonly=readonly))


def _slurm(via: str, root: Path) -> SlurmClient:
    if via == "local":
        return SlurmClient.local()
    return SlurmClient.over_ssh(via, host_vars(root, via))


def _job_id(out: str) -> str:
    job = out.strip().split(";", 1)[0]
    if not job.isdigit():
        raise OperationError(f"sbatch answered {out.strip()[:200]!r}, not a job id")
    return job


def slurm_deps(slurm: SlurmClient, store: HistoryStore) -> Deps:
    """The Slurm path: scontrol for states, sbatch, squeue; records from the collector's store."""

    def states() -> Mapping[str, control.SlurmNode]:
        return {s.name: s for s in control.node_states(slurm)}

    def submit(argv: Sequence[str]) -> str:
        res = slurm.run(list(argv), timeout=120)
        if res.rc != 0:
            raise OperationError(f"sbatch failed (rc {res.rc}): {res.stderr.strip()[-500:]}")
        return _job_id(res.stdout)

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

    return Deps(states=states, submit=submit, active=active, collect=collect)


def ssh_deps(view: ClusterView, runner: CommandRunner | None = None) -> Deps:
    """Without Slurm: the same node checker over SSH, 32 nodes at a time."""
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

        with ThreadPoolExecutor(32) as pool:
            return {n: r for n, r in pool.map(one, nodes) if r is not None}

    return Deps(ssh=ssh)


@contextmanager
def collector_for_run(
    listen: str | None, root: Path, store: HistoryStore, admission: Admission
) -> Iterator[str]:
    """Serve the collector in this process for the run when nobody serves on ``listen``."""
    if not listen:
        yield "a collector already serving (gpuforge health serve)"
        return
    from gpuforge.health.collector import Collector, make_server, parse_listen  # noqa: PLC0415
    from gpuforge.health.decide import Decider  # noqa: PLC0415

    host, port = parse_listen(listen)
    with socket.socket() as probe:
        probe.settimeout(1.0)
        if probe.connect_ex((host if host != "0.0.0.0" else "127.0.0.1", port)) == 0:  # noqa: S104
            yield f"the collector already serving on {host}:{port}"
            return
    hf = health_fleet.Fleet.load(root)
    collector = Collector(hf, store, Decider(admission, leaves=hf.leaves, store=store))
    try:
        server = make_server(collector, host, port)
    except OSError as exc:
        raise InputError(f"--collector-listen {listen}: {exc.strerror or exc}") from None
    collector.start()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5})
    thread.start()
    try:
        yield f"an in-process collector on {host}:{port} for this run"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)
        collector.stop()


def burnin_tests(
    root: Path, admission: Admission, report_dir: Path
) -> Callable[[Sequence[str]], Mapping[str, NodeResult]]:
    """Level burnin's fabric part through the validation pipeline, in a maintenance window.

    ib_write_bw pairs per rail and NCCL in leaf groups (with the pipeline's culprit
    localization when a group underperforms) on the nodes whose task passed; user jobs are kept
    off them by the window's reservation. The pipeline's tiers run whole (its DCGM level 2 repeats
    the task's, its gpu-burn is cut to 60 s): one code path for acceptance and nightly burn-in.
    """

    def tests(nodes: Sequence[str]) -> Mapping[str, NodeResult]:
        wiring = pipeline.wire(root, need_slurm=False)
        window = "gpuforge_conformance_burnin"
        admission.open_window(window, nodes)
        try:
            summary = pipeline.run_validation(
                wiring.view,
                list(nodes),
                pipeline.Options(
                    level=Tier.FULL,
                    gpu_burn_seconds=60,
                    dcgm_level=2,
                    reservation=window,
                    work_dir=report_dir / "burnin",
                ),
                wiring.deps,
            )
        finally:
            admission.close_window(window)
        out: dict[str, NodeResult] = {}
        for v in summary.nodes:
            bad = tuple(
                (r.check, r.status.value, r.action)
                for r in v.results
                if r.status.value in {"fail", "error"}
            )
            if bad:
                worst = "fail" if any(s == "fail" for _, s, _ in bad) else "error"
                out[v.node] = NodeResult(v.node, worst, ",".join(v.reasons), bad)
        return out

    return tests


def _print(outcome: Outcome, paths: Mapping[str, Path]) -> None:
    ch = outcome.changes
    counts = ch.counts()
    click.echo(
        f"conformance run {ch.run.id} ({ch.run.level}, {ch.run.state}): "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    )
    for label, nodes in (
        ("new failures", ch.new_failures),
        ("still failing", ch.still_failing),
        ("cleared", ch.cleared),
        ("errors", ch.errors),
    ):
        if nodes:
            click.echo(f"  {label}: {', '.join(nodes[:50])}" + (" ..." if len(nodes) > 50 else ""))
    for node in ch.new_failures + ch.still_failing:
        for kind, item, want, got in ch.results[node].drift[:20]:
            click.echo(f"    {node} {kind} {item}: desired {want!r}, actual {got!r}")
    for node, items in sorted(ch.drift_fixed.items()):
        for kind, item, _, _ in items[:20]:
            click.echo(f"    {node} fixed: {kind} {item}")
    if ch.repeat_offenders:
        click.echo(f"  repeat offenders: {ch.repeat_offenders}")
    for note in outcome.notes:
        click.echo(f"  note: {note}")
    for action in outcome.actions:
        if action.action not in {"none"}:
            click.echo(f"  slurm {action.node}: {action.action} {action.reason} {action.detail}")
    click.echo("  reports: " + ", ".join(str(p) for p in paths.values()))


@click.group("conformance")
def conformance() -> None:
    """Nightly fleet conformance: drift and checks on idle nodes, history, what changed."""


cluster_arg = click.argument("cluster", required=False)
inventory_option = click.option(
    "--inventory",
    type=click.Path(file_okay=False, path_type=Path),
    help="Cluster directory (generated/ and site/); default inventory/CLUSTER.",
)
report_option = click.option(
    "--report-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("build/conformance"),
    show_default=True,
    help="Where conformance.json, junit.xml and report.html go (one folder per run).",
)
textfile_option = click.option(
    "--textfile",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the run's Prometheus textfile metrics here "
    "(/var/lib/prometheus/node-exporter/gpuforge_conformance_fleet.prom on the controller).",
)


@conformance.command("run")
@cluster_arg
@inventory_option
@click.option(
    "--level",
    type=click.Choice(LEVELS),
    default="quick",
    show_default=True,
    help="passive: the passive checks and drift; quick: the same; burnin: + DCGM level 2 "
    "on each node, ib_write_bw pairs and NCCL through the validation pipeline.",
)
@click.option(
    "--via",
    metavar="HOST|local",
    help="Where Slurm's commands run: 'local' on the controller, else HOST over SSH "
    "(default: the inventory's controller).",
)
@click.option("--no-slurm", is_flag=True, help="Reach the nodes over SSH (before admission).")
@click.option(
    "--collector-listen",
    metavar="ADDR:PORT",
    help="Serve the collector in this process for the run unless one already listens there.",
)
@click.option("--window", type=click.IntRange(min=1), default=60, show_default=True,
              help="Minutes within which every task must have started.")  # fmt: skip
@click.option("--shadow", is_flag=True, help="Record verdicts, change nothing in Slurm.")
@click.option(
    "--max-fraction",
    type=click.FloatRange(0, 1, min_open=True),
    default=0.01,
    show_default=True,
    help="Circuit breaker: most of the fleet drained per window.",
)
@report_option
@textfile_option
@state_option
def run_cmd(  # noqa: PLR0917 - one parameter per CLI option
    cluster: str | None,
    inventory: Path | None,
    level: str,
    via: str | None,
    no_slurm: bool,
    collector_listen: str | None,
    window: int,
    shadow: bool,
    max_fraction: float,
    report_dir: Path,
    textfile: Path | None,
    state_dir: Path,
) -> None:
    """Check every idle node of CLUSTER against its desired state; report what changed.

    Exit 0 every checked node conforms; 1 a node failed or could not be judged; 2 bad input,
    or the run was cut short (partial).
    """
    opts = Options(level=level, window_minutes=window)
    root = cluster_dir(cluster, inventory)
    name, fleet = _fleet(root)
    history = _history(state_dir, name, create=True)
    store = history.store
    if no_slurm:
        deps = ssh_deps(ClusterView.load(root))
        admission = None
    else:
        view_controller = via or ClusterView.load(root).controller()
        slurm = _slurm(view_controller, root)
        admission = Admission(
            slurm,
            AdmissionRecord(record_path(state_dir, name)),
            source="conformance",
            breaker=BreakerPolicy(population=len(fleet.nodes), max_fraction=max_fraction),
            shadow=shadow,
        )
        deps = slurm_deps(slurm, store)
        deps.admission = admission
        if level == "burnin":
            deps.active_tests = burnin_tests(root, admission, report_dir / name)
    lock = state_dir / name / "conformance.lock"
    if admission is not None:
        with collector_for_run(collector_listen, root, store, admission) as how:
            outcome = run(fleet, history, opts, deps, lock_path=lock)
            outcome.notes.append(f"records through {how}")
    else:
        outcome = run(fleet, history, opts, deps, lock_path=lock)
    out_dir = report_dir / name / f"run-{outcome.changes.run.id:05d}"
    paths = report.write(outcome.changes, out_dir, textfile=textfile)
    _print(outcome, paths)
    raise SystemExit(outcome.changes.exit_code)


@conformance.command("report")
@cluster_arg
@inventory_option
@click.option("--run", "run_id", type=int, help="Run id (default: the newest finished run).")
@report_option
@textfile_option
@state_option
@json_option
def report_cmd(  # noqa: PLR0917 - one parameter per CLI option
    cluster: str | None,
    inventory: Path | None,
    run_id: int | None,
    report_dir: Path,
    textfile: Path | None,
    state_dir: Path,
    as_json: bool,
) -> None:
    """What changed in a run against the one before: JSON, JUnit and HTML. Exit 0/1/2."""
    root = cluster_dir(cluster, inventory)
    name, fleet = _fleet(root)
    history = _history(state_dir, name, create=False, readonly=True)
    runs = [r for r in history.runs(400) if r.state != "running"]
    chosen = (
        next((r for r in runs if r.id == run_id), None) if run_id else (runs[0] if runs else None)
    )
    if chosen is None:
        which = f"run {run_id}" if run_id else "finished run"
        raise InputError(f"no conformance {which} in {history.store.path}")
    changes = report.compare(history, chosen, fleet.placement)
    paths = report.write(changes, report_dir / name / f"run-{chosen.id:05d}", textfile=textfile)
    if as_json:
        echo_json(changes.to_dict())
    else:
        _print(Outcome(changes, [], []), paths)
    raise SystemExit(changes.exit_code)


@conformance.command("history")
@click.argument("node")
@click.option("--cluster", required=True, help="Cluster name (its state under --state-dir).")
@click.option("--limit", type=click.IntRange(min=1), default=30, show_default=True)
@state_option
@json_option
def history_cmd(node: str, cluster: str, limit: int, state_dir: Path, as_json: bool) -> None:
    """NODE's conformance results, newest first."""
    rows = _history(state_dir, cluster, create=False, readonly=True).node_history(node, limit)
    if not rows:
        raise InputError(f"no conformance history for {node} in cluster {cluster}")
    if as_json:
        echo_json([{"run": r.to_dict(), "result": x.to_dict()} for r, x in rows])
        return
    for r, x in rows:
        when = datetime.fromtimestamp(r.started, UTC).strftime("%Y-%m-%dT%H:%MZ")
        drift = "; ".join(f"{k} {i}" for k, i, _, _ in x.drift)
        click.echo(f"{when} run {r.id} {r.level}: {x.outcome} {x.why} {drift}".rstrip())


@conformance.command("prune")
@click.option("--cluster", required=True, help="Cluster name (its state under --state-dir).")
@click.option("--full-days", type=click.FloatRange(min=1), default=90.0, show_default=True)
@click.option("--keep-days", type=click.FloatRange(min=1), default=400.0, show_default=True)
@state_option
def prune_cmd(cluster: str, full_days: float, keep_days: float, state_dir: Path) -> None:
    """Drop passing rows older than --full-days and every row older than --keep-days."""
    gone = _history(state_dir, cluster, create=False).prune(
        full_days=full_days, keep_days=keep_days
    )
    click.echo(f"pruned {gone} conformance row(s)")
