"""Helpers shared by command modules: JSON output and the default spec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_SPEC = REPO_ROOT / "examples" / "topologies" / "lab.yaml"

json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")


def echo_json(data: Any) -> None:
    """Print ``data`` as stable, indented JSON."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
