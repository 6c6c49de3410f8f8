"""``gpuforge slurm``: node states (state, drain, resume) and maintenance windows (window).

``drain`` and ``resume`` are an operator's hands on Slurm: they do what they are told (the
circuit breaker caps gpuforge's automatic drains, not an operator's), through
:class:`~gpuforge.admission.Admission` as source ``operator``, so each one is in the cluster's
admission record beside gpuforge's own actions. An operator's drain in its own words is never
lifted by gpuforge (docs/slurm.md, "An operator's hands").
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from gpuforge.admission import OPERATOR, Admission, AdmissionRecord
from gpuforge.cli.common import (
    cluster_option,
    echo_json,
    inventory_option,
    json_option,
    state_option,
    via_option,
)
from gpuforge.cli.context import cluster_context, slurm_client, state_context
from gpuforge.errors import InputError
from gpuforge.slurm import control
from gpuforge.slurm.control import NodeAction, SlurmClient


def _client(via: str | None, inventory: Path | None) -> SlurmClient:
    return slurm_client(via, inventory)


def _operator(
    cluster: str | None, inventory: Path | None, state_dir: Path, via: str | None, timeout: float
) -> Admission:
    """The admission of the cluster the operator names: their action goes into its record."""
    if cluster is None and inventory is None:
        raise InputError(
            "give --cluster NAME or --inventory DIR: the action is recorded in that cluster's "
            "admission record"
        )
    if inventory is not None and cluster is None:
        ctx = cluster_context(None, inventory, state_dir)
    else:
        ctx = state_context(cluster, state_dir, inventory)
    return ctx.admission(_client(via, inventory), OPERATOR, timeout=timeout)


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
@cluster_option
@via_option
@inventory_option
@state_option
@timeout_option
@json_option
def drain_cmd(
    *,
    nodes: str,
    reason: str,
    cluster: str | None,
    via: str | None,
    inventory: Path | None,
    state_dir: Path,
    timeout: float,
    as_json: bool,
) -> None:
    """Drain NODES so they take no new jobs; idempotent for the same reason; recorded.

    The drain is done as told (the circuit breaker limits gpuforge's automatic drains only) and
    written to the cluster's admission record as source operator. A reason in your own words is
    never lifted by gpuforge; one in gpuforge's format (gpuforge:gpu.xid:reboot) hands the node
    to gpuforge (remediate, admission).
    """
    admission = _operator(cluster, inventory, state_dir, via, timeout)
    _echo_changes(admission.operator_drain(nodes, reason), as_json)


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
@cluster_option
@via_option
@inventory_option
@state_option
@timeout_option
@json_option
def resume_cmd(
    *,
    nodes: str,
    reason: str,
    settle: float,
    cluster: str | None,
    via: str | None,
    inventory: Path | None,
    state_dir: Path,
    timeout: float,
    as_json: bool,
) -> None:
    """Return drained or down NODES to service, whoever drained them; recorded.

    Nodes already in service stay as they are. The state printed after the arrow is the one
    Slurm settles in, not the transient state right after the resume.
    """
    admission = _operator(cluster, inventory, state_dir, via, timeout)
    client = admission.slurm
    changes = admission.operator_resume(nodes, reason)
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


def _admission(
    cluster: str | None, state_dir: Path, via: str | None, inventory: Path | None, timeout: float
) -> Admission:
    ctx = state_context(cluster, state_dir, inventory)
    if not ctx.state.admission_db.is_file():
        raise InputError(f"no admission record for cluster {cluster} at {ctx.state.admission_db}")
    return ctx.admission(_client(via, inventory), OPERATOR, timeout=timeout)


@window_group.command("list")
@cluster_option
@state_option
@json_option
def window_list(*, cluster: str | None, state_dir: Path, as_json: bool) -> None:
    """List the windows recorded open, with the state each node had before."""
    path = state_context(cluster, state_dir).state.admission_db
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
    cluster: str | None,
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
