"""A cluster directory whose every node is this machine (connection local), for real plays."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuforge.resources import project_path

FIXTURES = Path(__file__).parents[1] / "fixtures" / "execution"
PLAY = FIXTURES / "shard_play.yml"

LOCAL_SITE = """\
all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    """The sample cluster (ctl01, gpu01..08 in su_01) with every host reached locally."""
    root = tmp_path / "cluster"
    shutil.copytree(project_path("inventory", "sample"), root)
    (root / "site" / "hosts.yml").write_text(LOCAL_SITE)
    return root
