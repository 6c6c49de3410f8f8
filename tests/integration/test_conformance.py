"""Nightly conformance on an admitted lab (issue 17 item 6), through Slurm and the collector.

The lab ``d2conf`` (specs/d2conf.yaml: cctl01 + cgpu01-04) is deployed and admitted, the node
checker installed on the GPU nodes by the health role as on any cluster (zipapp + health.yaml).

Drift is injected on chosen nodes — the simulator's ``wrong_nccl`` and an edited
``/etc/nccl.conf`` on cgpu01, a changed sysctl file and a stopped ``nvidia-dcgm`` on cgpu02, the
simulator's ``missing_peermem`` (a kernel module gone) and a Slurm ``Weight`` set by hand on
cgpu03 — and cgpu04 runs an ``sbatch`` sleep job. ``gpuforge conformance run`` (one job array in
the hidden partition, records through an in-process collector on the lab gateway) must report
exactly those items on exactly those nodes, skip cgpu04 without touching its job, and after the
roles are re-applied the second run's report must show every item fixed.
``GPUFORGE_KEEP_LAB=1`` keeps the lab for another run, ``GPUFORGE_REUSE_LAB=1`` uses an admitted
d2conf lab as it is (no lab up, no deploy).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuforge.lab import lifecycle, podman
from gpuforge.lab.paths import CONTAINERS_CONF

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SPEC = Path(__file__).parent / "specs" / "d2conf.yaml"
LAB = "d2conf"
CONTROLLER = "cctl01"
GPUS = ["cgpu01", "cgpu02", "cgpu03", "cgpu04"]
GATEWAY = "10.217.51.1"
#: Where the health role's config (the lab's site layer) sends the nodes' records.
PORT = 9477  # the in-process collector of `conformance run --collector-listen`
GPUFORGE = str(Path(sys.executable).parent / "gpuforge")
ROOT = Path(__file__).resolve().parents[2]

#: What each node must report, and nothing else.
INJECTED = {
    # wrong_nccl moves both NCCL packages, as a real downgrade of the pair would
    "cgpu01": {("package", "libnccl2"), ("package", "libnccl-dev"), ("file", "/etc/nccl.conf")},
    "cgpu02": {("file", "/etc/sysctl.d/90-gpuforge.conf"), ("service", "nvidia-dcgm")},
    # and a Weight set by hand in Slurm (scontrol update), found by the controller
    "cgpu03": {("module", "nvidia_peermem"), ("slurm", "Weight")},
}


def gpuforge(
    env: dict[str, str], *args: str, timeout: float = 1800
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUFORGE, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def ctl(env: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    """A command on the lab's Slurm controller."""
    return gpuforge(env, "lab", "ssh", "--lab", LAB, CONTROLLER, "--", *command, timeout=120)


