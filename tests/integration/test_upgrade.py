"""A rolling upgrade of a live lab (issue 19.5): new driver and NCCL, jobs running, a kill, limits.

The lab ``d2upg`` (tests/integration/specs/d2upg.yaml: uctl01 + ugpu01-04, 2 nodes per leaf,
32 GPUs) is deployed on the mirror's older driver and NCCL (570.124.06, 2.25.1). The test writes a
copy of the spec with the newer ones (570.133.20, 2.26.2) and, with ``sbatch`` sleep jobs on two
nodes, runs ``gpuforge upgrade run`` with ``--max-fraction 0.5`` (one leaf, 2 nodes, at once):

- a spec with an incompatible pair (a driver older than CUDA 12.8.1's minimum) is refused with
  the rule named, exit 2, before anything runs (no drain, no record);
- the run is SIGKILLed while its second wave is applying, and re-run: it finishes;
- every node ends on the new versions (asked of the nodes: ``upgrade plan --inventory`` has
  nothing left to change), validated and resumed (``sinfo``: all idle, no drain);
- no job was killed: each job's output file has its last line, written after its sleep;
- ``sinfo`` sampled every 2 s during the runs never shows more than 2 nodes out of service;
- the per-node and per-wave wall times are logged (docs/upgrades.md quotes them).

``GPUFORGE_REUSE_LAB=1`` uses an admitted d2upg lab as it is (no lab up, no deploy);
``GPUFORGE_KEEP_LAB=1`` leaves it up afterwards.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuforge.lab import cluster
from gpuforge.lab.paths import CONTAINERS_CONF
from gpuforge.slurm.control import SINFO_FORMAT, parse_sinfo

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SPEC = Path(__file__).parent / "specs" / "d2upg.yaml"
LAB = "d2upg"
CONTROLLER = "uctl01"
NODES = ("ugpu01", "ugpu02", "ugpu03", "ugpu04")
JOB_NODES = ("ugpu01", "ugpu03")
NEW = {"nvidia_driver": "570.133.20", "nccl": "2.26.2"}
MAX_OUT = 2  # --max-fraction 0.5 of 32 GPUs: one leaf of 2 nodes at once
IN_SERVICE = ("idle", "mixed", "allocated", "completing")
GPUFORGE = str(Path(sys.executable).parent / "gpuforge")
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
        ANSIBLE_CONFIG=str(cluster.state_dir(LAB) / "ansible.cfg"),
        GPUFORGE_STATE_DIR=str(state),
    )


def run(env: dict[str, str], *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUFORGE, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def ssh(node: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cluster.ssh_command(LAB, node, list(argv)),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def lab(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The d2upg lab, deployed and admitted on the older pins; yields its inventory."""
    inventory = cluster.state_dir(LAB) / "inventory"
    if os.environ.get("GPUFORGE_REUSE_LAB"):
        yield inventory
        return
    cluster.down(LAB)
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
            cluster.down(LAB)


def _spec(tmp: Path, name: str, versions: dict[str, str]) -> Path:
    doc = yaml.safe_load(SPEC.read_text())
    doc["versions"] = {**doc["versions"], **versions}
    path = tmp / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def sinfo() -> dict[str, str]:
    proc = ssh(CONTROLLER, "sinfo", "--noheader", "--Node", f"--format={SINFO_FORMAT}")
    assert proc.returncode == 0, proc.stderr
    return {r.node: r.state for r in parse_sinfo(proc.stdout)}


