"""``gpuforge remediate`` and ``gpuforge rma``: fix drained nodes, or send their part back.

``remediate`` resets the GPUs of, or reboots, the idle nodes gpuforge drained for it, re-validates
them at level burnin and admits them (:mod:`gpuforge.health.remediate`); ``rma`` writes the
evidence bundle and records a part leaving and returning (:mod:`gpuforge.health.rma`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from contextlib import ExitStack, closing
from pathlib import Path
from tempfile import TemporaryDirectory

import click
from rich.console import Console
from rich.table import Table

from gpuforge.admission import Admission, AdmissionRecord, record_path
from gpuforge.cli.common import echo_json, json_option, state_option
from gpuforge.cli.health import cluster_dir
from gpuforge.errors import InputError
from gpuforge.health import remediate as rem
from gpuforge.health import rma
from gpuforge.history import HistoryStore, history_path
from gpuforge.inventory.reader import InventoryDir
from gpuforge.playbook import run_playbook
from gpuforge.rollout.lock import cluster_lock, play_record
from gpuforge.slurm import control
from gpuforge.validate import pipeline
from gpuforge.validate.report import write_reports
from gpuforge.validate.result import BatchSummary, Tier

#: Seconds the remediation play may run per node batch (a reboot waits up to 30 minutes).
PLAY_TIMEOUT_S = 3600

inventory_option = click.option(
    "--inventory",
    "inventory",
    type=click.Path(file_okay=False, path_type=Path),
    help="Cluster directory: generated/ and site/ (a lab's: .lab/<lab>/inventory); "
    "default inventory/CLUSTER.",
)
cluster_option = click.option("--cluster", help="Cluster name: its directory is inventory/CLUSTER.")
report_option = click.option(
    "--report-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("reports"),
    show_default=True,
    help="Reports go under <report-dir>/<cluster>/: remediate-<time>/ (validation, Ansible "
    "events) and rma/ (evidence bundles); validation.json files there feed the bundles.",
)


def _cluster(wiring: pipeline.Wiring) -> str:
    return str(wiring.view.topology.get("name") or "cluster")


def _history(state_dir: Path, cluster: str) -> HistoryStore:
    return HistoryStore.open(history_path(state_dir, cluster))


def _bundle_inputs(
    wiring: pipeline.Wiring, history: HistoryStore, report_dir: Path, cluster: str
) -> rma.BundleInputs:
    return rma.BundleInputs(
        runner=wiring.deps.runner,
        history=history,
        report_dirs=(report_dir / cluster, Path("build") / "validate"),
    )


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
    inventory = cluster_dir(cluster, inventory)
    wiring = pipeline.wire(inventory, need_slurm=True)
    if wiring.slurm is None:  # need_slurm=True always wires one
        raise InputError(f"{inventory}: no Slurm controller to reach")
    name = _cluster(wiring)
    policy = rem.Policy(failures=failures, window_s=window_days * 86400)
    run_dir = report_dir / name / f"remediate-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}"
    lock = state_dir / name / "rollout.lock"
    with ExitStack() as stack:
        # A dry run writes nothing, not even an empty record: it reads the history if there is one.
        scratch = Path(stack.enter_context(TemporaryDirectory())) if dry_run else state_dir
        history_file = history_path(state_dir, name)
        if dry_run and not history_file.is_file():
            history_file = history_path(scratch, name)
        history = stack.enter_context(closing(HistoryStore.open(history_file)))
        admission = Admission(
            wiring.slurm, AdmissionRecord(record_path(scratch, name)), source=rem.SOURCE
        )
        remediator = rem.Remediator(
            admission=admission,
            history=history,
            act=_act(inventory, run_dir, play_record(lock)),
            validate=_validate(wiring, run_dir, gpu_burn_seconds, int(dcgm_level)),
            bundle=_bundle(_bundle_inputs(wiring, history, report_dir, name), report_dir / name),
            population=wiring.view.gpu_nodes,
            policy=policy,
        )
        candidates, skipped = rem.candidates_now(admission, named)
        if dry_run:
            outcomes = remediator.plan(candidates)
        else:
            with cluster_lock(lock, "remediate"):
                outcomes = remediator.run(candidates)
    _report([*outcomes, *skipped], dry_run=dry_run, as_json=as_json)
    results = {o.result for o in outcomes}
    if results & {"failed", "escalated"}:
        raise SystemExit(1)
    raise SystemExit(2 if "held" in results else 0)


def _act(inventory: Path, run_dir: Path, record: Path) -> rem.ActFn:
    def act(nodes: Sequence[str], action: str) -> Mapping[str, str]:
        result = run_playbook(
            "remediate.yml",
            InventoryDir.open(inventory).sources,
            limit=",".join(nodes),
            extravars={"remediate_action": action},
            artifact_dir=run_dir / "ansible" / action,
            timeout_s=PLAY_TIMEOUT_S,
            play_record=record,
        )
        errors = dict(result.failed)
        errors.update({h: f"unreachable: {m}" for h, m in result.unreachable.items()})
        for node in nodes:
            if node not in result.hosts and node not in errors:
                errors[node] = f"the play never reached it ({result.status}, rc {result.rc})"
        return errors

    return act


def _validate(
    wiring: pipeline.Wiring, run_dir: Path, gpu_burn_seconds: int, dcgm_level: int
) -> rem.ValidateFn:
    def validate(nodes: Sequence[str], partners: Sequence[str]) -> BatchSummary:
        opts = pipeline.Options(
            level=Tier.BURNIN,
            gpu_burn_seconds=gpu_burn_seconds,
            dcgm_level=dcgm_level,
            work_dir=run_dir / "validation",
        )
        summary = pipeline.run_validation(
            wiring.view, list(nodes), opts, wiring.deps, known_good=partners
        )
        write_reports(summary, run_dir / "validation", extra={"remediation": True})
        return summary

    return validate


def _bundle(inputs: rma.BundleInputs, cluster_reports: Path) -> rem.BundleFn:
    def bundle(node: str, check: str, why: str) -> Path:
        inputs.errors.clear()
        return rma.build_bundle(node, cluster_reports / "rma", inputs, check=check, why=why).archive

    return bundle


def _report(outcomes: Sequence[rem.Outcome], *, dry_run: bool, as_json: bool) -> None:
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
    wiring = pipeline.wire(cluster_dir(cluster, inventory))
    wiring.view.node(node)  # InputError for a node the inventory does not have
    name = _cluster(wiring)
    with closing(_history(state_dir, name)) as history:
        inputs = _bundle_inputs(wiring, history, report_dir, name)
        written = rma.build_bundle(node, out or report_dir / name / "rma", inputs, check=check)
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
) -> tuple[Admission, str]:
    root = cluster_dir(cluster, inventory)
    wiring = pipeline.wire(root, need_slurm=True)
    if wiring.slurm is None:
        raise InputError(f"{root}: no Slurm controller to reach")
    name = _cluster(wiring)
    record = AdmissionRecord(record_path(state_dir, name))
    return Admission(wiring.slurm, record, source=rem.SOURCE), name


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
    admission, name = _admission(cluster, inventory, state_dir)
    with closing(_history(state_dir, name)) as history:
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
    admission, name = _admission(cluster, inventory, state_dir)
    with closing(_history(state_dir, name)) as history:
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
