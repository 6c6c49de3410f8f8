"""``gpuforge slurm``: node states (state, drain, resume) and maintenance windows (window).

``drain`` and ``resume`` are an operator's hands on Slurm and do what they are told; gpuforge's
own automatic actions go through :mod:`gpuforge.admission` (docs/slurm.md).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from gpuforge.admission import Admission, AdmissionRecord, record_path
from gpuforge.cli.common import echo_json, json_option, state_option
from gpuforge.errors import InputError
from gpuforge.inventory.reader import host_vars
from gpuforge.slurm import control
from gpuforge.slurm.control import NodeAction, SlurmClient


def _client(via: str | None, inventory: Path | None) -> SlurmClient:
    if via is None:
        return SlurmClient.local()
    if inventory is None:
        return SlurmClient.over_ssh(via)
    return SlurmClient.over_ssh(via, host_vars(inventory, via))


def _echo_changes(changes: list[NodeAction], as_json: bool) -> None:
    if as_json:
        echo_json([c.to_dict() for c in changes])
        return
    for change in changes:
        verb = "changed" if change.changed else "unchanged"
        click.echo(
            f"{change.node}: {change.action} {verb} ({change.before} -> {change.after}) "
            f"reason: {change.reason}" + (f" ({change.detail})" if change.detail else "")
        )


via_option = click.option(
    "--via",
    metavar="HOST",
    help="Run scontrol on HOST (a controller or login node) over SSH instead of locally.",
)
inventory_option = click.option(
    "-i",
    "--inventory",
    type=click.Path(path_type=Path),
    help="Cluster directory (generated/ and site/) whose connection settings (ansible_host, "
    "ansible_user, key) reach --via.",
)
timeout_option = click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=control.DEFAULT_TIMEOUT,
    show_default=True,
    help="Seconds each Slurm command may take.",
)


@click.group(name="slurm")
def slurm_group() -> None:
    """Read and change Slurm node states (always with a reason)."""


@slurm_group.command("state")
@click.argument("nodes", required=False)
@via_option
@inventory_option
@timeout_option
@json_option
def state_cmd(
    *, nodes: str | None, via: str | None, inventory: Path | None, timeout: float, as_json: bool
) -> None:
    """Show the state of NODES (a hostlist expression), or of every node."""
    states = control.node_states(_client(via, inventory), nodes, timeout=timeout)
    if as_json:
        echo_json([s.to_dict() for s in states])
        return
    width = max((len(s.name) for s in states), default=4)
    for s in states:
        line = f"{s.name:<{width}}  {s.state_text:<24} {','.join(s.partitions) or '-':<12}"
        line += f" {s.gres or '-':<16}"
        if s.reason:
            line += f" {s.reason} [{s.reason_user}@{s.reason_time}]"
        click.echo(line.rstrip())


@slurm_group.command("drain")
@click.argument("nodes")
@click.option("--reason", required=True, help="Why the nodes are drained (recorded in Slurm).")
@via_option
@inventory_option
@timeout_option
@json_option
def drain_cmd(
    *,
    nodes: str,
    reason: str,
    via: str | None,
    inventory: Path | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Drain NODES so they take no new jobs; idempotent for the same reason."""
    changes = control.drain(_client(via, inventory), nodes, reason, timeout=timeout)
    _echo_changes(changes, as_json)


@slurm_group.command("resume")
@click.argument("nodes")
@click.option(
    "--reason",
    default="returned to service by gpuforge",
    show_default=True,
    help="Why the nodes return to service (printed and returned; Slurm clears node reasons).",
)
@click.option(
    "--settle",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Seconds to wait for the resumed nodes to leave transient states (IDLE+NOT_RESPONDING "
    "until slurmd answers) before printing the state they are in; 0 prints it at once.",
)
@via_option
@inventory_option
@timeout_option
@json_option
def resume_cmd(
    *,
    nodes: str,
    reason: str,
    settle: float,
    via: str | None,
    inventory: Path | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Return drained or down NODES to service; nodes already in service stay as they are.

    The state printed after the arrow is the one Slurm settles in, not the transient state right
    after the resume.
    """
    client = _client(via, inventory)
    changes = control.resume(client, nodes, reason, timeout=timeout)
    changed = [c.node for c in changes if c.changed]
    if changed and settle > 0:
        states, settled = control.settle(client, changed, within=settle, timeout=timeout)
        note = "" if settled else f"still settling after {settle:g}s: slurmd has not answered yet"
        changes = [
            replace(c, after=states[c.node].state_text, detail=note or c.detail)
            if c.node in states
            else c
            for c in changes
        ]
    _echo_changes(changes, as_json)


@slurm_group.group("window")
def window_group() -> None:
    """Maintenance windows gpuforge opened (a killed run may leave one open)."""


cluster_option = click.option(
    "--cluster", required=True, help="Cluster name (the topology spec's name)."
)


def _admission(
    cluster: str, state_dir: Path, via: str | None, inventory: Path | None, timeout: float
) -> Admission:
    path = record_path(state_dir, cluster)
    if not path.is_file():
        raise InputError(f"no admission record for cluster {cluster} at {path}")
    return Admission(
        _client(via, inventory), AdmissionRecord(path), source="operator", timeout=timeout
    )


@window_group.command("list")
@cluster_option
@state_option
@json_option
def window_list(*, cluster: str, state_dir: Path, as_json: bool) -> None:
    """List the windows recorded open, with the state each node had before."""
    path = record_path(state_dir, cluster)
    windows = AdmissionRecord(path).windows() if path.is_file() else []
    if as_json:
        echo_json(
            [
                {
                    "name": w.name,
                    "nodes": list(w.nodes),
                    "before": dict(w.before),
                    "decided": sorted(w.decided),
                    "opened_at": w.opened_at,
                }
                for w in windows
            ]
        )
        return
    for w in windows:
        drained = sum(1 for r in w.before.values() if r is not None)
        click.echo(
            f"{w.name}: {control.collect_nodes(w.nodes)} ({len(w.nodes)} nodes, {drained} drained "
            f"before, {len(w.decided)} decided)"
        )


@window_group.command("close")
@click.argument("name")
@cluster_option
@state_option
@via_option
@inventory_option
@timeout_option
@json_option
def window_close(
    *,
    name: str,
    cluster: str,
    state_dir: Path,
    via: str | None,
    inventory: Path | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Close window NAME: undecided nodes get their earlier state back, the reservation goes."""
    restored = _admission(cluster, state_dir, via, inventory, timeout).close_window(name)
    _echo_changes(restored, as_json)
    if not as_json:
        click.echo(f"window {name} closed")
