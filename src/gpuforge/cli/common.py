"""Helpers shared by command modules: JSON output and the default spec."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from gpuforge.resources import project_path

DEFAULT_SPEC = project_path("examples", "topologies", "lab.yaml")

json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")


def echo_json(data: Any) -> None:
    """Print ``data`` as stable, indented JSON."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


state_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=lambda: os.environ.get("GPUFORGE_STATE_DIR", "state"),
    show_default="state/ or $GPUFORGE_STATE_DIR",
    help="Where the rollout and admission records (SQLite) and the lock live, per cluster.",
)
