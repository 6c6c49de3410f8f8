"""``gpuforge topology``: validate a spec, print its summary or the spec's JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import click

from gpuforge.cli.common import echo_json, json_option
from gpuforge.topology import Topology, load_cluster
from gpuforge.topology.spec_rules import compat_warnings
from gpuforge.topology.summary import render_summary, summarize

spec_argument = click.argument("spec", type=click.Path(path_type=Path, dir_okay=False))


@click.group()
def topology() -> None:
    """Validate and inspect topology specs."""


@topology.command()
@spec_argument
@json_option
def check(spec: Path, as_json: bool) -> None:
    """Validate SPEC, expand it and print a one-screen summary."""
    cluster = load_cluster(spec)
    data = summarize(cluster)
    for warning in compat_warnings(cluster.spec):
        click.echo(f"warning: {spec}: versions: {warning}", err=True)
    if as_json:
        echo_json(data)
    else:
        click.echo(render_summary(data))


@topology.command()
def schema() -> None:
    """Print the JSON Schema of the topology spec."""
    click.echo(json.dumps(Topology.model_json_schema(), indent=2, sort_keys=True))
