"""``gpuforge lab``: the container lab (image, package mirror, up, status, ssh, faults, down)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import click

from gpuforge.cli.common import DEFAULT_SPEC, echo_json, json_option, state_option
from gpuforge.cli.context import state_paths
from gpuforge.errors import InputError, OperationError

spec_argument = click.argument(
    "spec",
    required=False,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
)
lab_option = click.option(
    "--lab",
    "lab_name",
    default=None,
    help="Lab name (the spec's cluster name). Default: the only lab there is.",
)


def _progress(message: str) -> None:
    click.echo(f"lab: {message}", err=True)


@click.group()
def lab() -> None:
    """The container lab: a whole cluster of systemd containers on this machine."""


@lab.command("image")
@click.option("--force", is_flag=True, help="Rebuild even if the image of this recipe exists.")
def image_cmd(force: bool) -> None:
    """Build the node image (localhost/gpuforge-node) unless it is current."""
    from gpuforge.lab.image import ensure_image  # noqa: PLC0415 - keep --help fast

    result = ensure_image(force=force, progress=_progress)
    verb = "built" if result.built else "up to date"
    click.echo(f"{result.ref} {verb} ({result.seconds:.1f}s)")


@lab.command("mirror")
@click.option("--force", is_flag=True, help="Rebuild even if the sources did not change.")
def mirror_cmd(force: bool) -> None:
    """Build the signed lab package repository (build/lab-mirror) unless it is current."""
    from gpuforge.lab.mirror import ensure_mirror  # noqa: PLC0415

    result = ensure_mirror(force=force, progress=_progress)
    verb = "built" if result.built else "up to date"
    click.echo(f"{result.path} {verb}: {len(result.packages)} packages ({result.seconds:.1f}s)")


@lab.command("up")
@spec_argument
@click.option(
    "--faults",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Fault file (YAML or JSON) for the hardware simulator.",
)
def up_cmd(spec: Path | None, faults: Path | None) -> None:
    """Bring up one container per node of SPEC (default: the lab spec); idempotent."""
    from gpuforge.generate import write_cluster_inventory  # noqa: PLC0415
    from gpuforge.lab import faults as lab_faults  # noqa: PLC0415
    from gpuforge.lab import lifecycle  # noqa: PLC0415
    from gpuforge.lab.image import ensure_image  # noqa: PLC0415
    from gpuforge.lab.mirror import ensure_mirror  # noqa: PLC0415
    from gpuforge.lab.plan import plan_from_cluster  # noqa: PLC0415
    from gpuforge.topology import load_cluster  # noqa: PLC0415

    spec_path = spec or DEFAULT_SPEC
    model = load_cluster(spec_path)
    plan = plan_from_cluster(model)
    fault_doc = lab_faults.load_fault_file(faults) if faults else lab_faults.NO_FAULTS
    info = lab_faults.cluster_info(model)
    states = lab_faults.node_states(fault_doc, info)  # validated before any container starts
    ensure_image(progress=_progress)
    ensure_mirror(progress=_progress)

    def writer(root: Path) -> None:
        write_cluster_inventory(model, root, protect=(spec_path,))

    result = lifecycle.up(plan, writer, cluster_info=info, progress=_progress)
    lifecycle.apply_faults(plan.name, states)
    verb = "changed" if result.changed else "unchanged"
    click.echo(
        f"lab {plan.name}: {len(plan.nodes)} nodes up, {verb} ({result.seconds:.1f}s)\n"
        f"  inventory: {result.state_dir / 'inventory'} (generated/ and site/)\n"
        f"  ansible:   ANSIBLE_CONFIG={result.state_dir / 'ansible.cfg'}\n"
        f"  ssh:       gpuforge lab ssh {plan.nodes[0].hostname}"
    )


@lab.command("status")
@lab_option
@json_option
def status_cmd(lab_name: str | None, as_json: bool) -> None:
    """Show the lab's containers: name, role, address, state, uptime."""
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    from gpuforge.lab import lifecycle  # noqa: PLC0415

    name = _lab_name(lab_name)
    rows = lifecycle.status(name)
    if as_json:
        echo_json([row.__dict__ for row in rows])
        return
    table = Table(title=f"lab {name}")
    for column in ("name", "role", "address", "state", "uptime"):
        table.add_column(column)
    for row in rows:
        table.add_row(row.name, row.role, row.address, row.state, _uptime(row.uptime_s))
    Console().print(table)
    if not rows:
        click.echo(f"lab {name} has no containers")


@lab.command("down")
@lab_option
@state_option
def down_cmd(lab_name: str | None, state_dir: Path) -> None:
    """Remove the lab's containers, network, SSH key and state, and its rollout record.

    The rollout record (STATE_DIR/<lab>/) describes nodes that are gone with the containers: left
    in place, it would tell the next deploy that fresh nodes were admitted long ago.
    """
    from gpuforge.lab import lifecycle  # noqa: PLC0415

    name = _lab_name(lab_name)
    gone = lifecycle.down(name)
    click.echo(f"lab {name}: removed {len(gone)} objects")
    paths = state_paths(state_dir, name)
    record = paths.root
    if paths.rollout_db.is_file():
        shutil.rmtree(record)
        click.echo(f"lab {name}: removed its rollout record {record}")


@lab.command("ssh", context_settings={"ignore_unknown_options": True})
@lab_option
@click.option("--timeout", default=600.0, show_default=True, help="Seconds, with a COMMAND.")
@click.argument("node")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def ssh_cmd(lab_name: str | None, timeout: float, node: str, command: tuple[str, ...]) -> None:
    """Open a root shell on NODE over SSH, or run COMMAND there (host keys checked)."""
    from gpuforge.lab import lifecycle  # noqa: PLC0415

    cmd = lifecycle.ssh_command(_lab_name(lab_name), node, command)
    if not command:
        # An interactive session lasts as long as the person at the terminal wants it to.
        os.execvp(cmd[0], cmd)  # noqa: S606
    try:
        proc = subprocess.run(cmd, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise OperationError(f"{node}: command timed out after {timeout:.0f}s") from exc
    raise SystemExit(proc.returncode)


@lab.command("faults")
@lab_option
@click.argument("fault_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def faults_cmd(lab_name: str | None, fault_file: Path) -> None:
    """Load FAULT_FILE into the simulator on every node of the lab."""
    from gpuforge.lab import faults as lab_faults  # noqa: PLC0415
    from gpuforge.lab import lifecycle  # noqa: PLC0415

    name = _lab_name(lab_name)
    doc = lab_faults.load_fault_file(fault_file)
    states = lab_faults.node_states(doc, lifecycle.load_cluster_info(name))
    hosts = lifecycle.apply_faults(name, states)
    click.echo(f"lab {name}: faults from {fault_file} on {len(hosts)} nodes")


def _lab_name(given: str | None) -> str:
    if given:
        return given
    from gpuforge.lab import lifecycle  # noqa: PLC0415

    labs = lifecycle.known_labs()
    if len(labs) == 1:
        return labs[0]
    if not labs:
        raise InputError("no lab is up (gpuforge lab up)")
    raise InputError(f"several labs exist ({', '.join(labs)}): pick one with --lab")


def _uptime(seconds: int) -> str:
    if not seconds:
        return "-"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
