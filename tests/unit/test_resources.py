"""gpuforge finds its own files from a checkout and from a wheel installed outside the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuforge.cli import main
from gpuforge.resources import project_path, work_dir

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_checkout_finds_its_own_tree() -> None:
    assert project_path() == REPO
    assert project_path("roles", "base", "tasks", "main.yml").is_file()
    assert project_path("playbooks", "site.yml").is_file()
    assert project_path("validators", "conftest.py").is_file()
    assert project_path("lab", "sim", "gpuforge_sim", "faults.py").is_file()
    assert work_dir() == REPO


def test_work_dir_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFORGE_WORK_DIR", str(tmp_path))
    assert work_dir() == tmp_path.resolve()


def test_simulator_imports_without_editing_sys_path() -> None:
    before = list(sys.path)
    from gpuforge.lab.faults import sim_faults  # noqa: PLC0415

    assert sim_faults().__name__ == "gpuforge_sim.faults"
    assert sys.path == before


def test_paths_command_lists_roles_and_playbooks() -> None:
    result = CliRunner().invoke(main, ["paths", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert {"base", "nvidia_driver", "slurm"} <= set(info["roles"])
    assert "site.yml" in info["playbooks"]
    assert info["roles_path"] == str(REPO / "roles")


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project built as a wheel (offline: the venv has the build backend) and installed into
    a directory of its own, outside the checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [BIN / "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", REPO],
        check=True,
        timeout=300,
        cwd=tmp,
    )
    (wheel,) = (tmp / "dist").glob("gpuforge-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "gpuforge/_project/roles/base/tasks/main.yml" in names
    assert "gpuforge_sim/faults.py" in names
    assert "gpuforge/validate/data/xid_catalogue.yaml" in names  # data files ride along
    assert not [n for n in names if "__pycache__" in n]
    target = tmp / "site"
    subprocess.run(
        [BIN / "pip", "install", "-q", "--no-deps", "--target", target, wheel],
        check=True,
        timeout=300,
        cwd=tmp,
    )
    return target


def _run_installed(target: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH puts the installed copy before the checkout's editable install.
    full = {**os.environ, "PYTHONPATH": str(target)}
    full.pop("ANSIBLE_CONFIG", None)
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
def test_installed_wheel_finds_its_roles_outside_the_checkout(
    installed_wheel: Path, tmp_path: Path
) -> None:
    out = _run_installed(installed_wheel, tmp_path, "-m", "gpuforge", "paths", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["project"] == str(installed_wheel / "gpuforge" / "_project")
    assert not info["project"].startswith(str(REPO))
    assert {"base", "nvidia_driver", "cuda_toolkit", "slurm"} <= set(info["roles"])
    assert {"site.yml", "preflight.yml"} <= set(info["playbooks"])
    assert info["work_dir"] == str(tmp_path.resolve())

    # A new cluster directory starts its site layer from the shipped sample.
    spec = Path(info["project"]) / "examples" / "topologies" / "lab.yaml"
    gen = _run_installed(
        installed_wheel, tmp_path, "-m", "gpuforge", "inventory", "generate", str(spec)
    )
    assert gen.returncode == 0, gen.stdout + gen.stderr
    assert (tmp_path / "inventory" / "lab" / "generated" / "hosts.yml").is_file()
    assert (tmp_path / "inventory" / "lab" / "site" / "hosts.yml").is_file()

    # The shipped playbook resolves every role it names from the shipped roles path.
    check = subprocess.run(
        [BIN / "ansible-playbook", "--syntax-check", "-i", "localhost,", "site.yml"],
        cwd=Path(info["project"]) / "playbooks",
        env={
            **os.environ,
            "ANSIBLE_CONFIG": info["ansible_cfg"],
            "ANSIBLE_ROLES_PATH": info["roles_path"],
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr

    # The simulator comes with the wheel: a fault file is validated by the installed copy.
    sim = _run_installed(
        installed_wheel,
        tmp_path,
        "-c",
        "import gpuforge_sim, gpuforge.lab.faults as f; print(gpuforge_sim.__file__);"
        " print(f.load_fault_file(f.__file__.replace('lab/faults.py', "
        "'_project/lab/sim/examples/faults-all.yaml'))['version'])",
    )
    assert sim.returncode == 0, sim.stderr
    sim_file, version = sim.stdout.split()
    assert sim_file.startswith(str(installed_wheel))
    assert version == "1"


@pytest.mark.slow
def test_installed_wheel_loads_the_xid_catalogue(installed_wheel: Path, tmp_path: Path) -> None:
    code = (
        "from gpuforge.validate import xid_catalogue as x;"
        "print(x.CATALOGUE_PATH); print(x.lookup(79).action.value)"
    )
    out = _run_installed(installed_wheel, tmp_path, "-c", code)
    assert out.returncode == 0, out.stderr
    path, action = out.stdout.split()
    assert Path(path) == installed_wheel / "gpuforge/validate/data/xid_catalogue.yaml"
    assert action == "reboot"