def on(node: str, command: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return podman.exec_(f"{LAB}-{node}", ["sh", "-c", command], timeout=timeout, check=False)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return dict(
        os.environ,
        CONTAINERS_CONF=str(CONTAINERS_CONF),
        ANSIBLE_CONFIG=str(lifecycle.state_dir(LAB) / "ansible.cfg"),
        GPUFORGE_STATE_DIR=str(tmp_path_factory.mktemp("state")),
    )


@pytest.fixture(scope="module")
def lab(env: dict[str, str]) -> Iterator[Path]:
    """The admitted d2conf lab (the health role installed the node checker); yields its
    inventory."""
    inventory = lifecycle.state_dir(LAB) / "inventory"
    if os.environ.get("GPUFORGE_REUSE_LAB"):  # an admitted d2conf lab from an earlier run
        yield inventory
        return
    try:
        up = gpuforge(env, "lab", "up", str(SPEC), timeout=1200)
        assert up.returncode == 0, up.stdout + up.stderr
        done = gpuforge(
            env, "deploy", "--phase", "1", "--level", "quick", str(SPEC),
            "--inventory", str(inventory), timeout=3600,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        yield inventory
    finally:
        if not os.environ.get("GPUFORGE_KEEP_LAB"):
            lifecycle.down(LAB)


def run_conformance(
    env: dict[str, str], inventory: Path, reports: Path
) -> tuple[int, dict[str, Any]]:
    proc = gpuforge(
        env, "conformance", "run", "--inventory", str(inventory), "--via", CONTROLLER,
        "--collector-listen", f"{GATEWAY}:{PORT}", "--window", "5", "--shadow",
        "--report-dir", str(reports), timeout=900,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    latest = sorted(reports.glob("*/run-*/conformance.json"))[-1]
    return proc.returncode, json.loads(latest.read_text())


def drift_of(report: dict[str, Any]) -> dict[str, set[tuple[str, str]]]:
    return {
        node: {(d["kind"], d["item"]) for d in result["drift"]}
        for node, result in report["nodes"].items()
        if result["drift"]
    }


def inject(env: dict[str, str], tmp: Path) -> str:
    faults = tmp / "faults.yaml"
    faults.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "faults": [
                    {"node": "cgpu01", "kind": "wrong_nccl", "version": "2.25.1"},
                    {"node": "cgpu03", "kind": "missing_peermem"},
                ],
            }
        )
    )
    loaded = gpuforge(env, "lab", "faults", str(faults), "--lab", LAB, timeout=900)
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    assert on("cgpu01", "echo NCCL_DEBUG=INFO >> /etc/nccl.conf").returncode == 0
    assert (
        on("cgpu02", "echo 'vm.swappiness = 1' >> /etc/sysctl.d/90-gpuforge.conf").returncode == 0
    )
    assert on("cgpu02", "systemctl stop nvidia-dcgm").returncode == 0
    weighted = ctl(env, "scontrol", "update", "NodeName=cgpu03", "Weight=100")
    assert weighted.returncode == 0, weighted.stdout + weighted.stderr
    job = ctl(env, "sbatch", "--parsable", "-w", "cgpu04", "--exclusive", "--wrap", "sleep 1200")
    assert job.returncode == 0, job.stdout + job.stderr
    job_id = job.stdout.strip().split(";")[0]
    for _ in range(60):
        state = ctl(env, "squeue", "-h", "-j", job_id, "-o", "%T")
        if state.stdout.strip() == "RUNNING":
            return job_id
        time.sleep(2)
    pytest.fail(f"the sleep job {job_id} never started on cgpu04")


def test_conformance_finds_exactly_the_injected_drift_and_then_what_was_fixed(
    env: dict[str, str], lab: Path, tmp_path: Path
) -> None:
    reports = tmp_path / "reports"
    code, clean = run_conformance(env, lab, reports)
    assert code == 0, {n: r for n, r in clean["nodes"].items() if r["outcome"] != "pass"}
    assert drift_of(clean) == {}

    job_id = inject(env, tmp_path)
    code, first = run_conformance(env, lab, reports)
    assert code == 1
    assert drift_of(first) == INJECTED
    assert first["nodes"]["cgpu04"]["outcome"] == "not_checked"
    assert "busy" in first["nodes"]["cgpu04"]["why"]
    assert sorted(first["new_failures"]) == ["cgpu01", "cgpu02", "cgpu03"]
    still = ctl(env, "squeue", "-h", "-j", job_id, "-o", "%T")
    assert still.stdout.strip() == "RUNNING"  # the job was not disturbed

    ctl(env, "scancel", job_id)
    assert ctl(env, "scontrol", "update", "NodeName=cgpu03", "Weight=1").returncode == 0
    cleared = tmp_path / "clear.yaml"
    cleared.write_text("version: 1\nfaults: []\n")
    assert gpuforge(env, "lab", "faults", str(cleared), "--lab", LAB).returncode == 0
    playbook = str(Path(sys.executable).parent / "ansible-playbook")
    fixed = subprocess.run(
        [playbook, "-i", str(lab / "generated" / "hosts.yml"), "-i", str(lab / "site"),
         str(ROOT / "playbooks" / "site.yml"), "--limit", "cgpu01,cgpu02",
         "--tags", "base,nccl,dcgm"],
        capture_output=True, text=True, timeout=1800, env=env, check=False,
    )  # fmt: skip
    assert fixed.returncode == 0, fixed.stdout[-3000:]
    code, second = run_conformance(env, lab, reports)
    assert drift_of(second) == {}
    assert {n for n, items in second["drift_fixed"].items() if items} == set(INJECTED)
    assert sorted(second["cleared"]) == ["cgpu01", "cgpu02", "cgpu03"]
    assert code == 0
