"""AnsibleSteps sends its plays to gpuforge.execution when an execution plan is set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuforge.execution import plays
from gpuforge.execution.executors import ExecutionPlan, local_hosts
from gpuforge.execution.sharded import ShardedResult
from gpuforge.playbook import HostStats
from gpuforge.rollout import steps


def test_provision_runs_sharded_and_reports_failed_hosts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[dict[str, Any]] = []

    def fake_sharded(
        playbook: str, inventory: Path, hosts: list[str], pool: Any, **kw: Any
    ) -> ShardedResult:
        calls.append({"playbook": playbook, "hosts": hosts, "pool": pool, **kw})
        return ShardedResult(
            status="failed",
            hosts={h: HostStats(ok=1) for h in hosts},
            failed={"gpu02": "task: boom"},
            artifact_dir=kw["artifact_dir"],
        )

    def no_direct(*_a: Any, **_k: Any) -> None:
        raise AssertionError("the direct facade must not run when a plan is set")

    monkeypatch.setattr(plays, "run_sharded", fake_sharded)
    monkeypatch.setattr(plays, "run_playbook", no_direct)
    plan = ExecutionPlan(tuple(local_hosts(2)), max_hosts=4)
    ansible = steps.AnsibleSteps(
        inventory=tmp_path,
        artifacts=tmp_path / "art",
        validate_fn=lambda *_: None,  # type: ignore[arg-type]
        admission=None,  # type: ignore[arg-type]
        execution=plan,
    )
    failed = ansible.provision(["gpu01", "gpu02"])
    assert failed == {"gpu02": "task: boom"}
    assert calls[0]["playbook"] == "site.yml"
    assert calls[0]["max_hosts"] == 4
    assert calls[0]["pool"] == plan.hosts
    assert ansible.runs["provision"].failed == {"gpu02": "task: boom"}
    assert calls[0]["inputs"] == steps.SITE_INPUTS  # the health role's checker, built here