class Sampler(threading.Thread):
    """``sinfo`` every 2 s: the most nodes seen out of service at once, and when."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, dict[str, str]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(2.0):
            try:
                self.samples.append((time.time(), sinfo()))
            except (AssertionError, subprocess.TimeoutExpired, ValueError):
                continue  # the controller busy: a missing sample proves nothing either way

    def worst(self) -> tuple[int, dict[str, str]]:
        out = [
            {n: s for n, s in states.items() if s.rstrip("*~#!%$@^-") not in IN_SERVICE}
            for _, states in self.samples
        ]
        return max(((len(o), o) for o in out), default=(0, {}), key=lambda x: x[0])


def _record(env: dict[str, str], spec: Path) -> dict[str, Any]:
    proc = run(env, "status", str(spec), "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    status: dict[str, Any] = json.loads(proc.stdout)
    return status


def _run_and_kill(args: list[str], env: dict[str, str], spec: Path, log_path: Path) -> None:
    """Start ``args``; SIGKILL it once a node of its second wave is applying."""
    with log_path.open("w") as log:
        first = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 1500
        while first.poll() is None and time.monotonic() < deadline:
            time.sleep(3)
            ups = _record(env, spec)["upgrades"]
            steps = {n["hostname"]: (n["wave"], n["step"]) for n in ups[0]["nodes"]} if ups else {}
            if any(w >= 2 and s == "applying" for w, s in steps.values()):
                first.send_signal(signal.SIGKILL)
                first.wait(60)
                LOG.info("killed the first run at %s", steps)
                return
        first.kill()
    pytest.fail("the run ended before its second wave: " + log_path.read_text()[-4000:])


def test_incompatible_pins_refused_before_anything_runs(
    lab: Path, env: dict[str, str], tmp_path: Path
) -> None:
    bad = _spec(tmp_path, "d2upg-bad.yaml", {"nvidia_driver": "570.86.10"})
    before = sinfo()
    proc = run(env, "upgrade", "run", str(bad), "--inventory", str(lab), timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cuda-minimum-driver" in proc.stderr and "570.86.10" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sinfo() == before
    assert _record(env, SPEC)["upgrades"] == []


def test_rolling_upgrade_with_jobs_a_kill_and_limits(
    lab: Path, env: dict[str, str], tmp_path: Path
) -> None:
    new = _spec(tmp_path, "d2upg-new.yaml", NEW)
    # The roles install what the inventory pins: regenerate its generated layer from the new spec.
    proc = run(env, "inventory", "generate", str(new), "--output", str(lab), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jobs = {}
    for node in JOB_NODES:
        out = f"/var/tmp/upgrade-job-{node}.out"  # on the lab node: survives its reboot
        ssh(node, "rm", "-f", out)
        wrap = "echo started $(date +%s); sleep 90; echo finished $(date +%s)"
        proc = ssh(CONTROLLER, "sbatch", "--parsable", "-w", node, "-o", out, "--wrap", wrap)
        assert proc.returncode == 0, proc.stderr
        jobs[node] = (proc.stdout.strip(), out)
    sampler = Sampler()
    sampler.start()
    args = [GPUFORGE, "upgrade", "run", str(new), "--inventory", str(lab)]
    args += ["--max-fraction", "0.5", "--poll", "3", "--report-dir", str(tmp_path)]
    started = time.monotonic()
    try:
        # First run: killed (SIGKILL, no chance to record anything) while wave 2 applies.
        _run_and_kill(args, env, new, tmp_path / "run1.log")
        # The re-run finishes.
        second = subprocess.run(
            [*args, "--json"], env=env, capture_output=True, text=True, timeout=1800, check=False
        )
        assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
        outcome = json.loads(second.stdout)
        assert outcome["status"] == "finished"
        assert any("in flight" in n for n in outcome["notes"]), outcome["notes"]
    finally:
        sampler.stop.set()
        sampler.join(10)
    total = time.monotonic() - started
    # Limits: never more nodes out of service than one wave.
    worst, which = sampler.worst()
    assert len(sampler.samples) > 20
    assert 0 < worst <= MAX_OUT, which
    # Every node on the new versions (asked of the nodes), validated and resumed.
    plan = run(env, "upgrade", "plan", str(new), "--inventory", str(lab), "--json", timeout=300)
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["nodes_to_change"] == 0, plan.stdout
    states = sinfo()
    assert {n: states[n] for n in NODES} == dict.fromkeys(NODES, "idle"), states
    record = _record(env, new)
    upgrade = record["upgrades"][0]
    assert upgrade["status"] == "finished" and upgrade["counts"] == {"done": len(NODES)}
    # No job killed: each ran to its last line.
    for node, (job, out) in jobs.items():
        text = ssh(node, "cat", out).stdout
        assert "started" in text and "finished" in text, f"job {job} on {node}: {text!r}"
    for n in upgrade["nodes"]:
        LOG.info(
            "node %s wave %s: drain wait %.0fs, apply %.0fs, validate %.0fs, total %.0fs",
            n["hostname"],
            n["wave"],
            n["drained_s"] or 0,
            n["apply_s"] or 0,
            n["validate_s"] or 0,
            n["seconds"] or 0,
        )
    for w in upgrade["waves"]:
        LOG.info("wave %s %s: %ss", w["wave"], w["nodes"], w["seconds"])
    LOG.info("upgrade of %d nodes with a kill: %.0fs wall", len(NODES), total)
