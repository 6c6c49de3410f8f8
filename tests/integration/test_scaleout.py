"""Issue 20 on the lab: a deploy on two execution hosts, one of them lost mid-run.

Lab ``d2exec`` (tests/integration/specs/d2exec.yaml): xctl01 (controller), xlog01 (login) and
xgpu01-08 in two SUs of four. xctl01 and xlog01 are set up as execution hosts by the execution_host
role (wheelhouse built here, installed offline there) and get the lab's SSH key, config and
known hosts at the paths the lab's ansible.cfg names; the site layer names them in
``gpuforge_execution_hosts``. Then the operator's command, ``gpuforge deploy --phase 1``, runs
its plays as shards: the infrastructure nodes first, then one shard per SU on each execution
host; xlog01's container is killed once both GPU shards are under way. Set GPUFORGE_KEEP_LAB=1
to leave the lab up, GPUFORGE_REUSE_LAB=1 to run on a d2exec lab that is already up (a fresh
one: the tests expect nodes no play has touched).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuforge.execution import artifacts
from gpuforge.execution.executors import EXECUTION_GROUP, from_inventory
from gpuforge.inventory.reader import list_inventory
from gpuforge.lab import lifecycle
from gpuforge.lab.paths import CONTAINERS_CONF
from gpuforge.playbook import run_playbook

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SPEC = Path(__file__).parent / "specs" / "d2exec.yaml"
LAB = "d2exec"
EXECUTION_HOSTS = ("xctl01", "xlog01")
LOST = "xlog01"
GPUS = tuple(f"xgpu{n:02d}" for n in range(1, 9))
GPUFORGE = str(Path(sys.executable).parent / "gpuforge")
DEPLOY_TIMEOUT_S = 3600
LOG = logging.getLogger(__name__)

SITE_EXECUTION = """\
all:
  children:
    {group}:
      vars:
        ansible_user: root
        gpuforge_execution_ssh_args: [-F, {ssh_config}]
      hosts:
        xctl01: {{}}
        xlog01: {{{xlog01}}}
