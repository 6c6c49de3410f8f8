"""Issue 20 on the lab: the site play streamed to two execution hosts, one of them lost mid-run.

Lab ``d2exec`` (tests/integration/specs/d2exec.yaml): xctl01 (controller), xlog01 (login) and
xgpu01-04 in two SUs. xctl01 and xlog01 are set up as execution hosts by the execution_host
role (wheelhouse built here, installed offline there) and get the lab's SSH key, config and
known hosts at the paths the lab's ansible.cfg names. Then ``run_sharded`` runs ``site.yml``:
the controller first, then one shard per SU on each execution host; xlog01's container is
killed as soon as the GPU shards report their first results. Set GPUFORGE_KEEP_LAB=1 to leave
the lab up, GPUFORGE_REUSE_LAB=1 to run on a d2exec lab that is already up (a fresh one: the
tests expect nodes no play has touched).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuforge.errors import InputError
from gpuforge.execution import ExecutionHost, artifacts, run_sharded
from gpuforge.execution.executors import EXECUTION_GROUP, from_inventory
from gpuforge.inventory.reader import list_inventory
from gpuforge.lab import cluster
from gpuforge.lab.paths import CONTAINERS_CONF
from gpuforge.playbook import run_playbook

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SPEC = Path(__file__).parent / "specs" / "d2exec.yaml"
LAB = "d2exec"
EXECUTION_HOSTS = ("xctl01", "xlog01")
LOST = "xlog01"
GPUS = ("xgpu01", "xgpu02", "xgpu03", "xgpu04")
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
        xlog01: {{}}
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
    cfg = cluster.state_dir(LAB) / "ansible.cfg"
    reuse = bool(os.environ.get("GPUFORGE_REUSE_LAB")) and cfg.is_file()
    if not reuse:
        cluster.down(LAB)
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
        inv = cluster.inventory_dir(LAB)
        sdir = cluster.state_dir(LAB)
        (inv.site / "execution.yml").write_text(
            SITE_EXECUTION.format(group=EXECUTION_GROUP, ssh_config=sdir / "ssh_config")
        )
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
            cluster.down(LAB)


def _marks(lab: Path) -> list[str]:
    """Nodes on which a play has left anything of gpuforge's yet."""
    touched = []
    for node in GPUS:
        proc = subprocess.run(
            cluster.ssh_command(LAB, node, ["test", "-e", "/etc/gpuforge"]),
            capture_output=True,
            timeout=60,
            check=False,
        )
        if proc.returncode == 0:
            touched.append(node)
    return touched


def test_a_bad_execution_host_is_refused_before_any_node_is_touched(
    lab: Path, tmp_path: Path
) -> None:
    bad = ExecutionHost("xlog01-old", ssh="root@xlog01", venv="/opt/not-there")
    with pytest.raises(InputError, match="xlog01-old: unreachable or no runner"):
        run_sharded("site.yml", lab, list(GPUS), [bad], artifact_dir=tmp_path / "art")
    assert not (tmp_path / "art").exists()
    assert _marks(lab) == []


def test_site_play_on_two_execution_hosts_survives_losing_one(lab: Path, tmp_path: Path) -> None:
    executors = from_inventory(list_inventory(lab))
    assert [e.name for e in executors] == list(EXECUTION_HOSTS)
    killed = threading.Event()
    events: list[dict[str, Any]] = []

    def on_event(event: dict[str, Any]) -> None:
        events.append(event)
        host = (event.get("event_data") or {}).get("host")
        if event.get("event") == "runner_on_ok" and host in GPUS and not killed.is_set():
            killed.set()
            plan = cluster.load_plan(LAB)
            subprocess.run(
                ["podman", "kill", plan.container(LOST)],
                check=False,
                capture_output=True,
                timeout=60,
            )

    started = time.monotonic()
    result = run_sharded(
        "site.yml",
        lab,
        ["xctl01", *GPUS],
        executors,
        artifact_dir=tmp_path / "art",
        on_event=on_event,
        timeout_s=3000,
    )
    wall = time.monotonic() - started
    kept = artifacts.measure(tmp_path / "art")
    LOG.info(
        "site.yml on %d hosts via %s: %.0f s, %d bytes kept (%.0f per host), attempts %s",
        len(result.hosts),
        [e.name for e in executors],
        wall,
        kept,
        kept / 5,
        [(a.shard, a.executor, a.status, a.hosts, a.seconds) for a in result.attempts],
    )
    assert killed.is_set()
    assert result.lost_executors == [LOST]
    assert result.failed == {}
    assert result.unreachable == {}
    assert sorted(result.hosts) == sorted(["xctl01", *GPUS])
    # One attempt lost on xlog01, its shard's hosts re-run on xctl01; the other shards once.
    lost = [a for a in result.attempts if a.executor == LOST and a.status not in ("successful",)]
    assert len(lost) == 1
    retry = [a for a in result.attempts if a.shard == lost[0].shard and a.attempt == 2]
    assert retry
    assert retry[0].executor == "xctl01"
    assert set(retry[0].hosts) == set(lost[0].hosts) - set(lost[0].done)
    assert (tmp_path / "art" / "shards.json").is_file()
    # One merged stream: every GPU node's events reached the one handler.
    assert {(e.get("event_data") or {}).get("host") for e in events} >= set(GPUS)
    assert kept / 5 <= artifacts.DEFAULT_BYTES_PER_HOST
