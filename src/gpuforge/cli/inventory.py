"""``gpuforge inventory``: the Ansible inventory and Slurm files of a spec."""

from __future__ import annotations

from pathlib import Path

import click

from gpuforge.cli.topology import spec_argument
from gpuforge.inventory.render import write_inventory
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
    required=True,
    help="Inventory directory to write (replaced as a whole, atomically).",
)
def generate(spec: Path, out_dir: Path) -> None:
    """Write the inventory, Slurm files, /etc/hosts fragment and topology.json of SPEC."""
    cluster = load_cluster(spec)
    files = write_inventory(cluster, out_dir)
    gpu = sum(1 for n in cluster.nodes if n.role == "gpu")
    click.echo(
        f"wrote {len(files)} files to {out_dir}: {len(cluster.nodes):,} hosts "
        f"({gpu:,} GPU nodes), {len(cluster.phases)} phases"
    )
