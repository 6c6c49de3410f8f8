"""``gpuforge remediate`` and ``gpuforge rma``: fix drained nodes, or send their part back.

``remediate`` resets the GPUs of, or reboots, the idle nodes gpuforge drained for it, re-validates
them at level burnin and admits them (:mod:`gpuforge.health.remediate`); ``rma`` writes the
evidence bundle and records a part leaving and returning (:mod:`gpuforge.health.rma`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from contextlib import ExitStack, closing
from pathlib import Path
from tempfile import TemporaryDirectory

import click
from rich.console import Console
from rich.table import Table

from gpuforge.admission import Admission
from gpuforge.cli.common import (
    cluster_option,
    echo_json,
    inventory_option,
    json_option,
    report_dir_option,
    state_option,
)
from gpuforge.cli.context import ClusterContext, cluster_context, cluster_root, state_paths
from gpuforge.errors import InputError
from gpuforge.health import remediate as rem
from gpuforge.health import rma
from gpuforge.history import HistoryStore
from gpuforge.slurm import control
from gpuforge.slurm.control import SlurmClient
from gpuforge.validate import pipeline

report_option = report_dir_option(
    "Reports go under <report-dir>/<cluster>/: remediate-<time>/ (validation, Ansible "
    "events) and rma/ (evidence bundles); validation.json files there feed the bundles."
)


def _context(
    cluster: str | None, inventory: Path | None, state_dir: Path, *, need_slurm: bool = False
) -> tuple[ClusterContext, pipeline.Wiring]:
    """The cluster the options name, and the validation pipeline's wiring of it."""
    wiring = pipeline.wire(cluster_root(cluster, inventory), need_slurm=need_slurm)
    return cluster_context(cluster, inventory, state_dir, view=wiring.view), wiring


def _slurm(wiring: pipeline.Wiring) -> SlurmClient:
    if wiring.slurm is None:  # need_slurm=True always wires one
        raise InputError(f"{wiring.view.path}: no Slurm controller to reach")
    return wiring.slurm


def _history(ctx: ClusterContext) -> HistoryStore:
    return HistoryStore.open(ctx.state.history_db)


@click.command("remediate")
@click.argument("nodes", required=False)
@click.option("--pending", is_flag=True, help="Every idle node gpuforge drained for reset/reboot.")
@cluster_option
@inventory_option
@state_option
@report_option
@click.option("--dry-run", is_flag=True, help="Say what would be done; change nothing.")
@click.option(
    "--failures",
    type=click.IntRange(min=1),
    default=rem.Policy.failures,
    show_default=True,
    help="Remediations within --window-days that failed or did not hold (the node was drained "
    "for the same check again) that send a node to RMA.",
)
@click.option(
    "--window-days",
    type=click.FloatRange(min=0, min_open=True),
    default=rem.Policy.window_s / 86400,
    show_default=True,
)
@click.option("--gpu-burn-seconds", type=click.IntRange(min=1), default=300, show_default=True)
@click.option("--dcgm-level", type=click.Choice(["2", "3"]), default="3", show_default=True)
@json_option
def remediate(
    *,
    nodes: str | None,
    pending: bool,
    cluster: str | None,
    inventory: Path | None,
    state_dir: Path,
    report_dir: Path,
    dry_run: bool,
    failures: int,
    window_days: float,
    gpu_burn_seconds: int,
    dcgm_level: str,
    as_json: bool,
) -> None:
    """Reset or reboot NODES (a hostlist) or every --pending node, re-validate, resume on a pass.

    Only nodes gpuforge drained with a reset_gpu or reboot reason and that run no job are
    touched; inspect goes straight to RMA, and so do nodes whose last two remediations within a
    week failed or did not hold.
    Exit 0 nothing failed; 1 a node failed or went to RMA; 2 a re-validation was inconclusive.
    """
    if bool(nodes) == pending:
        raise InputError("give NODES (a hostlist) or --pending, not both and not neither")
    named = control.expand_nodes(nodes) if nodes else None
    ctx, wiring = _context(cluster, inventory, state_dir, need_slurm=True)
    slurm = _slurm(wiring)
    policy = rem.Policy(failures=failures, window_s=window_days * 86400)
    cluster_reports = report_dir / ctx.name
    run_dir = cluster_reports / f"remediate-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}"
    with ExitStack() as stack:
        # A dry run writes nothing, not even an empty record: it reads the history if there is one.
        scratch = (
            state_paths(Path(stack.enter_context(TemporaryDirectory())), ctx.name)
            if dry_run
            else ctx.state
        )
        history_file = ctx.state.history_db
        if dry_run and not history_file.is_file():
            history_file = scratch.history_db
        history = stack.enter_context(closing(HistoryStore.open(history_file)))
        remediator = rem.Remediator(
            admission=ctx.admission(slurm, rem.SOURCE, state=scratch),
            history=history,
            act=rem.ansible_act(ctx.path, run_dir, ctx.state.play_record),
            validate=rem.pipeline_validate(wiring, run_dir, gpu_burn_seconds, int(dcgm_level)),
            bundle=rem.rma_bundle(
                rem.bundle_inputs(wiring, history, cluster_reports), cluster_reports
            ),
            population=ctx.view.gpu_nodes,
            policy=policy,
        )
        outcomes = rem.remediate(remediator, named, dry_run=dry_run, lock_path=ctx.state.lock)
    _report(outcomes, dry_run=dry_run, as_json=as_json)
    raise SystemExit(rem.exit_code(outcomes))


