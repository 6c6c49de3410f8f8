"""The play runner: one entry point that runs a play locally or in shards, for every caller.

    result = run_play("site.yml", cluster_dir, hosts, artifact_dir=out, inputs=SITE_INPUTS)

Deploy (:mod:`gpuforge.rollout.steps`), the rolling upgrade (:mod:`gpuforge.upgrade.steps`)
and remediation run their plays through :func:`run_play`. Where a play runs is the cluster's
:class:`~gpuforge.execution.executors.ExecutionPlan` (execution hosts in the inventory, or
``GPUFORGE_EXECUTION``): none, one ``ansible-playbook`` run on this machine through the
facade (:func:`gpuforge.playbook.run_playbook`); else shards on the execution hosts
(:func:`gpuforge.execution.sharded.run_sharded`), merged into the same
:class:`~gpuforge.playbook.RunResult`.

This module knows no role and no playbook. What a play needs built on this machine when it runs
elsewhere (a file a role would build with gpuforge) is the caller's :class:`ProjectInput`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuforge.execution.executors import ExecutionPlan
from gpuforge.execution.executors import plan as execution_plan
from gpuforge.execution.sharded import ProjectInput, run_sharded
from gpuforge.inventory.reader import InventoryDir, list_inventory
from gpuforge.playbook import EventHandler, RunResult, run_playbook

__all__ = ["ProjectInput", "plan_for", "run_play"]


def plan_for(inventory: Path) -> ExecutionPlan | None:
    """The cluster's execution plan: its inventory's execution hosts, or ``GPUFORGE_EXECUTION``;
    None for one plain ``ansible-playbook`` run."""
    return execution_plan(list_inventory(inventory), os.environ)


def run_play(
    playbook: str | Path,
    inventory: Path,
    hosts: Sequence[str],
    *,
    artifact_dir: Path,
    plan: ExecutionPlan | None,
    inputs: Sequence[ProjectInput] = (),
    extravars: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    tags: str | None = None,
    forks: int = 16,
    timeout_s: int = 3600,
    on_event: EventHandler | None = None,
    play_record: Path | None = None,
) -> RunResult:
    """Run ``playbook`` on ``hosts`` of the cluster directory ``inventory`` as ``plan`` says.

    ``plan`` None: one local ``ansible-playbook`` run under the play guard, its process group
    recorded in ``play_record``. Otherwise shards on ``plan``'s execution hosts, cut to its
    ``max_hosts``; ``inputs`` are built once here and shipped with every shard's project (a
    role that would build them itself finds no gpuforge on an execution host).
    """
    if plan is not None:
        return run_sharded(
            playbook,
            inventory,
            list(hosts),
            plan.hosts,
            artifact_dir=artifact_dir,
            max_hosts=plan.max_hosts,
            inputs=inputs,
            extravars=extravars,
            env=env,
            tags=tags,
            forks=forks,
            timeout_s=timeout_s,
            on_event=on_event,
        ).as_run_result()
    return run_playbook(
        playbook,
        InventoryDir.open(inventory).sources,
        limit=",".join(hosts),
        extravars=extravars,
        tags=tags,
        artifact_dir=artifact_dir,
        on_event=on_event,
        timeout_s=timeout_s,
        forks=forks,
        play_record=play_record,
        env=env,
    )
