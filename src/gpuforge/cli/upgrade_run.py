"""``gpuforge upgrade run SPEC``: move the live cluster to SPEC's pins, wave by wave, resumably.

The engine is :mod:`gpuforge.upgrade.run`; this module wires it to the inventory, Slurm on the
controller, Ansible and the validators, as ``gpuforge deploy`` does. Registered in the ``upgrade``
group by :mod:`gpuforge.cli`.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from gpuforge.cli import deploy as deploy_cli
from gpuforge.cli.common import (
    echo_json,
    interruptible,
    inventory_option,
    json_option,
    report_dir_option,
    state_option,
)
from gpuforge.cli.context import spec_context
from gpuforge.cli.upgrade import build_plan, limits_options, query_inventory, spec_argument
from gpuforge.errors import InputError
from gpuforge.rollout.deploy import LEVELS
from gpuforge.rollout.steps import ansible_steps
from gpuforge.topology import load_cluster
from gpuforge.upgrade.run import (
    POLICIES,
    UpgradeOutcome,
    UpgradeRequest,
    require_generated_pins,
    run_upgrade,
)
from gpuforge.upgrade.steps import AnsibleUpgradeSteps


@click.command("run")
@spec_argument
@inventory_option
@state_option
@click.option(
    "--level",
    type=click.Choice(LEVELS),
    default="quick",
    show_default=True,
    help="Re-validation of each upgraded node before it is resumed.",
)
@click.option(
    "--drain-deadline",
    type=click.FloatRange(0.0, 7 * 86400.0),
    default=3600.0,
    show_default=True,
    help="Seconds to wait for a drained node's running jobs before --on-deadline applies.",
)
@click.option(
    "--on-deadline",
    type=click.Choice(POLICIES),
    default="wait",
    show_default=True,
    help="wait: keep waiting; requeue: requeue the jobs still running; skip: lift the drain.",
)
@click.option(
    "--poll",
    type=click.FloatRange(0.5, 600.0),
    default=10.0,
    show_default=True,
    help="Seconds between looks at the drained nodes' jobs.",
)
@click.option(
    "--query-timeout",
    type=click.FloatRange(1.0, 600.0),
    default=30.0,
    show_default=True,
    help="Seconds each node may take to report its versions.",
)
@limits_options
@report_dir_option("Where each wave's validation reports go (one folder per wave).")
@json_option
def run_command(  # noqa: PLR0917 - click passes one parameter per option
    spec: Path,
    inventory: Path | None,
    state_dir: Path,
    level: str,
    drain_deadline: float,
    on_deadline: str,
    poll: float,
    query_timeout: float,
    max_per_leaf: int | None,
    max_fraction: float | None,
    report_dir: Path,
    as_json: bool,
) -> None:
    """Upgrade (or roll back) SPEC's GPU nodes to its pins: drain, apply, reboot, validate."""
    cluster = load_cluster(spec)  # incompatible pins: refused here, before anything runs
    ctx = spec_context(cluster.name, inventory, state_dir)
    controllers = [n.hostname for n in cluster.by_role("controller")]
    if not controllers:
        raise InputError(f"{spec}: {cluster.name} has no Slurm controller node group")
    require_generated_pins(cluster, ctx.path, spec)
    installed = query_inventory(ctx.path, query_timeout)
    plan = build_plan(
        spec, state_dir, max_per_leaf=max_per_leaf, max_fraction=max_fraction, installed=installed
    )
    run_dir = report_dir / cluster.name / f"upgrade-{time.strftime('%Y%m%dT%H%M%S')}"
    store, lock = deploy_cli.store_and_lock(ctx)
    deploy_steps = ansible_steps(
        ctx.path,
        ctx.admission(ctx.slurm(controllers[0]), "upgrade"),
        run_dir,
        store,
        lock,
        reservation=f"gpuforge_{cluster.name}_upgrade",
    )
    request = UpgradeRequest(
        plan=plan,
        phase_of={h: p.number for p in cluster.phases for h in p.hosts},
        gate_fraction={p.number: p.min_pass_fraction for p in cluster.phases},
        level=level,
        drain_deadline_s=drain_deadline,
        policy=on_deadline,
        poll_s=poll,
    )

    def say(message: str) -> None:
        click.echo(f"{time.strftime('%H:%M:%S')} {message}", err=as_json)

    say(
        f"{len(plan.steps)} node(s) to change in {len(plan.waves)} wave(s), "
        f"{len(plan.up_to_date)} up to date"
    )
    with interruptible():
        outcome = run_upgrade(
            store, AnsibleUpgradeSteps(deploy_steps), request, lock_path=lock, on_event=say
        )
    _report(outcome, as_json)
    raise SystemExit(0 if outcome.passed else 1)


def _report(outcome: UpgradeOutcome, as_json: bool) -> None:
    if as_json:
        echo_json(
            {
                "upgrade": outcome.upgrade,
                "run": outcome.run_id,
                "status": outcome.status,
                "notes": outcome.notes,
                "waves": [
                    {
                        "wave": w.number,
                        "nodes": list(w.nodes),
                        "done": w.done,
                        "quarantined": w.quarantined,
                        "skipped": w.skipped,
                        "passed": w.passed,
                        "seconds": round(w.seconds, 1),
                        "detail": w.detail,
                    }
                    for w in outcome.waves
                ],
            }
        )
        return
    for note in outcome.notes:
        click.echo(f"note: {note}")
    for w in outcome.waves:
        click.echo(f"wave {w.number} ({w.seconds:.0f}s): {w.detail}")
    click.echo(f"upgrade {outcome.upgrade}: {outcome.status}")
