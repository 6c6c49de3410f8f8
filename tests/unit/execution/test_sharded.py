"""Real plays through ansible-runner's transmit -> worker -> process, on this machine."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from gpuforge.errors import InputError
from gpuforge.execution import ExecutionHost, artifacts, run_sharded
from gpuforge.execution.executors import LOCAL
from gpuforge.rollout.steps import SITE_INPUTS

from .conftest import PLAY

pytestmark = pytest.mark.slow


def _marks(mark_dir: Path, host: str) -> int:
    path = mark_dir / host
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_two_local_workers_run_the_shards_into_one_result(cluster: Path, tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    mark.mkdir()
    seen: list[dict[str, Any]] = []
    inside: list[int] = []
    lock = threading.Lock()

    def on_event(event: dict[str, Any]) -> None:
        if not lock.acquire(blocking=False):
            inside.append(1)  # two shards' events at once: the display would interleave
            return
        try:
            seen.append(event)
        finally:
            lock.release()

    hosts = ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05"]
    result = run_sharded(
        PLAY,
        cluster,
        hosts,
        [ExecutionHost("local", None, venv=LOCAL.venv, slots=2)],
        artifact_dir=tmp_path / "art",
        max_hosts=2,
        extravars={"mark_dir": str(mark)},
        on_event=on_event,
    )
    assert result.status == "failed"
    assert result.failed == {"gpu03": "Fail on gpu03: gpu03 is broken"}
    assert sorted(result.hosts) == hosts
    assert result.hosts["gpu02"].changed == 1
    assert result.hosts["gpu01"].changed == 0
    assert [_marks(mark, h) for h in hosts] == [1, 1, 1, 1, 1]
    assert sorted(a.shard for a in result.attempts) == ["su_01.1", "su_01.2", "su_01.3"]
    assert not inside
    assert {e["event_data"].get("host") for e in seen if e.get("event") == "runner_on_ok"} == set(
        hosts
    )
    record = json.loads((tmp_path / "art" / "shards.json").read_text())
    assert record["failed"] == {"gpu03": "Fail on gpu03: gpu03 is broken"}
    assert len(record["attempts"]) == 3
    # Bounded: only the summary, failed and changed events are on disk, well under the target.
    kept = [
        json.loads(p.read_text())["event"] for p in (tmp_path / "art").glob("*/job_events/*.json")
    ]
    assert "runner_on_failed" in kept
    assert "playbook_on_stats" in kept
    assert "runner_on_skipped" not in kept
    assert artifacts.measure(tmp_path / "art") / len(hosts) < artifacts.DEFAULT_BYTES_PER_HOST


def _dying_venv(root: Path, mark: Path) -> str:
    """A runner install whose worker dies (its whole process group) once gpu04 pauses."""
    (root / "bin").mkdir(parents=True)
    python = root / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {LOCAL.venv}/bin/python "$@"\n')
    runner = root / "bin" / "ansible-runner"
    runner.write_text(
        "#!/bin/sh\n"
        "exec 3<&0\n"
        f'export PATH="{LOCAL.venv}/bin:$PATH"\n'
        f'{LOCAL.venv}/bin/ansible-runner "$@" <&3 &\n'
        "n=0\n"
        f"while [ ! -e {mark}/gpu04.paused ] && [ $n -lt 600 ]; do sleep 0.2; n=$((n+1)); done\n"
        f"touch {mark}/no-pause\n"
        "kill -9 0\n"
    )
    for path in (python, runner):
        path.chmod(0o755)
    return str(root)


def test_a_lost_execution_host_shard_reruns_elsewhere_without_its_finished_hosts(
    cluster: Path, tmp_path: Path
) -> None:
    mark = tmp_path / "mark"
    mark.mkdir()
    dying = ExecutionHost("ex-dying", None, venv=_dying_venv(tmp_path / "dying", mark))
    good = ExecutionHost("ex-good", None, venv=LOCAL.venv)
    result = run_sharded(
        PLAY,
        cluster,
        ["gpu03", "gpu04"],
        [dying, good],
        artifact_dir=tmp_path / "art",
        extravars={"mark_dir": str(mark), "pause_s": 120},
    )
    assert result.lost_executors == ["ex-dying"]
    first, second = result.attempts
    assert (first.executor, first.hosts, first.done) == ("ex-dying", ("gpu03", "gpu04"), ("gpu03",))
    assert (second.executor, second.hosts, second.status) == ("ex-good", ("gpu04",), "successful")
    # gpu03 had finished (failed) before the loss: it keeps its result and is not run again.
    assert result.failed == {"gpu03": "Fail on gpu03: gpu03 is broken"}
    assert _marks(mark, "gpu03") == 1
    assert _marks(mark, "gpu04") == 2
    assert result.hosts["gpu04"].failures == 0


def test_a_bad_execution_host_is_refused_before_any_node_is_touched(
    cluster: Path, tmp_path: Path
) -> None:
    mark = tmp_path / "mark"
    mark.mkdir()
    bad = ExecutionHost("ex-bad", "nobody@192.0.2.1", ssh_args=("-o", "ConnectTimeout=1"))
    with pytest.raises(InputError, match="ex-bad: unreachable"):
        run_sharded(
            PLAY,
            cluster,
            ["gpu01"],
            [LOCAL, bad],
            artifact_dir=tmp_path / "art",
            extravars={"mark_dir": str(mark)},
        )
    assert not list(mark.iterdir())
    assert not (tmp_path / "art").exists()


BUNDLE_PLAY = """\
- name: Look for the node checker the health role would install
  hosts: all
  gather_facts: false
  tasks:
    - name: Stat the checker on the machine that runs Ansible
      ansible.builtin.stat:
        path: "{{ health_bundle_src }}"
        checksum_algorithm: sha256
      register: checker
      delegate_to: localhost
    - name: Assert it came with the shard's project
      ansible.builtin.assert:
        that:
          - checker.stat.exists
          - checker.stat.path.startswith(playbook_dir | dirname)
    - name: Write its checksum down
      ansible.builtin.copy:
        content: "{{ checker.stat.checksum }}"
        dest: "{{ checksum_file }}"
        mode: "0644"
      delegate_to: localhost
"""


def test_the_node_checker_is_built_once_and_shipped_with_the_project(
    cluster: Path, tmp_path: Path
) -> None:
    # An execution host's runner has no gpuforge package to build the checker with.
    play = tmp_path / "bundle_play.yml"
    play.write_text(BUNDLE_PLAY)
    result = run_sharded(
        play,
        cluster,
        ["gpu01"],
        None,
        artifact_dir=tmp_path / "art",
        extravars={"checksum_file": str(tmp_path / "sum")},
        inputs=SITE_INPUTS,  # what deploy and upgrade pass with site.yml
    )
    assert result.failed == {}
    assert result.status == "successful"
    # Byte for byte the archive the health role builds itself (a fresh interpreter): built in
    # this process, its bytecode differed and every converged node took a "changed" checker.
    subprocess.run(
        [sys.executable, "-m", "gpuforge.node.bundle", str(tmp_path / "role.pyz")],
        check=True,
        timeout=120,
        capture_output=True,
    )
    role = hashlib.sha256((tmp_path / "role.pyz").read_bytes()).hexdigest()
    assert (tmp_path / "sum").read_text() == role
