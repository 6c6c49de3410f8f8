"""``gpuforge inventory generate`` plus the project make a private data directory that
ansible-runner (and so AWX / Automation Platform, which runs jobs through it) takes as is."""

from __future__ import annotations

import shutil
from pathlib import Path

import ansible_runner
import pytest
from click.testing import CliRunner

from gpuforge.cli import main
from gpuforge.resources import project_path

pytestmark = pytest.mark.slow


def test_generated_inventory_and_project_form_a_runner_private_data_dir(tmp_path: Path) -> None:
    private = tmp_path / "private"
    cluster = private / "inventory" / "lab"
    result = CliRunner().invoke(
        main,
        ["inventory", "generate", str(project_path("examples", "topologies", "lab.yaml")),
         "-o", str(cluster)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    # The project as AWX checks it out: the repository's playbooks, roles and ansible.cfg.
    project = private / "project"
    shutil.copytree(project_path("playbooks"), project / "playbooks")
    shutil.copytree(project_path("roles"), project / "roles")
    shutil.copy2(project_path("ansible.cfg"), project / "ansible.cfg")
    # Two inventory sources in Ansible's order, as an AWX inventory with two sources.
    run = ansible_runner.run(
        private_data_dir=str(private),
        playbook="playbooks/site.yml",
        inventory=[str(cluster / "generated"), str(cluster / "site")],
        cmdline="--list-tasks --list-hosts --limit gpu01,ctl01",
        quiet=True,
        rotate_artifacts=1,
    )
    with run.stdout as out:
        stdout = out.read()
    assert run.status == "successful", stdout[-2000:]
    assert "gpu01" in stdout
    assert "ctl01" in stdout
    # The roles resolved from project/roles (a task of each concern is listed).
    for role in ("nvidia_driver", "slurm"):
        assert f"{role} :" in stdout
