"""``gpuforge deploy`` and ``gpuforge status``: the phased rollout."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
import hostlist
from rich.console import Console
from rich.table import Table

from gpuforge.cli.common import (
    echo_json,
    interruptible,
    inventory_option,
    json_option,
    report_dir_option,
    state_option,
)
from gpuforge.cli.context import ClusterContext, spec_context, state_context
from gpuforge.errors import InputError
from gpuforge.rollout.deploy import LEVELS, DeployOutcome, DeployRequest, deploy_phase
from gpuforge.rollout.lock import holder
from gpuforge.rollout.state import NodeState, RunRecord, StateStore, open_store
from gpuforge.rollout.steps import ansible_steps
from gpuforge.rollout.ui import deploy_progress
from gpuforge.slurm.control import expand_nodes
from gpuforge.topology import load_cluster
from gpuforge.upgrade.run import render_progress, upgrade_progress

spec_argument = click.argument("spec", type=click.Path(exists=True, dir_okay=False, path_type=Path))


def store_and_lock(ctx: ClusterContext) -> tuple[StateStore, Path]:
    """The cluster's rollout record and lock."""
    return open_store(ctx.state.rollout_db), ctx.state.lock


@click.command("deploy")
@click.option("--phase", "phase_number", type=int, required=True, help="Rollout phase (1-based).")
@spec_argument
@inventory_option
@click.option("--level", type=click.Choice(LEVELS), default="full", show_default=True)
@click.option("--only", help="Only these nodes of the phase (hostlist), e.g. after a repair.")
@click.option("--redo", is_flag=True, help="Provision and validate admitted nodes again.")
@click.option("--force", "force_reason", help="Start although the previous gate failed; REASON.")
@state_option
@report_dir_option("Where the phase's validation and rollout reports go (one folder per run).")
def deploy(  # noqa: PLR0917 - one parameter per CLI option
    phase_number: int,
    spec: Path,
    inventory: Path | None,
    level: str,
    only: str | None,
    redo: bool,
    force_reason: str | None,
    state_dir: Path,
    report_dir: Path,
) -> None:
    """Provision, validate and admit one rollout phase of SPEC, resumably."""
    cluster = load_cluster(spec)
    phases = {p.number: p for p in cluster.phases}
    if phase_number not in phases:
        raise InputError(f"{cluster.name} has phases {sorted(phases)}, not {phase_number}")
    phase = phases[phase_number]
    ctx = spec_context(cluster.name, inventory, state_dir)
    controllers = [n.hostname for n in cluster.by_role("controller")]
    if not controllers:
        raise InputError(f"{cluster.name} has no Slurm controller node group")
    infra = tuple(controllers + [n.hostname for n in cluster.by_role("login")])
    run_dir = (
        report_dir / cluster.name / f"phase_{phase_number:02d}-{time.strftime('%Y%m%dT%H%M%S')}"
    )
    console = Console()
    store, lock = store_and_lock(ctx)
    with deploy_progress(console) as progress:
        steps = ansible_steps(
            ctx.path,
            ctx.admission(ctx.slurm(controllers[0]), "deploy"),
            run_dir,
            store,
            lock,
            reservation=f"gpuforge_{cluster.name}_phase{phase_number:02d}",
            on_event=progress.event,
        )
        request = DeployRequest(
            phase=phase_number,
            hosts=phase.hosts,
            gate_fraction=phase.min_pass_fraction,
            infra=infra,
            only=tuple(expand_nodes(only)) if only else (),
            level=level,
            redo=redo,
            force_reason=force_reason,
        )
        with interruptible():
            outcome = deploy_phase(store, steps, request, lock_path=lock, on_stage=progress.stage)
    from gpuforge.rollout.report import write_phase_report  # noqa: PLC0415

    paths = write_phase_report(store, cluster, outcome, run_dir)
    _print_outcome(console, store, phase_number, outcome, paths)
    raise SystemExit(0 if outcome.passed else 1)


def _print_outcome(
    console: Console, store: StateStore, phase: int, outcome: DeployOutcome, paths: list[Path]
) -> None:
    table = Table(title=f"phase {phase} — run {outcome.run_id}")
    for col in ("node", "state", "reason"):
        table.add_column(col)
    nodes = store.nodes(phase)
    # Nodes not admitted one row each, failures first; the admitted ones (a phase may hold a
    # thousand) in one row.
    order = {"quarantined": 0, "unreachable": 1}
    for node in sorted(
        (n for n in nodes if n.state.value != "admitted"),
        key=lambda n: (order.get(n.state.value, 2), n.hostname),
    ):
        style = "red" if node.state.value in order else "yellow"
        table.add_row(node.hostname, f"[{style}]{node.state.value}[/]", node.reason)
    admitted = [n.hostname for n in nodes if n.state.value == "admitted"]
    if admitted:
        table.add_row(
            f"{hostlist.collect_hostlist(admitted)} ({len(admitted)})", "[green]admitted[/]", ""
        )
    console.print(table)
    stages = ", ".join(f"{k} {v:.1f}s" for k, v in outcome.stage_seconds.items())
    console.print(f"stages: {stages}")
    for note in outcome.notes:
        console.print(f"[yellow]note:[/] {note}")
    verdict = "[green]PASSED[/]" if outcome.passed else "[bold red]FAILED[/]"
    console.print(f"gate: {verdict} — {outcome.gate.detail}")
    for path in [*outcome.report_paths, *paths]:
        console.print(f"report: {path}")


