"""The ``gpuforge`` command line: one module per command group, wired here."""

from __future__ import annotations

import sys
from typing import Any

import click

from gpuforge import __version__
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


def _register() -> None:
    # Imported here so that `gpuforge --help` stays one import deep per group.
    from gpuforge.cli import inventory, plan, topology

    main.add_command(topology.topology)
    main.add_command(inventory.inventory)
    main.add_command(plan.plan)

    from gpuforge.cli import slurm

    main.add_command(slurm.slurm_group)

    from gpuforge.cli import lab

    main.add_command(lab.lab)

    from gpuforge.cli import parse

    main.add_command(parse.parse)

    from gpuforge.cli import validate

    main.add_command(validate.validate)


_register()
