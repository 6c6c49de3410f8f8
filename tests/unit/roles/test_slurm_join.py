"""The slurm role's join hold and wait (roles/slurm/tasks/join.yml, joined.yml) against a fake
``scontrol`` that follows slurmctld 22.05's rules for a registering node.

The fake keeps one node's state in a JSON file. ``scontrol update`` applies what
src/slurmctld/node_mgr.c ``update_node`` does for DOWN, RESUME and DRAIN; every ``show node``
first lets the node register, as its slurmd would, with ``validate_node_specs``' rule: a DOWN
node returns to service only when its reason is still "Not responding" (ReturnToService=1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuforge.resources import project_path

pytestmark = pytest.mark.slow

TASKS = project_path("roles") / "slurm" / "tasks"
JOIN_REASON = "gpuforge:join:validate"

FAKE_SCONTROL = r"""#!PYTHON
import json, os, sys
path = os.environ["FAKE_SLURM_STATE"]
node = json.load(open(path))
args = sys.argv[1:]
flags = lambda: set(node["state"].split("+")[1:])
def save():
    json.dump(node, open(path, "w"))
if args[:1] == ["update"]:
    opts = dict(a.split("=", 1) for a in args[1:])
    node["log"].append(opts["State"])
    base, *rest = node["state"].split("+")
    rest = [f for f in rest if f]
    if opts["State"] == "DOWN":
        base, rest = "DOWN", [f for f in rest if f != "DRAIN"]
    elif opts["State"] == "RESUME":
        if base != "DOWN" and "DRAIN" not in rest:
            print("slurm_update error: Invalid node state specified", file=sys.stderr)
            sys.exit(1)
        rest = [f for f in rest if f != "DRAIN"]
        if base == "DOWN":
            base = "IDLE"
            rest = sorted(set(rest) | {"NOT_RESPONDING"})
    elif opts["State"] == "DRAIN":
        rest = sorted(set(rest) | {"DRAIN"})
    if "Reason" in opts:
        node["reason"] = opts["Reason"]
    node["state"] = "+".join([base, *rest])
    save()
    sys.exit(0)
if node.get("registers"):
    base, *rest = node["state"].split("+")
    rest = [f for f in rest if f != "NOT_RESPONDING"]
    if base == "UNKNOWN" or (base == "DOWN" and node["reason"] == "Not responding"):
        base = "IDLE"
    node["state"] = "+".join([base, *rest])
    node["started"] = True
    save()
start = "2026-11-30T15:06:40" if node.get("started") else "None"
reason = f" Reason={node['reason']} [slurm@2026-11-30T15:00:00]" if node["reason"] else ""
print(f"NodeName=gpu05 Arch=x86_64 CoresPerSocket=56 State={node['state']} "
      f"ThreadsPerCore=2 SlurmdStartTime={start} LastBusyTime=2026-11-30T15:01:02{reason}")
"""


def run_join(
    tmp_path: Path, *, state: str, reason: str, slurmd: str = "inactive"
) -> dict[str, Any]:
    """Run join.yml, then joined.yml (slurmd 'registers'), on localhost; return the outcome."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"
    fake.write_text(FAKE_SCONTROL.replace("PYTHON", sys.executable, 1))
    fake.chmod(0o755)
    node_file = tmp_path / "node.json"
    node_file.write_text(json.dumps({"state": state, "reason": reason, "log": []}))
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        f"""- hosts: localhost
  gather_facts: false
  vars:
    slurm_controllers: [localhost]
    slurm_join_drained_reason: "{JOIN_REASON}"
    slurm_wait_timeout: 1
    __slurm_slurmd_state: {{stdout: {slurmd}}}
  tasks:
    - ansible.builtin.import_tasks: {TASKS / "join.yml"}
    - name: Let slurmd register
      ansible.builtin.shell: >-
        {sys.executable} -c "import json,sys; p=sys.argv[1]; d=json.load(open(p));
        d['registers']=True; json.dump(d,open(p,'w'))" {node_file}
      changed_when: true
    - ansible.builtin.import_tasks: {TASKS / "joined.yml"}
"""
    )
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        FAKE_SLURM_STATE=str(node_file),
        ANSIBLE_CONFIG=str(tmp_path / "none.cfg"),
        ANSIBLE_LOCALHOST_WARNING="false",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        ANSIBLE_NOCOLOR="1",
    )
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-c", "local", str(playbook)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    node = json.loads(node_file.read_text())
    return {"rc": proc.returncode, "out": proc.stdout + proc.stderr, **node}


def test_a_node_slurm_marked_down_while_absent_joins_drained_and_comes_up(tmp_path: Path) -> None:
    # Phase 2 on a fresh lab: slurmctld marked the not-yet-provisioned node DOWN during phase 1.
    got = run_join(tmp_path, state="DOWN+NOT_RESPONDING", reason="Not responding")
    assert got["rc"] == 0, got["out"]
    assert got["log"] == ["DOWN", "RESUME", "DRAIN"]
    assert got["state"] == "IDLE+DRAIN"
    assert got["reason"] == JOIN_REASON


def test_a_first_join_of_a_node_never_seen_is_held_drained(tmp_path: Path) -> None:
    got = run_join(tmp_path, state="UNKNOWN+NOT_RESPONDING", reason="")
    assert got["rc"] == 0, got["out"]
    assert got["state"] == "IDLE+DRAIN"
    assert got["reason"] == JOIN_REASON


def test_an_operators_drain_is_left_alone(tmp_path: Path) -> None:
    got = run_join(tmp_path, state="UNKNOWN+DRAIN+NOT_RESPONDING", reason="bad PSU")
    assert got["rc"] == 0, got["out"]
    assert got["log"] == []
    assert (got["state"], got["reason"]) == ("IDLE+DRAIN", "bad PSU")


def test_a_failed_wait_says_what_slurm_reported(tmp_path: Path) -> None:
    # An operator's DOWN is not ours to lift: the node stays DOWN and the wait must say so.
    got = run_join(tmp_path, state="DOWN+NOT_RESPONDING", reason="bad PSU")
    assert got["rc"] != 0
    assert got["log"] == []
    assert "slurmctld on localhost reports localhost State=DOWN" in got["out"]
    assert "Reason=bad PSU [slurm@" in got["out"]
