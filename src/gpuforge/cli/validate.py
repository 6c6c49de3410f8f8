"""``gpuforge validate``: acceptance suite, burn-in and NCCL tests of GPU nodes, then verdicts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click
import hostlist
from rich.console import Console
from rich.table import Table

from gpuforge.cli.common import cluster_option, inventory_option, report_dir_option, state_option
from gpuforge.cli.context import cluster_context, cluster_root
from gpuforge.errors import InputError
from gpuforge.rollout.validation import validate_and_admit
from gpuforge.slurm.control import NodeAction
from gpuforge.validate import pipeline
from gpuforge.validate.pipeline import wire
from gpuforge.validate.report import write_reports
from gpuforge.validate.result import BatchSummary, Level, Verdict


def _table(summary: BatchSummary, actions: Sequence[NodeAction]) -> Table:
    """Quarantined and held nodes one row each, first; admitted ones folded (a batch may hold a
    thousand): one row per set of warnings and Slurm action, the nodes as a hostlist."""
    acted = {a.node: a for a in actions}
    table = Table(title=f"gpuforge validate ({summary.level.value})")
    for col in ("node", "verdict", "reasons", "warnings", "slurm"):
        table.add_column(col)
    style = {Verdict.ADMIT: "green", Verdict.QUARANTINE: "red", Verdict.HOLD: "magenta"}

    def slurm(node: str) -> str:
        a = acted.get(node)
        return f"{a.action}: {a.detail}" if a else ""

    for verdict in (Verdict.QUARANTINE, Verdict.HOLD):
        for n in summary.by_verdict(verdict):
            table.add_row(
                n.node,
                f"[{style[verdict]}]{verdict.value}[/]",
                ", ".join(n.reasons),
                ", ".join(n.warnings),
                slurm(n.node),
            )
    folded: dict[tuple[str, str], list[str]] = {}
    for n in summary.by_verdict(Verdict.ADMIT):
        folded.setdefault((", ".join(n.warnings), slurm(n.node)), []).append(n.node)
    for (warnings, action), nodes in folded.items():
        name = nodes[0] if len(nodes) == 1 else f"{hostlist.collect_hostlist(nodes)} ({len(nodes)})"
        table.add_row(name, f"[{style[Verdict.ADMIT]}]admit[/]", "", warnings, action)
    return table


@click.command("validate")
@inventory_option
@cluster_option
@click.option("--limit", help="GPU nodes to validate, as a hostlist (gpu[001-016]).")
@click.option("--phase", type=int, help="Validate the GPU nodes of this rollout phase.")
@click.option(
    "--level",
    type=click.Choice([t.value for t in Level]),
    default=Level.QUICK.value,
    show_default=True,
    help="quick: acceptance suite; burnin: + dcgm/gpu-burn/ib_write_bw; full: + NCCL acceptance.",
)
@click.option(
    "--drain",
    is_flag=True,
    help="Drain failing nodes and resume passing ones gpuforge drained (docs/slurm.md).",
)
@report_dir_option(
    "Where validation.json, junit.xml and report.html go.", default=Path("build/validate")
)
@click.option("--gpu-burn-seconds", type=int, default=300, show_default=True)
@click.option(
    "--dcgm-level",
    type=click.Choice(["2", "3"]),
    default="3",
    show_default=True,
    help="3 for new or repaired nodes (the rollout); 2 for periodic rechecks.",
)
@click.option(
    "--reservation",
    default="gpuforge_validate",
    show_default=True,
    help="Level full: the maintenance reservation the NCCL jobs run in, made for the run over the "
    "nodes (drained ones resumed inside it, drained again after) and deleted at the end.",
)
@state_option
def validate(
    *,
    inventory: Path | None,
    cluster: str | None,
    limit: str | None,
    phase: int | None,
    level: str,
    drain: bool,
    report_dir: Path,
    gpu_burn_seconds: int,
    dcgm_level: str,
    reservation: str,
    state_dir: Path,
) -> None:
    """Validate GPU nodes and decide admit / quarantine / hold for each.

    Exit 0 every node admitted; 1 a node failed (or the fabric has a finding); 2 the
    validation could not run or left nodes inconclusive (held, never drained).
    """
    if limit and phase is not None:
        raise InputError("give --limit or --phase, not both")
    multinode = Level(level) is Level.FULL
    wiring = wire(cluster_root(cluster, inventory), need_slurm=drain or multinode)
    ctx = cluster_context(cluster, inventory, state_dir, view=wiring.view)
    hosts = ctx.view.select(limit=limit, phase=phase)
    opts = pipeline.ValidationOptions(
        level=Level(level),
        gpu_burn_seconds=gpu_burn_seconds,
        dcgm_level=int(dcgm_level),
        reservation=reservation if multinode else None,
        work_dir=report_dir,
    )
    adm = ctx.admission(wiring.slurm, "validate") if wiring.slurm is not None else None
    summary, actions = validate_and_admit(ctx.view, hosts, opts, wiring.deps, adm, drain=drain)
    paths = write_reports(summary, report_dir, actions=[a.to_dict() for a in actions])
    console = Console(stderr=False, soft_wrap=True)
    console.print(_table(summary, actions))
    for f in summary.findings:
        console.print(f"[red]fabric[/] {f.kind} {f.subject}: {f.detail}")
    for note in summary.notes():
        console.print(f"[cyan]note[/] {note['check']} on {note['nodes']}: {note['message']}")
    held = summary.by_verdict(Verdict.HOLD)
    if held and drain:
        console.print(
            f"[magenta]{len(held)} node(s) held: results inconclusive, not drained "
            "and not resumed[/]"
        )
    if summary.fatal:
        console.print(f"[red]validation could not run:[/] {summary.fatal}")
    counts = summary.counts()
    console.print(
        f"admit {counts['admit']}, quarantine {counts['quarantine']}, hold {counts['hold']}; "
        f"reports: {paths['json']}, {paths['junit']}, {paths['html']}"
    )
    raise SystemExit(summary.exit_code)