"""

LAB_SSH_PLAY = """\
- name: Give the execution hosts the lab's way to reach the nodes
  hosts: {group}
  gather_facts: false
  tasks:
    - name: Create the lab's directories
      ansible.builtin.file:
        path: "{{{{ item }}}}"
        state: directory
        mode: "0700"
      loop: {dirs}

    - name: Copy the lab's SSH key, config and known hosts to the same paths
      ansible.builtin.copy:
        src: "{{{{ item }}}}"
        dest: "{{{{ item }}}}"
        mode: "0600"
      loop: {files}
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[Path]:
    """The d2exec lab with xctl01 and xlog01 set up as execution hosts; yields the cluster dir."""
    os.environ.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    cfg = lifecycle.state_dir(LAB) / "ansible.cfg"
    reuse = bool(os.environ.get("GPUFORGE_REUSE_LAB")) and cfg.is_file()
    if not reuse:
        lifecycle.down(LAB)
    old_cfg = os.environ.get("ANSIBLE_CONFIG")
    old_path = os.environ["PATH"]
    # As the gpuforge command does: ansible-runner looks ansible-playbook up on PATH.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{old_path}"
    try:
        if not reuse:
            proc = subprocess.run(
                [str(Path(sys.executable).parent / "gpuforge"), "lab", "up", str(SPEC)],
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        os.environ["ANSIBLE_CONFIG"] = str(cfg)
        inv = lifecycle.inventory_dir(LAB)
        sdir = lifecycle.state_dir(LAB)
        (inv.site / "execution.yml").write_text(_site_execution(sdir))
        files = [str(p) for p in (sdir / "ssh_config", sdir / "known_hosts")]
        files += [str(p) for p in (sdir / "ssh").iterdir()]
        play = sdir / "lab_ssh.yml"
        dirs = sorted({str(Path(f).parent) for f in files})
        play.write_text(LAB_SSH_PLAY.format(group=EXECUTION_GROUP, files=files, dirs=dirs))
        for playbook in (play, "execution_hosts.yml"):
            result = run_playbook(
                playbook, inv.sources, limit=",".join(EXECUTION_HOSTS), timeout_s=1200
            )
            assert result.status == "successful", (playbook, result.failed, result.unreachable)
        yield inv.root
    finally:
        os.environ["PATH"] = old_path
        if old_cfg is None:
            os.environ.pop("ANSIBLE_CONFIG", None)
        else:
            os.environ["ANSIBLE_CONFIG"] = old_cfg
        if not os.environ.get("GPUFORGE_KEEP_LAB"):
            lifecycle.down(LAB)


def _site_execution(sdir: Path, xlog01: str = "") -> str:
    return SITE_EXECUTION.format(
        group=EXECUTION_GROUP, ssh_config=sdir / "ssh_config", xlog01=xlog01
    )


def _marks(lab: Path) -> list[str]:
    """Nodes on which a play has left anything of gpuforge's yet."""
    touched = []
    for node in GPUS:
        proc = subprocess.run(
            lifecycle.ssh_command(LAB, node, ["test", "-e", "/etc/gpuforge"]),
            capture_output=True,
            timeout=60,
            check=False,
        )
        if proc.returncode == 0:
            touched.append(node)
    return touched


def _deploy(lab: Path, state: Path, reports: Path) -> subprocess.Popen[str]:
    env = dict(
        os.environ,
        CONTAINERS_CONF=str(CONTAINERS_CONF),
        ANSIBLE_CONFIG=str(lifecycle.state_dir(LAB) / "ansible.cfg"),
        GPUFORGE_STATE_DIR=str(state),
    )
    argv = [GPUFORGE, "deploy", "--phase", "1", "--level", "quick", str(SPEC)]
    argv += ["--inventory", str(lab), "--report-dir", str(reports)]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def test_a_bad_execution_host_is_refused_before_any_node_is_touched(
    lab: Path, tmp_path: Path
) -> None:
    site = lifecycle.inventory_dir(LAB).site / "execution.yml"
    good = site.read_text()
    site.write_text(
        _site_execution(lifecycle.state_dir(LAB), "gpuforge_runner_venv: /opt/not-there")
    )
    try:
        proc = _deploy(lab, tmp_path / "state", tmp_path / "reports")
        out, err = proc.communicate(timeout=600)
    finally:
        site.write_text(good)
    assert proc.returncode == 2, out[-3000:] + err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    assert "xlog01: unreachable or no runner in /opt/not-there" in errors[0]
    assert "Traceback" not in err
    assert _marks(lab) == []


def _kill_when_both_gpu_shards_run(reports: Path, proc: subprocess.Popen[str]) -> float | None:
    """Kill xlog01's container once both GPU shards' plays have started and run a while.

    The kept events of a shard attempt land in ``<run>/ansible/provision/<shard>-<n>/job_events``
    as the process side reads them: both first attempts there means both execution hosts are
    running a GPU shard. Returns the monotonic time of the kill (None: the deploy ended first).
    """
    started: dict[str, float] = {}
    while proc.poll() is None:
        for shard in ("su_01-1", "su_02-1"):
            found = list(reports.glob(f"*/phase_01-*/ansible/provision/{shard}/job_events/*.json"))
            if found and shard not in started:
                started[shard] = time.monotonic()
        # Half a minute into the second shard: its nodes are mid-play (packages, services).
        if len(started) == 2 and time.monotonic() - max(started.values()) > 30:
            plan = lifecycle.load_plan(LAB)
            subprocess.run(
                ["podman", "kill", plan.container(LOST)],
                check=False,
                capture_output=True,
                timeout=60,
            )
            return time.monotonic()
        time.sleep(2)
    return None


def test_deploy_on_two_execution_hosts_survives_losing_one(lab: Path, tmp_path: Path) -> None:
    executors = from_inventory(list_inventory(lab))
    assert [e.name for e in executors] == list(EXECUTION_HOSTS)
    reports = tmp_path / "reports"
    started = time.monotonic()
    proc = _deploy(lab, tmp_path / "state", reports)
    output: dict[str, str] = {}

    def drain() -> None:
        output["out"], output["err"] = proc.communicate(timeout=DEPLOY_TIMEOUT_S)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    killed = _kill_when_both_gpu_shards_run(reports, proc)
    reader.join(DEPLOY_TIMEOUT_S)
    wall = time.monotonic() - started
    out, err = output.get("out", ""), output.get("err", "")
    LOG.info("deploy output:\n%s\n%s", out[-4000:], err[-2000:])
    assert killed is not None, "the deploy ended before both GPU shards ran"
    assert proc.returncode == 0, out[-4000:] + err[-3000:]

    (run_dir,) = reports.glob("*/phase_01-*")
    record = json.loads((run_dir / "ansible" / "provision" / "shards.json").read_text())
    kept = artifacts.measure(run_dir / "ansible" / "provision")
    hosts = ["xctl01", "xlog01", *GPUS]
    LOG.info(
        "deploy: %.0f s (xlog01 killed at %.0f s); provision kept %d bytes, %.0f per host;"
        " attempts %s",
        wall,
        killed - started,
        kept,
        kept / len(hosts),
        [
            (a["shard"], a["executor"], a["status"], a["hosts"], a["done"], a["seconds"])
            for a in record["attempts"]
        ],
    )
    # One record of the provisioning over every shard and attempt.
    assert record["lost_executors"] == [LOST]
    assert record["failed"] == {}
    assert record["unreachable"] == {}
    assert sorted(record["hosts"]) == sorted(hosts)
    attempts = record["attempts"]
    lost = [a for a in attempts if a["executor"] == LOST and a["status"] != "successful"]
    assert len(lost) == 1
    assert lost[0]["shard"].startswith("su_")
    retry = [a for a in attempts if a["shard"] == lost[0]["shard"] and a["attempt"] == 2]
    assert len(retry) == 1
    assert retry[0]["executor"] == "xctl01"
    assert retry[0]["status"] == "successful"
    # Hosts the lost attempt had finished are not provisioned again.
    assert set(retry[0]["hosts"]) == set(lost[0]["hosts"]) - set(lost[0]["done"])
    # One progress display: the merged events of every shard in the deploy's own output.
    assert f"provision: {len(GPUS)} hosts" in out
    # The rollout's record: every GPU node admitted.
    status = subprocess.run(
        [GPUFORGE, "status", str(SPEC), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=dict(os.environ, GPUFORGE_STATE_DIR=str(tmp_path / "state")),
    )
    assert status.returncode == 0, status.stderr
    assert [p["counts"] for p in json.loads(status.stdout)["phases"]] == [{"admitted": len(GPUS)}]
    assert kept / len(hosts) <= artifacts.DEFAULT_BYTES_PER_HOST
