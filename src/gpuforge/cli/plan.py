"""``gpuforge plan``: the rollout phases of a spec, their nodes and gates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gpuforge.cli.common import echo_json, json_option
from gpuforge.cli.topology import spec_argument
from gpuforge.inventory.render import phase_group
from gpuforge.topology import Cluster, load_cluster
from gpuforge.topology.cluster import compress


def phase_rows(cluster: Cluster) -> list[dict[str, Any]]:
    """One row per phase; service nodes (controller, login, storage) go with phase 1."""
    service = [n.hostname for n in cluster.nodes if n.role != "gpu"]
    rows = []
    for phase in cluster.phases:
        rows.append(
            {
                "phase": phase.number,
                "name": phase.name,
                "group": phase_group(phase.number),
                "gpu_nodes": len(phase.hosts),
                "hosts": phase.hostlist,
                "service_nodes": service if phase.number == 1 else [],
                "min_pass_fraction": phase.min_pass_fraction,
                "required_passes": phase.required_passes,
            }
        )
    return rows


@click.command()
@spec_argument
@json_option
def plan(spec: Path, as_json: bool) -> None:
    """Print the rollout phases of SPEC with their node ranges and gates."""
    cluster = load_cluster(spec)
    rows = phase_rows(cluster)
    if as_json:
        echo_json({"cluster": cluster.name, "phases": rows})
        return
    click.echo(f"{'phase':<10}{'name':<14}{'nodes':>7}  {'gate':<18}hosts")
    for row in rows:
        gate = f">= {row['required_passes']} pass ({row['min_pass_fraction']:.0%})"
        hosts = row["hosts"]
        if row["service_nodes"]:
            hosts += f" + service {compress(row['service_nodes'])}"
        click.echo(f"{row['group']:<10}{row['name']:<14}{row['gpu_nodes']:>7,}  {gate:<18}{hosts}")