def _report(outcomes: Sequence[rem.RemediationOutcome], *, dry_run: bool, as_json: bool) -> None:
    if as_json:
        echo_json({"dry_run": dry_run, "nodes": [o.to_dict() for o in outcomes]})
        return
    console = Console(soft_wrap=True)
    if not outcomes:
        console.print("nothing to remediate: no idle node is drained by gpuforge for it")
        return
    table = Table(title="gpuforge remediate" + (" (dry run: nothing changed)" if dry_run else ""))
    for col in ("node", "result", "reason", "failures", "detail", "slurm"):
        table.add_column(col)
    style = {"resumed": "green", "failed": "red", "escalated": "red", "held": "magenta"}
    for o in outcomes:
        colour = style.get(o.result, "")
        table.add_row(
            o.node,
            f"[{colour}]{o.result}[/]" if colour else o.result,
            f"{o.check}:{o.action}" if o.check else "",
            str(o.failures) if o.check else "",
            o.detail + (f" (bundle {o.bundle})" if o.bundle else ""),
            o.slurm,
        )
    console.print(table)


# -- rma -----------------------------------------------------------------------------------------


@click.group("rma")
def rma_group() -> None:
    """RMA evidence bundles, and the record of a part leaving and coming back."""


@rma_group.command("bundle")
@click.argument("node")
@cluster_option
@inventory_option
@state_option
@report_option
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for the archive and its manifest (default: <report-dir>/<cluster>/rma).",
)
@click.option("--check", default="", help="The failing check (default: the node's last one).")
@json_option
def bundle_cmd(
    *,
    node: str,
    cluster: str | None,
    inventory: Path | None,
    state_dir: Path,
    report_dir: Path,
    out: Path | None,
    check: str,
    as_json: bool,
) -> None:
    """Write NODE's evidence bundle: one tar.gz and its JSON manifest beside it."""
    ctx, wiring = _context(cluster, inventory, state_dir)
    ctx.view.node(node)  # InputError for a node the inventory does not have
    with closing(_history(ctx)) as history:
        inputs = rem.bundle_inputs(wiring, history, report_dir / ctx.name)
        written = rma.build_bundle(node, out or report_dir / ctx.name / "rma", inputs, check=check)
    if as_json:
        echo_json(
            {
                "archive": str(written.archive),
                "manifest": str(written.manifest_path),
                **written.manifest,
            }
        )
        return
    click.echo(f"{node}: {written.archive} (manifest {written.manifest_path})")
    for error in written.manifest["errors"]:
        click.echo(f"  not collected: {error}", err=True)


def _admission(
    cluster: str | None, inventory: Path | None, state_dir: Path
) -> tuple[ClusterContext, Admission]:
    ctx, wiring = _context(cluster, inventory, state_dir, need_slurm=True)
    return ctx, ctx.admission(_slurm(wiring), rem.SOURCE)


@rma_group.command("out")
@click.argument("node")
@click.option("--ticket", required=True, help="The RMA ticket (the vendor's case number).")
@cluster_option
@inventory_option
@state_option
def out_cmd(
    *, node: str, ticket: str, cluster: str | None, inventory: Path | None, state_dir: Path
) -> None:
    """Record that NODE's part left for repair under TICKET (the node stays drained)."""
    ctx, admission = _admission(cluster, inventory, state_dir)
    with closing(_history(ctx)) as history:
        reason = rma.mark_out(admission, history, node, ticket)
    click.echo(f"{node}: part out under ticket {ticket}; stays drained ({reason})")


@rma_group.command("back")
@click.argument("node")
@cluster_option
@inventory_option
@state_option
@json_option
def back_cmd(
    *, node: str, cluster: str | None, inventory: Path | None, state_dir: Path, as_json: bool
) -> None:
    """Record that NODE's part is back: drained for validation, like a node that joins."""
    ctx, admission = _admission(cluster, inventory, state_dir)
    with closing(_history(ctx)) as history:
        action = rma.mark_back(admission, history, node)
    if as_json:
        echo_json(action.to_dict())
        return
    if action.action == "drain":
        click.echo(
            f"{node}: part back; drained {action.reason}: validate it like a new node "
            f"(gpuforge deploy SPEC --phase N --only {node} --redo, or gpuforge validate --drain "
            f"--level full --limit {node})"
        )
    else:
        click.echo(f"{node}: part back; left as it is: {action.detail}")
