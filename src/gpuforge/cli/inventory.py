"""``gpuforge inventory``: the Ansible inventory and Slurm files of a spec."""

from __future__ import annotations

from pathlib import Path

import click

from gpuforge.cli.topology import spec_argument
from gpuforge.generate import write_cluster_inventory
from gpuforge.inventory.reader import GENERATED, SITE
from gpuforge.topology import load_cluster


@click.group()
def inventory() -> None:
    """Generate inventories from topology specs."""


@inventory.command()
@spec_argument
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Cluster directory (default: inventory/<cluster>). Its generated/ is replaced as a "
    "whole, atomically, and only when gpuforge wrote it; site/ is created once, never replaced.",
)
def generate(spec: Path, out_dir: Path | None) -> None:
    """Write the generated layer of SPEC's inventory and create its site layer once.

    generated/ holds the inventory, Slurm files, /etc/hosts fragment and topology.json; site/
    starts as a copy of inventory/sample/site for the site's connection settings, mirror and
    overrides.
    """
    cluster = load_cluster(spec)
    root = out_dir if out_dir is not None else Path("inventory") / cluster.name
    result = write_cluster_inventory(cluster, root, protect=(spec,))
    gpu = sum(1 for n in cluster.nodes if n.role == "gpu")
    click.echo(
        f"wrote {len(result.files)} files to {root / GENERATED}: {len(cluster.nodes):,} hosts "
        f"({gpu:,} GPU nodes), {len(cluster.phases)} phases"
    )
    if result.site_created:
        click.echo(f"created {root / SITE} from the sample: set the connection settings there")
    else:
        click.echo(f"kept {root / SITE}")
