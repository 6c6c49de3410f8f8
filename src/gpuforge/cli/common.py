"""What command modules share: the click options every command takes, JSON output, the spec.

One definition per option (``--inventory``, ``--cluster``/CLUSTER, ``--via``, ``--state-dir``,
``--json``); the cluster they select is built by :mod:`gpuforge.cli.context`.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from gpuforge.errors import Interrupted
from gpuforge.resources import project_path
from gpuforge.state_paths import STATE_DIR_ENV, default_state_dir

DEFAULT_SPEC = project_path("examples", "topologies", "lab.yaml")


def echo_json(data: Any) -> None:
    """Print ``data`` as stable, indented JSON."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


@contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C and SIGTERM end the run as "interrupted" (recorded), never half-written."""

    def on_term(_signum: int, _frame: object) -> None:
        raise Interrupted("interrupted by SIGTERM")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted("interrupted by SIGINT (Ctrl-C)") from None
    finally:
        signal.signal(signal.SIGTERM, previous)


json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")

state_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=default_state_dir,
    show_default=f"state/ or ${STATE_DIR_ENV}",
    help="Where the rollout and admission records (SQLite) and the lock live, per cluster.",
)

inventory_option = click.option(
    "-i",
    "--inventory",
    "inventory",
    type=click.Path(file_okay=False, path_type=Path),
    help="Cluster directory: generated/ and site/ (a lab's: .lab/<lab>/inventory); "
    "default inventory/CLUSTER.",
)

cluster_option = click.option(
    "--cluster",
    help="Cluster name: its directory is inventory/CLUSTER, its state <state-dir>/CLUSTER.",
)

cluster_argument = click.argument("cluster", required=False)

via_option = click.option(
    "--via",
    metavar="HOST|local",
    help="Where Slurm's commands run: 'local' on this machine, else HOST (a controller or "
    "login node) over SSH with the inventory's connection settings.",
)
