"""Real Slurm jobs across the scenario's containers, run from the controller."""

from __future__ import annotations

import shlex
import time
from typing import Any

import pytest

from gpuforge.command import CommandResult
from gpuforge.slurm import control as slurm

testinfra_hosts = ["ansible://gfslurm-ctl01"]

NODES = ["gfslurm-gpu01", "gfslurm-gpu02"]
SRUN = "timeout 120 srun --immediate=60"


class HostRunner:
    """A command runner over testinfra's connection to the controller."""

    def __init__(self, host: Any) -> None:
        self.host = host

    def run(self, host: str, command: str, *, timeout: float) -> CommandResult:
        cmd = self.host.run(f"timeout {int(timeout)} sh -c {shlex.quote(command)}")
        return CommandResult(host, command, cmd.rc, cmd.stdout, cmd.stderr)


def controller(host: Any) -> slurm.SlurmClient:
    """gpuforge's Slurm operations, run on the controller through testinfra's connection."""
    return slurm.SlurmClient(HostRunner(host), "gfslurm-ctl01")


def sinfo(host: Any) -> dict[str, slurm.SinfoRow]:
    out = host.check_output(f"sinfo --noheader --Node --format='{slurm.SINFO_FORMAT}'")
    return {row.node: row for row in slurm.parse_sinfo(out)}


def wait_idle(host: Any, node: str, timeout: float = 90.0) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = sinfo(host)[node].state
        if state == "idle":
            break
        time.sleep(2)
    return state


@pytest.mark.parametrize("node", NODES)
def test_new_node_joins_drained_and_is_idle_once_admitted(host: Any, node: str) -> None:
    """The role holds a node whose slurmd starts for the first time; admission resumes it.

    Runs right after the first converge (molecule's verify): the node has never been resumed.
    """
    row = sinfo(host)[node]
    assert (row.state, row.reason) == ("drained", "gpuforge:join:validate")
    slurm.resume(controller(host), node, "molecule: admitted")
    assert wait_idle(host, node) == "idle"


@pytest.mark.parametrize("node", NODES)
def test_node_partitions_are_gpu_and_the_hidden_conformance_one(host: Any, node: str) -> None:
    # --all: the conformance partition is Hidden (nightly conformance, docs/conformance.md).
    out = host.check_output(f"sinfo --all --noheader --Node --format='{slurm.SINFO_FORMAT}'")
    partitions = {row.partition.rstrip("*") for row in slurm.parse_sinfo(out) if row.node == node}
    assert partitions == {"gpu", "conformance"}


@pytest.mark.parametrize("node", NODES)
def test_node_has_gpu_gres(host: Any, node: str) -> None:
    assert sinfo(host)[node].gres == "gpu:h100:8"


def test_srun_two_nodes_gives_two_hostnames(host: Any) -> None:
    out = host.check_output(f"{SRUN} -N2 hostname")
    assert sorted(out.split()) == NODES


def test_gpu_partition_job_with_gres(host: Any) -> None:
    out = host.check_output(f"{SRUN} -p gpu -N2 --gres=gpu:h100:8 hostname")
    assert sorted(out.split()) == NODES


def test_job_within_one_switch(host: Any) -> None:
    out = host.check_output(f"{SRUN} -N2 --switches=1@00:00:30 hostname")
    assert sorted(out.split()) == NODES


def test_topology_matches_generated_file(host: Any) -> None:
    out = host.check_output("scontrol show topology")
    leaf = next(line for line in out.splitlines() if line.startswith("SwitchName=leaf-su01"))
    assert "Level=0" in leaf
    assert "Nodes=gfslurm-gpu[01-02]" in leaf


def test_topology_has_spine_above_leaf(host: Any) -> None:
    out = host.check_output("scontrol show topology")
    spine = next(line for line in out.splitlines() if line.startswith("SwitchName=spine"))
    assert "Level=1" in spine
    assert "Switches=leaf-su01" in spine


def test_configless_nodes_fetch_configuration(host: Any) -> None:
    out = host.check_output("scontrol show config")
    assert "enable_configless" in out


def test_drained_node_gets_no_work_and_returns_after_resume(host: Any) -> None:
    runner = controller(host)
    reason = "molecule: drain test"
    drained = slurm.drain(runner, NODES[0], reason)
    assert [c.changed for c in drained] == [True]
    again = slurm.drain(runner, NODES[0], reason)
    assert [c.changed for c in again] == [False]
    row = sinfo(host)[NODES[0]]
    assert (row.state, row.reason) == ("drained", reason)
    placed = {host.check_output(f"{SRUN} -N1 hostname").strip() for _ in range(4)}
    assert placed == {NODES[1]}
    two = host.run("timeout 60 srun --immediate=5 -N2 hostname")
    assert two.rc != 0
    resumed = slurm.resume(runner, NODES[0], "molecule: resume test")
    assert [c.changed for c in resumed] == [True]
    assert wait_idle(host, NODES[0]) == "idle"
    out = host.check_output(f"{SRUN} -N2 hostname")
    assert sorted(out.split()) == NODES
