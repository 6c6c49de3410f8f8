"""``gpuforge paths``: where this installation finds its roles, playbooks, validators and lab."""

from __future__ import annotations

from typing import Any

import click

from gpuforge.cli.common import echo_json, json_option
from gpuforge.resources import project_path, work_dir


def installation() -> dict[str, Any]:
    """The project's files as this installation sees them (checkout or wheel)."""
    roles = project_path("roles")
    playbooks = project_path("playbooks")
    return {
        "project": str(project_path()),
        "roles_path": str(roles),
        "roles": sorted(p.name for p in roles.iterdir() if (p / "tasks").is_dir()),
        "playbooks": sorted(p.name for p in playbooks.glob("*.yml")),
        "validators": str(project_path("validators")),
        "simulator": str(project_path("lab", "sim")),
        "ansible_cfg": str(project_path("ansible.cfg")),
        "work_dir": str(work_dir()),
    }


@click.command("paths")
@json_option
def paths(as_json: bool) -> None:
    """Show where gpuforge finds its roles, playbooks, validators and lab, and where it writes."""
    info = installation()
    if as_json:
        echo_json(info)
        return
    for key in ("project", "roles_path", "validators", "simulator", "ansible_cfg", "work_dir"):
        click.echo(f"{key:<11} {info[key]}")
    click.echo(f"{'roles':<11} {' '.join(info['roles'])}")
    click.echo(f"{'playbooks':<11} {' '.join(info['playbooks'])}")
