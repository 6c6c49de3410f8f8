"""A rolling upgrade of a whole lab and back (issue 19.4): ``make test-integration``.

test_day2.py's extended check (also ``make test-integration``) upgrades the day-2 lab with a
kill and an operator's drain.
This module covers the rest on its own lab, ``d2upg`` (tests/integration/specs/d2upg.yaml: uctl01
+ ugpu01-04, 2 nodes per leaf, 32 GPUs), deployed on the mirror's older driver and NCCL
(570.124.06, 2.25.1):

- the upgrade to the newer pair (570.133.20, 2.26.2) with ``sbatch`` sleep jobs on two nodes,
  every node included, and then the rollback: ``upgrade run`` with the previous pins moves every
  node back the same way;
- after each: every node on the run's pins (asked of the nodes: ``upgrade plan`` has nothing left
  to change), idle in Slurm; no job killed; ``sinfo`` sampled every 2 s never shows more than 2
  nodes out of service (``--max-fraction 0.5``).

``GPUFORGE_REUSE_LAB=1`` uses an admitted d2upg lab as it is (no lab up, no deploy);
``GPUFORGE_KEEP_LAB=1`` leaves it up afterwards.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import upgrading

from gpuforge.lab import lifecycle
from gpuforge.lab.paths import CONTAINERS_CONF

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SPEC = Path(__file__).parent / "specs" / "d2upg.yaml"
LAB = "d2upg"
CONTROLLER = "uctl01"
NODES = ("ugpu01", "ugpu02", "ugpu03", "ugpu04")
JOB_NODES = ("ugpu01", "ugpu03")
NEW = {"nvidia_driver": "570.133.20", "nccl": "2.26.2"}
MAX_OUT = 2  # --max-fraction 0.5 of 32 GPUs: one leaf of 2 nodes at once
LOG = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    state = (
        Path("/tmp/d2upg/state")  # where a reused lab's record is (up.sh)
        if os.environ.get("GPUFORGE_REUSE_LAB")
        else tmp_path_factory.mktemp("state")
    )
    return dict(
        os.environ,
        CONTAINERS_CONF=str(CONTAINERS_CONF),
        ANSIBLE_CONFIG=str(lifecycle.state_dir(LAB) / "ansible.cfg"),
        GPUFORGE_STATE_DIR=str(state),
    )


run = upgrading.gpuforge


@pytest.fixture(scope="module")
def lab(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The d2upg lab, deployed and admitted on the older pins; yields its inventory."""
    inventory = lifecycle.state_dir(LAB) / "inventory"
    if os.environ.get("GPUFORGE_REUSE_LAB"):
        yield inventory
        return
    lifecycle.down(LAB)
    try:
        proc = run(env, "lab", "up", str(SPEC), timeout=900)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        reports = tmp_path_factory.mktemp("deploy")
        proc = run(
            env,
            "deploy",
            "--phase",
            "1",
            "--level",
            "quick",
            str(SPEC),
            "--inventory",
            str(inventory),
            "--report-dir",
            str(reports),
        )
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
        yield inventory
    finally:
        if not os.environ.get("GPUFORGE_KEEP_LAB"):
            lifecycle.down(LAB)


def _upgrade(env: dict[str, str], inventory: Path, spec: Path, tmp: Path) -> None:
    """Regenerate the inventory from ``spec``, run the upgrade with jobs, check the outcome."""
    proc = run(env, "inventory", "generate", str(spec), "--output", str(inventory), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jobs = upgrading.submit_sleepers(LAB, CONTROLLER, JOB_NODES)
    args = ["upgrade", "run", str(spec), "--inventory", str(inventory), "--poll", "3"]
    args += ["--max-fraction", "0.5", "--report-dir", str(tmp), "--json"]
    started = time.monotonic()
    with upgrading.Sampler(LAB, CONTROLLER) as sampler:
        proc = run(env, *args)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert json.loads(proc.stdout)["status"] == "finished", proc.stdout
    LOG.info("%s: %.0f s wall", spec.name, time.monotonic() - started)
    assert len(sampler.samples) > 20
    worst = sampler.worst()
    assert 0 < len(worst) <= MAX_OUT, worst
    assert upgrading.unfinished_jobs(LAB, jobs) == {}
    plan = run(env, "upgrade", "plan", str(spec), "--inventory", str(inventory), "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["nodes_to_change"] == 0, plan.stdout
    now = upgrading.states(LAB, CONTROLLER)
    assert {n: now[n][0] for n in NODES} == dict.fromkeys(NODES, "idle"), now
    record = upgrading.upgrade_record(env, spec)
    assert record["status"] == "finished" and record["counts"] == {"done": len(NODES)}, record
    upgrading.log_timings(record)


def test_upgrade_and_rollback_move_every_node_the_same_way(
    lab: Path, env: dict[str, str], tmp_path: Path
) -> None:
    new = upgrading.spec_with(SPEC, tmp_path / "d2upg-new.yaml", NEW)
    _upgrade(env, lab, new, tmp_path / "up")
    _upgrade(env, lab, SPEC, tmp_path / "back")
