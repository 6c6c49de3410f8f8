"""The ``gpuforge`` command line: one module per command group, wired here."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

import click

from gpuforge import __version__
from gpuforge.errors import GpuforgeError

#: Each command: the module under ``gpuforge.cli`` that defines it, and its attribute there. A
#: command's module is imported only when that command runs (or ``--help`` lists them): the
#: fleet, conformance and risk commands pull in numpy, the validators and the reports, which a
#: ``topology check`` of a 100k-GPU spec would otherwise pay for on every start (1.4 CPU-s).
COMMANDS: dict[str, tuple[str, str]] = {
    "topology": ("topology", "topology"),
    "inventory": ("inventory", "inventory"),
    "plan": ("plan", "plan"),
    "lab": ("lab", "lab"),
    "slurm": ("slurm", "slurm_group"),
    "parse": ("parse", "parse"),
    "validate": ("validate", "validate"),
    "deploy": ("deploy", "deploy"),
    "status": ("deploy", "status"),
    "paths": ("paths", "paths"),
    "health": ("health", "health"),
    "fleet": ("fleet", "fleet"),
    "remediate": ("remediate", "remediate"),
    "rma": ("remediate", "rma_group"),
    "conformance": ("conformance", "conformance"),
    "upgrade": ("upgrade", "upgrade"),
}


class _Root(click.Group):
    """Loads each command when it is asked for; maps gpuforge's exceptions to exit codes.

    Exit codes: 0 ok, 1 failed, 2 bad input.
    """

    def list_commands(self, _ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, _ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attr = COMMANDS[cmd_name]
        command = getattr(importlib.import_module(f"gpuforge.cli.{module}"), attr)
        if cmd_name == "upgrade":
            from gpuforge.cli.upgrade_run import run_command  # noqa: PLC0415 - with its group

            command.add_command(run_command)
        if not isinstance(command, click.Command):
            raise TypeError(f"gpuforge.cli.{module}.{attr} is not a click command")
        return command

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
