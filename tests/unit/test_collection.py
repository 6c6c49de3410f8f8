"""The repository builds as the Ansible collection gpuforge.cluster, and an install of it works."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# ansible-galaxy and ansible-doc take seconds each on the 2-core machine: make test-slow.
pytestmark = pytest.mark.slow

ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "tasks").is_dir())


def _ansible(cmd: list[str | Path], env: dict[str, str], cwd: Path) -> str:
    out = subprocess.run(
        cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, f"{cmd}: {out.stdout}{out.stderr}"
    return out.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("collection")
    env = {**os.environ, "ANSIBLE_LOCAL_TEMP": str(out / "tmp")}
    _ansible(
        [BIN / "ansible-galaxy", "collection", "build", "--force", "--output-path", out, REPO],
        env,
        out,
    )
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    tarball = out / f"{galaxy['namespace']}-{galaxy['name']}-{galaxy['version']}.tar.gz"
    assert tarball.is_file()
    return tarball


def test_tarball_holds_ansible_content_only(built: Path) -> None:
    with tarfile.open(built) as tar:
        names = set(tar.getnames())
    assert {"galaxy.yml", "MANIFEST.json"} & names == {"MANIFEST.json"}
    assert "meta/runtime.yml" in names
    assert "playbooks/site.yml" in names
    for role in ROLES:
        assert f"roles/{role}/tasks/main.yml" in names, role
    top = {n.split("/")[0] for n in names}
    assert not top & {"src", "tests", "lab", "inventory", "build", ".venv", ".lab", "validators"}
    assert not [n for n in names if "/molecule/" in n or "__pycache__" in n]


def test_installed_collection_lists_its_roles(built: Path, tmp_path: Path) -> None:
    collections = tmp_path / "collections"
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
    }
    env.pop("ANSIBLE_CONFIG", None)
    galaxy = [BIN / "ansible-galaxy", "collection"]
    _ansible([*galaxy, "install", "--force", "-p", collections, built], env, tmp_path)
    assert (collections / "ansible_collections" / "gpuforge" / "cluster" / "roles").is_dir()
    listed = _ansible([*galaxy, "list", "gpuforge.cluster", "-p", collections], env, tmp_path)
    assert "gpuforge.cluster" in listed
    docs = _ansible([BIN / "ansible-doc", "-t", "role", "-l", "gpuforge.cluster"], env, tmp_path)
    for role in ROLES:
        assert f"gpuforge.cluster.{role}:" in docs, role
