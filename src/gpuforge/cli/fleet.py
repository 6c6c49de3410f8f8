"""``gpuforge fleet``: the fleet as a whole (status; more commands add themselves here).

A command of another module joins the group with one line at the end of this file,
``fleet.add_command(module.command)``; :func:`load_status` gives any of them the same
:class:`~gpuforge.health.fleet.FleetStatus` that ``fleet status`` prints.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import click
import hostlist

from gpuforge.cli import fleet_risk
from gpuforge.cli.common import (
    cluster_argument,
    echo_json,
    inventory_option,
    json_option,
    on_services_host,
    state_option,
    via_option,
)
from gpuforge.cli.context import ClusterContext, cluster_context, slurm_client
from gpuforge.health import fleet_html
from gpuforge.health.fleet import (
    DEFAULT_INTERVAL_S,
    NO_RECORD,
    STALE_AFTER,
    FleetStatus,
    NodeStatus,
    fleet_status,
)
from gpuforge.history.store import HistoryStore
from gpuforge.slurm import control


def load_status(
    ctx: ClusterContext,
    *,
    via: str | None,
    read_slurm: bool = True,
    interval_s: float = DEFAULT_INTERVAL_S,
    tier: str | None = "passive",
) -> FleetStatus:
    """The fleet status of the cluster ``ctx``: the store plus one scontrol call."""
    nodes = control.node_states(slurm_client(via, ctx.path)) if read_slurm else None
    with HistoryStore.open(ctx.state.history_db, create=False) as store:
        return fleet_status(
            ctx.fleet,
            store,
            nodes,
            now=time.time(),
            tier=tier,
            interval_s=interval_s,
            stale_after=STALE_AFTER,
        )


def _hosts(names: Sequence[str]) -> str:
    return f"{hostlist.collect_hostlist(list(names))} ({len(names)})" if names else "-"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def render_text(status: FleetStatus, limit: int) -> list[str]:
    """Grouped lines: counts, hostlists, and at most ``limit`` failing nodes one per line."""
    total = len(status.nodes)
    verdicts = status.by_verdict()
    counts = "  ".join(f"{v} {len(n)}" for v, n in verdicts.items() if v != NO_RECORD)
    lines = [
        f"{status.cluster}: {total} GPU nodes, interval {status.interval_s:.0f}s",
        f"verdict   {counts}  no record {len(verdicts[NO_RECORD])}",
    ]
    for action, nodes in sorted(status.by_action().items()):
        lines.append(f"action    {action:<10} {_hosts(nodes)}")
    if status.slurm_read:
        drained = status.drained()
        lines.append(f"drained   by gpuforge {_hosts(drained['gpuforge'])}")
        lines.append(f"          by operators {_hosts(drained['operator'])}")
    else:
        lines.append("drained   (Slurm not read)")
    lines.append(
        f"stale     {_hosts(status.stale)} (no record received for {STALE_AFTER} intervals, "
        "or never)"
    )
    ages = sorted((n for n in status.nodes if n.age_s is not None), key=lambda n: n.age_s or 0)
    if ages:
        mid = ages[len(ages) // 2]
        lines.append(
            f"age       newest {_age(ages[0].age_s)}, median {_age(mid.age_s)}, "
            f"oldest {_age(ages[-1].age_s)} ({ages[-1].node})"
        )
    bad = [n for n in status.nodes if n.verdict in ("fail", "error")]
    bad.sort(key=lambda n: (n.verdict != "fail", n.node))
    for n in bad[:limit]:
        lines.append(_node_line(n))
    if len(bad) > limit:
        lines.append(f"... {len(bad) - limit} more failing or erroring nodes (--limit, --json)")
    return lines


def _node_line(n: NodeStatus) -> str:
    slurm = f"  {n.slurm_state}" if n.slurm_state else ""
    reason = f" {n.reason}" if n.reason else ""
    return f"  {n.node:<12} {n.verdict:<5} {_age(n.age_s):>5} ago  {n.checks}{slurm}{reason}"


@click.group("fleet")
def fleet() -> None:
    """The fleet as a whole: health status (and telemetry export, risk)."""


@fleet.command("status")
@on_services_host(local_files=("html_path",))
@cluster_argument
@inventory_option
@via_option
@state_option
@click.option("--no-slurm", is_flag=True, help="Do not read Slurm (no drained-by counts).")
@click.option(
    "--interval",
    type=click.FloatRange(min=1),
    default=DEFAULT_INTERVAL_S,
    show_default=True,
    help="Seconds between two passive records of a node (HealthCheckInterval).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="Failing nodes listed one per line.",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Also write the rack/leaf heat map page (self-contained HTML) to this file.",
)
@click.option(
    "--prometheus",
    metavar="URL",
    help="Prometheus to read rack power vs budget from, for --html (e.g. http://ctl01:9090).",
)
@json_option
def status_cmd(  # noqa: PLR0917 - one parameter per CLI option
    cluster: str | None,
    inventory: Path | None,
    via: str | None,
    state_dir: Path,
    no_slurm: bool,
    interval: float,
    limit: int,
    html_path: Path | None,
    prometheus: str | None,
    as_json: bool,
) -> None:
    """Nodes by verdict and action, drained by gpuforge or operators, stale nodes."""
    ctx = cluster_context(cluster, inventory, state_dir)
    status = load_status(ctx, via=via, read_slurm=not no_slurm, interval_s=interval)
    if html_path is not None:
        fleet_html.write_page(html_path, status, ctx.fleet, prometheus)
    if as_json:
        echo_json(status.to_dict())
        return
    for line in render_text(status, limit):
        click.echo(line)


fleet.add_command(fleet_risk.export_telemetry)
fleet.add_command(fleet_risk.export_history)
fleet.add_command(fleet_risk.risk)
