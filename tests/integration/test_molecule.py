"""Run every role's Molecule scenario: create, prepare, converge, idempotence, verify, destroy.

One test per ``roles/<role>/molecule/default``; the lab image and mirror are built once first.
Each scenario gets its own instance name (``gpuforge-molecule-<role>``) so they never collide.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuforge.lab import podman
from gpuforge.lab.image import ensure_image
from gpuforge.lab.mirror import ensure_mirror
from gpuforge.lab.paths import CONTAINERS_CONF

pytestmark = [pytest.mark.lab, pytest.mark.slow]

#: Molecule runs from a checkout: the scenarios and the shared config are not in the wheel.
REPO_ROOT = Path(__file__).resolve().parents[2]
SCENARIO_TIMEOUT = float(os.environ.get("GPUFORGE_MOLECULE_TIMEOUT", "1800"))
VENV_BIN = Path(sys.executable).parent
#: Scenarios measured at 5-10 minutes on 2 cores, slowest first: run in parallel (``make test``
#: uses pytest-xdist), they start first so that the workers finish together.
SLOWEST = ("infiniband", "roce", "slurm", "nvidia_driver", "base")
#: Every role with a scenario, or the comma-separated GPUFORGE_MOLECULE_ROLES (``make test``'s set).
ROLES = sorted(
    (
        p.parents[2].name
        for p in (REPO_ROOT / "roles").glob("*/molecule/default/molecule.yml")
        if not os.environ.get("GPUFORGE_MOLECULE_ROLES")
        or p.parents[2].name in os.environ["GPUFORGE_MOLECULE_ROLES"].split(",")
    ),
    key=lambda role: (SLOWEST.index(role) if role in SLOWEST else len(SLOWEST), role),
)


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def scenario_steps(role: str) -> list[str]:
    """The scenario's steps: its own test_sequence, or the shared config's."""
    for config in (
        REPO_ROOT / "roles" / role / "molecule" / "default" / "molecule.yml",
        REPO_ROOT / ".config" / "molecule" / "config.yml",
    ):
        sequence = (
            (yaml.safe_load(config.read_text()) or {}).get("scenario", {}).get("test_sequence")
        )
        if sequence:
            return [str(step) for step in sequence]
    return ["converge", "idempotence", "verify"]


@pytest.fixture(scope="session")
def lab_artifacts() -> None:
    """The node image and the signed mirror every scenario uses."""
    ensure_image()
    ensure_mirror()


def molecule_env(role: str) -> dict[str, str]:
    """Environment of one scenario run: the lab's podman config and this venv's tools."""
    env = dict(os.environ)
    env["CONTAINERS_CONF"] = str(CONTAINERS_CONF)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["GPUFORGE_MOLECULE_INSTANCE"] = f"gpuforge-molecule-{role}"
    env.pop("ANSIBLE_CONFIG", None)  # Molecule writes its own per scenario
    return env


@pytest.mark.skipif(not ROLES, reason="no role has a molecule/default scenario yet")
@pytest.mark.parametrize("role", ROLES)
def test_molecule_scenario(role: str, lab_artifacts: None) -> None:
    try:
        proc = subprocess.run(
            [str(VENV_BIN / "molecule"), "test", "--scenario-name", "default"],
            cwd=REPO_ROOT / "roles" / role,
            env=molecule_env(role),
            capture_output=True,
            text=True,
            timeout=SCENARIO_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        podman.rm([f"gpuforge-molecule-{role}"])
        pytest.fail(f"molecule test of {role} ran past {SCENARIO_TIMEOUT:.0f}s")
    output = (proc.stdout + proc.stderr)[-12000:]
    assert proc.returncode == 0, f"molecule test of {role} failed:\n{output}"
    # Every step of the scenario ran and succeeded (idempotence: 0 changed; check: the --check run).
    plain = ANSI.sub("", proc.stdout + proc.stderr)
    for step in scenario_steps(role):
        assert f"default ➜ {step}: Executed: Successful" in plain, f"{role}: {step} did not run"
