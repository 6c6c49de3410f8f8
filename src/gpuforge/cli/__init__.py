"""The ``gpuforge`` command line: one module per command group, wired here."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from gpuforge import __version__
from gpuforge.cli import conformance as conformance_cli
from gpuforge.cli import (
    deploy,
    inventory,
    lab,
    parse,
    paths,
    plan,
    slurm,
    topology,
    upgrade_run,
    validate,
)
from gpuforge.cli import fleet as fleet_cli
from gpuforge.cli import health as health_cli
from gpuforge.cli import remediate as remediate_cli
from gpuforge.cli import upgrade as upgrade_cli
from gpuforge.errors import GpuforgeError


class _Root(click.Group):
    """Maps gpuforge's exceptions to exit codes (0 ok, 1 failed, 2 bad input)."""

    def invoke(self, ctx: click.Context) -> Any:
        _tools_first_on_path()
        try:
            return super().invoke(ctx)
        except GpuforgeError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)


def _tools_first_on_path() -> None:
    """Find ansible-playbook, ansible-inventory and pytest in gpuforge's own environment.

    ``.venv/bin/gpuforge`` works without activating the virtual environment: the commands it
    starts (directly or through ansible-runner) are the ones pinned next to its interpreter.
    """
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = os.pathsep.join([bin_dir, path]) if path else bin_dir


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
main.add_command(paths.paths)
main.add_command(health_cli.health)
main.add_command(fleet_cli.fleet)
main.add_command(remediate_cli.remediate)
main.add_command(remediate_cli.rma_group)
main.add_command(conformance_cli.conformance)
main.add_command(upgrade_cli.upgrade)
upgrade_cli.upgrade.add_command(upgrade_run.run_command)