@click.command("status")
@click.argument("spec", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@state_option
@json_option
def status(spec: Path, state_dir: Path, as_json: bool) -> None:
    """Show the rollout of SPEC: phases, states, gates, runs, quarantined and unreachable nodes."""
    cluster = load_cluster(spec)
    store, lock = store_and_lock(state_context(cluster.name, state_dir))
    nodes = {n.hostname: n for n in store.nodes()}
    rows: list[dict[str, Any]] = []
    for phase in cluster.phases:
        counts = {s.value: 0 for s in NodeState}
        for host in phase.hosts:
            counts[nodes[host].state.value if host in nodes else "new"] += 1
        last = store.last_gate(phase.number)
        rows.append(
            {
                "phase": phase.number,
                "name": phase.name,
                "nodes": phase.hostlist,
                "counts": {k: v for k, v in counts.items() if v},
                "gate": None
                if last is None
                else {"passed": last.passed, "detail": last.detail, "run": last.run_id},
            }
        )
    quarantined = [
        {"hostname": n.hostname, "phase": n.phase, "state": n.state.value, "reason": n.reason}
        for n in nodes.values()
        if n.state in (NodeState.QUARANTINED, NodeState.UNREACHABLE)
    ]
    held_by = holder(lock)
    runs = [_run_row(r, held_by) for r in store.runs()[-RECENT_RUNS:]]
    upgrades = upgrade_progress(store)
    if as_json:
        echo_json(
            {
                "cluster": cluster.name,
                "in_progress": held_by,
                "phases": rows,
                "runs": runs,
                "quarantined": quarantined,
                "overrides": store.overrides(),
                "upgrades": upgrades,
            }
        )
        return
    console = Console()
    if held_by:
        console.print(f"[yellow]in progress:[/] {held_by}", highlight=False, soft_wrap=True)
    table = Table(title=f"rollout of {cluster.name}")
    for col in ("phase", "nodes", "states", "gate"):
        table.add_column(col)
    for row in rows:
        gate = row["gate"]
        gate_text = (
            "not run"
            if gate is None
            else ("[green]passed[/]" if gate["passed"] else "[red]failed[/]")
        )
        states = ", ".join(f"{k} {v}" for k, v in row["counts"].items())
        table.add_row(f"{row['phase']} {row['name']}", str(row["nodes"]), states, gate_text)
    console.print(table)
    for run in runs:
        style = {"passed": "green", "running": "yellow"}.get(run["status"], "red")
        detail = f": {run['detail']}" if run["detail"] else ""
        console.print(
            f"run {run['id']} phase {run['phase']} ({run['level']}, {run['started']}): "
            f"[{style}]{run['status']}[/]{detail}",
            highlight=False,
            soft_wrap=True,
        )
    for upgrade in upgrades[:RECENT_UPGRADES]:
        shown = dict(upgrade)
        if shown["status"] == "running" and not held_by:  # its process was killed (SIGKILL)
            shown["status"] = "interrupted (its process died; run it again to resume)"
        style = {"finished": "green", "running": "yellow"}.get(shown["status"], "red")
        console.print(f"[{style}]{render_progress(shown)}[/]", highlight=False, soft_wrap=True)
    for q in quarantined:
        console.print(
            f"[red]{q['state']}[/] {q['hostname']} (phase {q['phase']}): {q['reason']}",
            highlight=False,
            soft_wrap=True,
        )


RECENT_RUNS = 10
"""Runs that ``status`` lists, newest last."""
RECENT_UPGRADES = 3
"""Upgrades that ``status`` lists, newest first."""


def _run_row(run: RunRecord, held_by: str | None) -> dict[str, Any]:
    status = run.status
    detail = run.detail
    if status == "running" and held_by is None:
        # Its process died without a word (SIGKILL, power): the next deploy records it so.
        status, detail = "interrupted", "its gpuforge process died (killed?)"
    return {
        "id": run.id,
        "phase": run.phase,
        "level": run.level,
        "operator": run.operator,
        "started": time.strftime("%Y-%m-%d %H:%M", time.localtime(run.started_at)),
        "status": status,
        "detail": detail,
    }
