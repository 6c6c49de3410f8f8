"""``gpuforge conformance``: the nightly fleet conformance run, its report and its history.

``run`` reaches the idle nodes through one Slurm job array (or SSH before Slurm), collects each
node's record through the collector, judges, admits and writes the report of what changed;
``report`` rewrites the report of a past run; ``history`` shows one node's nights; ``prune``
applies the retention policy (docs/conformance.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import click

from gpuforge.admission import BreakerPolicy
from gpuforge.cli.common import (
    cluster_argument,
    cluster_option,
    echo_json,
    inventory_option,
    json_option,
    max_fraction_option,
    on_services_host,
    report_dir_option,
    state_option,
    via_option,
)
from gpuforge.cli.context import ClusterContext, cluster_context, state_context
from gpuforge.conformance import report
from gpuforge.conformance.report import MIN_JUDGED
from gpuforge.conformance.run import LEVELS, ConformanceOptions, ConformanceOutcome
from gpuforge.conformance.wiring import RunTarget, fleet_of, run_cluster
from gpuforge.errors import InputError
from gpuforge.history.conformance import ConformanceHistory
from gpuforge.history.store import HistoryStore


def _context(cluster: str | None, inventory: Path | None, state_dir: Path) -> ClusterContext:
    return cluster_context(cluster, inventory, state_dir, require_generated=True)


def _history(ctx: ClusterContext, *, create: bool, readonly: bool = False) -> ConformanceHistory:
    path = ctx.state.history_db
    return ConformanceHistory(HistoryStore.open(path, create=create, readonly=readonly))


#: The inventory variable of the --min-judged default.
MIN_JUDGED_VAR = "conformance_min_judged_fraction"


def _min_judged(ctx: ClusterContext, given: float | None) -> float:
    """--min-judged, else the inventory's :data:`MIN_JUDGED_VAR` (the controller's variables),
    else :data:`MIN_JUDGED`."""
    if given is not None:
        return given
    view = ctx.view
    try:
        value = view.hostvars(view.controller()).get(MIN_JUDGED_VAR)
    except InputError:  # no controller (before Slurm): any GPU node's variables
        value = next(iter(view.all_hostvars().values()), {}).get(MIN_JUDGED_VAR)
    if value is None:
        return MIN_JUDGED
    try:
        share = -1.0 if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        share = -1.0
    if not 0 < share <= 1:
        raise InputError(f"{MIN_JUDGED_VAR}: {value!r} is not a share in (0, 1] (e.g. 0.9)")
    return share


def _print(outcome: ConformanceOutcome, paths: Mapping[str, Path]) -> None:
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
        for d in ch.results[node].drift[:20]:
            click.echo(f"    {node} {d.kind} {d.item}: desired {d.desired!r}, actual {d.actual!r}")
    for node, items in sorted(ch.drift_fixed.items()):
        for d in items[:20]:
            click.echo(f"    {node} fixed: {d.kind} {d.item}")
    if ch.repeat_offenders:
        click.echo(f"  repeat offenders: {ch.repeat_offenders}")
    if ch.short:
        click.echo(f"  exit 1: {ch.short}")
    for note in outcome.notes:
        click.echo(f"  note: {note}")
    for action in outcome.actions:
        if action.action not in {"none"}:
            click.echo(f"  slurm {action.node}: {action.action} {action.reason} {action.detail}")
    click.echo("  reports: " + ", ".join(str(p) for p in paths.values()))


@click.group("conformance")
def conformance() -> None:
    """Nightly fleet conformance: drift and checks on idle nodes, history, what changed."""


report_option = report_dir_option(
    "Where conformance.json, junit.xml and report.html go (one folder per run).",
    default=Path("build/conformance"),
)
textfile_option = click.option(
    "--textfile",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the run's Prometheus textfile metrics here "
    "(/var/lib/prometheus/node-exporter/gpuforge_conformance_fleet.prom on the controller).",
)


@conformance.command("run")
@on_services_host(timeout_s=lambda params: params["window"] * 60 + 1800)
@cluster_argument
@inventory_option
@click.option(
    "--level",
    type=click.Choice(LEVELS),
    default="quick",
    show_default=True,
    help="passive: the passive checks and drift; quick: the same; burnin: + DCGM level 2 "
    "on each node, ib_write_bw pairs and NCCL through the validation pipeline.",
)
@via_option
@click.option("--no-slurm", is_flag=True, help="Reach the nodes over SSH (before admission).")
@click.option(
    "--collector-listen",
    metavar="ADDR:PORT",
    help="Serve the collector in this process for the run unless one already listens there.",
)
@click.option("--window", type=click.IntRange(min=1), default=60, show_default=True,
              help="Minutes within which every task must have started.")  # fmt: skip
@click.option("--shadow", is_flag=True, help="Record verdicts, change nothing in Slurm.")
@max_fraction_option()
@click.option(
    "--min-judged",
    type=click.FloatRange(0, 1, min_open=True),
    help=f"Exit 1 when the run judged fewer than this share of the nodes it sent a task to "
    f"(none at all always exits 1). Default: the inventory's {MIN_JUDGED_VAR}, else {MIN_JUDGED}.",
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
    min_judged: float | None,
    report_dir: Path,
    textfile: Path | None,
    state_dir: Path,
) -> None:
    """Check every idle node of CLUSTER against its desired state; report what changed.

    Slurm's commands run on the inventory's controller over SSH unless --via says otherwise.

    Exit 0 every checked node conforms; 1 a node failed or could not be judged, or the run
    judged no node or fewer than --min-judged of the nodes it sent a task to; 2 bad input, or
    the run was cut short (partial).
    """
    ctx = _context(cluster, inventory, state_dir)
    opts = ConformanceOptions(
        level=level, window_minutes=window, min_judged=_min_judged(ctx, min_judged)
    )
    name = ctx.name
    history = _history(ctx, create=True)
    admission = (
        None
        if no_slurm
        else ctx.admission(
            ctx.slurm(via, default="controller"),
            "conformance",
            breaker=BreakerPolicy(population=len(ctx.fleet.nodes), max_fraction=max_fraction),
            shadow=shadow,
        )
    )
    outcome = run_cluster(
        RunTarget(ctx.path, ctx.fleet, admission, lambda: ctx.view),
        history,
        opts,
        lock_path=ctx.state.conformance_lock,
        report_dir=report_dir / name,
        collector_listen=collector_listen,
    )
    out_dir = report_dir / name / f"run-{outcome.changes.run.id:05d}"
    paths = report.write(outcome.changes, out_dir, textfile=textfile)
    _print(outcome, paths)
    raise SystemExit(outcome.changes.exit_code)


@conformance.command("report")
@cluster_argument
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
    ctx = _context(cluster, inventory, state_dir)
    name = ctx.name
    history = _history(ctx, create=False, readonly=True)
    runs = [r for r in history.runs(400) if r.state != "running"]
    chosen = (
        next((r for r in runs if r.id == run_id), None) if run_id else (runs[0] if runs else None)
    )
    if chosen is None:
        which = f"run {run_id}" if run_id else "finished run"
        raise InputError(f"no conformance {which} in {history.store.path}")
    changes = report.compare(history, chosen, fleet_of(ctx.path, ctx.fleet).placement)
    paths = report.write(changes, report_dir / name / f"run-{chosen.id:05d}", textfile=textfile)
    if as_json:
        echo_json(changes.to_dict())
    else:
        _print(ConformanceOutcome(changes, [], []), paths)
    raise SystemExit(changes.exit_code)


@conformance.command("history")
@click.argument("node")
@cluster_option
@click.option("--limit", type=click.IntRange(min=1), default=30, show_default=True)
@state_option
@json_option
def history_cmd(node: str, cluster: str | None, limit: int, state_dir: Path, as_json: bool) -> None:
    """NODE's conformance results, newest first."""
    context = state_context(cluster, state_dir)
    rows = _history(context, create=False, readonly=True).node_history(node, limit)
    if not rows:
        raise InputError(f"no conformance history for {node} in cluster {cluster}")
    if as_json:
        echo_json([{"run": r.to_dict(), "result": x.to_dict()} for r, x in rows])
        return
    for r, x in rows:
        when = datetime.fromtimestamp(r.started, UTC).strftime("%Y-%m-%dT%H:%MZ")
        drift = "; ".join(f"{d.kind} {d.item}" for d in x.drift)
        click.echo(f"{when} run {r.id} {r.level}: {x.outcome} {x.why} {drift}".rstrip())


@conformance.command("prune")
@cluster_option
@click.option("--full-days", type=click.FloatRange(min=1), default=90.0, show_default=True)
@click.option("--keep-days", type=click.FloatRange(min=1), default=400.0, show_default=True)
@state_option
def prune_cmd(cluster: str | None, full_days: float, keep_days: float, state_dir: Path) -> None:
    """Drop passing rows older than --full-days and every row older than --keep-days."""
    gone = _history(state_context(cluster, state_dir), create=False).prune(
        full_days=full_days, keep_days=keep_days
    )
    click.echo(f"pruned {gone} conformance row(s)")
