"""The phased rollout end to end on a lab: what ``make deploy-phase`` does, with faults injected.

One 6-node lab (tests/integration/specs/rollout.yaml: rctl01 + rgpu[01-05], phase 1 =
rgpu[01-04] with a 60% gate) is brought up with a fault on rgpu02. In order:

1. phase 2 is refused while phase 1 has not passed its gate;
2. phase 1 (validation level full) is killed (SIGKILL) while provisioning, then re-run: it ends
   with rgpu02 quarantined,
   drained in Slurm with the failed checks as reason, and the two others admitted (idle);
3. with rgpu02 repaired, rgpu01 given a GPU fault and rgpu03 a half-rate NIC,
   ``gpuforge validate --phase 1 --level full --drain`` (which runs its NCCL jobs inside a
   maintenance reservation of its own, the drained rgpu02 resumed inside it) drains exactly
   rgpu01 and rgpu03, the latter found by bandwidth alone, resumes rgpu02, leaves no
   reservation, and writes JSON, JUnit and HTML reports.

The lab is torn down at the end, also when a test fails. Tests depend on their order.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuforge.admission import is_ours, parse_reason
from gpuforge.command import CommandResult, run_argv
from gpuforge.lab import lifecycle
from gpuforge.lab.paths import CONTAINERS_CONF
from gpuforge.slurm import control
from gpuforge.slurm.control import SlurmClient

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SPECS = Path(__file__).parent / "specs"
SPEC = SPECS / "rollout.yaml"
LAB = "rollouttest"
PHASE1 = ["rgpu01", "rgpu02", "rgpu03", "rgpu04"]
GPUFORGE = str(Path(sys.executable).parent / "gpuforge")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment every gpuforge call of this module runs with."""
    return dict(
        os.environ,
        CONTAINERS_CONF=str(CONTAINERS_CONF),
        ANSIBLE_CONFIG=str(lifecycle.state_dir(LAB) / "ansible.cfg"),
        GPUFORGE_STATE_DIR=str(tmp_path_factory.mktemp("state")),
    )


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rollout")


@pytest.fixture(scope="module")
def lab(env: dict[str, str]) -> Iterator[Path]:
    """The lab, up with the deploy fault file; yields its inventory. Always torn down."""
    lifecycle.down(LAB)
    try:
        faults = SPECS / "faults-rollout-deploy.yaml"
        proc = run(env, "lab", "up", str(SPEC), "--faults", str(faults))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield lifecycle.state_dir(LAB) / "inventory"
    finally:
        lifecycle.down(LAB)


def run(env: dict[str, str], *args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUFORGE, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def deploy_args(inventory: Path, phase: int, work: Path) -> list[str]:
    return [
        "deploy",
        "--phase",
        str(phase),
        str(SPEC),
        "--inventory",
        str(inventory),
        "--report-dir",
        str(work / "reports"),
    ]


def status(env: dict[str, str]) -> dict[str, Any]:
    proc = run(env, "status", str(SPEC), "--json", timeout=60)
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


class LabSsh:
    """A command runner that reaches lab nodes through the lab's ssh_config."""

    def run(self, host: str, command: str, *, timeout: float) -> CommandResult:
        return run_argv(
            host, command, [*lifecycle.ssh_command(LAB, host), "--", command], timeout=timeout
        )


CONTROLLER = SlurmClient(LabSsh(), "rctl01")


def sinfo_nodes() -> dict[str, control.SinfoRow]:
    out = CONTROLLER.run(["sinfo", "--noheader", "--Node", f"--format={control.SINFO_FORMAT}"])
    return {row.node: row for row in control.parse_sinfo(out.stdout)}


def test_phase_2_is_refused_before_phase_1_passes(
    lab: Path, env: dict[str, str], work: Path
) -> None:
    proc = run(env, *deploy_args(lab, 2, work), timeout=300)
    assert proc.returncode != 0
    assert "phase 1" in (proc.stdout + proc.stderr)
    assert all(p["counts"] in ({}, {"new": len(PHASE1)}, {"new": 1}) for p in status(env)["phases"])


def test_phase_1_killed_while_provisioning_resumes_to_the_same_end(
    lab: Path, env: dict[str, str], work: Path
) -> None:
    first = subprocess.Popen(
        [GPUFORGE, *deploy_args(lab, 1, work)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            counts = status(env)["phases"][0]["counts"]
            if counts.get("provisioning"):
                time.sleep(20)  # well inside the play
                break
            assert first.poll() is None, "deploy ended before it provisioned anything"
            time.sleep(2)
        else:
            pytest.fail("phase 1 never reached provisioning")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
    assert status(env)["phases"][0]["counts"] == {"provisioning": len(PHASE1)}

    again = run(env, *deploy_args(lab, 1, work))
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-2000:]
    data = status(env)
    assert data["phases"][0]["counts"] == {"admitted": 3, "quarantined": 1}
    assert data["phases"][0]["gate"]["passed"] is True
    (bad,) = data["quarantined"]
    assert bad["hostname"] == "rgpu02"
    assert "gpu.row_remap" in bad["reason"]

    nodes = sinfo_nodes()
    assert nodes["rgpu02"].state == "drained"
    reason = parse_reason(nodes["rgpu02"].reason)  # the one format: gpuforge:<check>:<action>
    assert reason is not None, nodes["rgpu02"].reason
    assert reason.check.startswith("gpu.")  # the first failed check; the record has them all
    # The check catalogue's action for the failed check, as the node checker would drain it: a
    # pending row remap is Xid 63's fault (reset the GPU), no longer a bare "quarantine".
    assert reason.action == "reset_gpu"
    assert {nodes[n].state for n in ("rgpu01", "rgpu03", "rgpu04")} == {"idle"}
    assert nodes["rgpu05"].state != "idle"  # phase 2: not provisioned, never admitted


def test_validate_drains_exactly_the_faulty_nodes_and_finds_a_slow_nic(
    lab: Path, env: dict[str, str], work: Path
) -> None:
    proc = run(env, "lab", "faults", "--lab", LAB, str(SPECS / "faults-rollout-validate.yaml"))
    assert proc.returncode == 0, proc.stderr
    reports = work / "validate"
    proc = run(
        env,
        "validate",
        "--inventory",
        str(lab),
        "--phase",
        "1",
        "--level",
        "full",
        "--drain",
        "--gpu-burn-seconds",
        "30",
        "--report-dir",
        str(reports),
    )
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    doc = json.loads((reports / "validation.json").read_text())
    verdicts = {n["node"]: n for n in doc["nodes"]}
    assert {n: v["verdict"] for n, v in verdicts.items()} == {
        "rgpu01": "quarantine",
        "rgpu02": "admit",
        "rgpu03": "quarantine",
        "rgpu04": "admit",
    }
    assert any(r.startswith("gpu.") for r in verdicts["rgpu01"]["reasons"])
    slow = verdicts["rgpu03"]["reasons"]
    assert slow, "rgpu03 quarantined without a reason"
    assert all(not r.startswith("gpu.") for r in slow)  # bandwidth alone found it
    assert (reports / "junit.xml").is_file()
    assert (reports / "report.html").stat().st_size > 0

    nodes = sinfo_nodes()
    assert {n: nodes[n].state for n in PHASE1} == {
        "rgpu01": "drained",
        "rgpu02": "idle",
        "rgpu03": "drained",
        "rgpu04": "idle",
    }
    for node in ("rgpu01", "rgpu03"):
        assert is_ours(nodes[node].reason), nodes[node].reason
    left = CONTROLLER.run(["scontrol", "show", "reservation"])
    assert "ReservationName=" not in left.stdout, left.stdout
