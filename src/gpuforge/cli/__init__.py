"""The ``gpuforge`` command line: one module per command group, wired here."""

from __future__ import annotations

import sys
from typing import Any

import click

from gpuforge import __version__
from gpuforge.cli import deploy, inventory, lab, parse, plan, slurm, topology, validate
from gpuforge.errors import GpuforgeError


class _Root(click.Group):
    """Maps gpuforge's exceptions to exit codes (0 ok, 1 failed, 2 bad input)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GpuforgeError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)


@click.group(cls=_Root, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuforge")
def main() -> None:
    """Build and keep healthy GPU clusters from one topology spec."""


main.add_command(topology.topology)
main.add_command(inventory.inventory)
main.add_command(plan.plan)
main.add_command(lab.lab)
main.add_command(slurm.slurm_group)
main.add_command(parse.parse)
main.add_command(validate.validate)
main.add_command(deploy.deploy)
main.add_command(deploy.status)
