"""``gpuforge upgrade``: rolling upgrades of a live cluster (``plan``; ``run`` joins the group).

``upgrade plan SPEC`` loads the spec with the new pins (an incompatible set is refused by the
spec check, exit 2), reads what every GPU node has from the cluster's history store (or, with
``--inventory DIR``, asks the nodes over SSH) and prints the waves (docs/upgrades.md).
"""

from __future__ import annotations

from pathlib import Path

import click

from gpuforge.cli.common import (
    echo_json,
    inventory_option,
    json_option,
    max_fraction_option,
    state_option,
)
from gpuforge.cli.context import state_paths
from gpuforge.command import SshRunner
from gpuforge.errors import InputError
from gpuforge.history.store import HistoryStore
from gpuforge.inventory.reader import ClusterView
from gpuforge.ssh import SshTarget
from gpuforge.topology import load_cluster
from gpuforge.topology.cluster import compress
from gpuforge.topology.spec_rules import compat_warnings
from gpuforge.upgrade.plan import (
    Installed,
    Limits,
    UpgradePlan,
    installed_from_history,
    plan_upgrade,
    render_text,
)
from gpuforge.upgrade.query import query_installed

spec_argument = click.argument("spec", type=click.Path(path_type=Path, dir_okay=False))


@click.group("upgrade")
def upgrade() -> None:
    """Move a live cluster to the versions pinned in its spec, wave by wave."""


def limits_options(func: click.decorators.FC) -> click.decorators.FC:
    """``--max-per-leaf`` and ``--max-fraction``, overriding the spec's ``upgrade:`` section."""
    func = max_fraction_option(
        "Share of the partition's GPUs out at once (default: spec upgrade.max_fraction).",
        default=None,
    )(func)
    return click.option(
        "--max-per-leaf",
        type=click.IntRange(1, 100_000),
        help="Units out at once under one leaf switch (default: spec upgrade.max_per_leaf).",
    )(func)


def build_plan(
    spec: Path,
    state_dir: Path,
    *,
    max_per_leaf: int | None = None,
    max_fraction: float | None = None,
    installed: dict[str, Installed] | None = None,
) -> UpgradePlan:
    """Load ``spec`` and plan it against the history store under ``state_dir``.

    ``installed`` replaces the store (a quick query, a test). A missing store is an error:
    without it every node would be planned as unknown.
    """
    cluster = load_cluster(spec)
    for warning in compat_warnings(cluster.spec):
        click.echo(f"warning: {spec}: versions: {warning}", err=True)
    if installed is None:
        path = state_paths(state_dir, cluster.name).history_db
        if not path.exists():
            raise InputError(
                f"{path}: no history store for cluster {cluster.name}: the plan needs the "
                "nodes' records (run the collector, `gpuforge health serve`), or --state-dir"
            )
        with HistoryStore.open(path, create=False) as store:
            installed = installed_from_history(store)
    settings = cluster.spec.upgrade
    limits = Limits(
        max_per_leaf if max_per_leaf is not None else settings.max_per_leaf,
        max_fraction if max_fraction is not None else settings.max_fraction,
    )
    return plan_upgrade(cluster, installed, limits)


def query_inventory(inventory: Path, timeout: float) -> dict[str, Installed]:
    """Ask every GPU node of the cluster directory ``inventory`` over SSH (docs/upgrades.md)."""
    view = ClusterView.load(inventory)
    meta = view.all_hostvars()
    runner = SshRunner({h: SshTarget.from_hostvars(h, v) for h, v in meta.items()})
    found, silent = query_installed(runner, view.gpu_nodes, timeout=timeout)
    if silent:
        click.echo(
            f"warning: no answer within {timeout:g}s from {compress(silent)} ({len(silent)}): "
            "planned as unknown",
            err=True,
        )
    return found


@upgrade.command("plan")
@spec_argument
@state_option
@inventory_option
@click.option(
    "--query-timeout",
    type=click.FloatRange(1.0, 600.0),
    default=30.0,
    show_default=True,
    help="Seconds each node may take to answer --inventory's query.",
)
@limits_options
@json_option
def plan_command(  # noqa: PLR0917 - click passes one parameter per option
    spec: Path,
    state_dir: Path,
    inventory: Path | None,
    query_timeout: float,
    max_per_leaf: int | None,
    max_fraction: float | None,
    as_json: bool,
) -> None:
    """Print the waves that move SPEC's GPU nodes to its pinned versions.

    The versions each node has come from the cluster's history store, or, with --inventory, from
    the nodes of that cluster directory asked over SSH.
    """
    installed = query_inventory(inventory, query_timeout) if inventory is not None else None
    result = build_plan(
        spec,
        state_dir,
        max_per_leaf=max_per_leaf,
        max_fraction=max_fraction,
        installed=installed,
    )
    if as_json:
        echo_json(result.to_dict())
    else:
        click.echo("\n".join(render_text(result)))
