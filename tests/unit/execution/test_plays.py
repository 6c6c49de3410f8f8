"""The play runner: local or sharded by the cluster's plan, the same for every caller."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuforge.execution import plays
from gpuforge.execution.executors import ExecutionPlan, local_hosts
from gpuforge.execution.sharded import ProjectInput, ShardedResult
from gpuforge.playbook import HostStats, RunResult


def _input(tmp_path: Path) -> ProjectInput:
    return ProjectInput("thing_src", lambda project: str(project / "thing"))


def test_no_plan_runs_one_local_play(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def local(playbook: str, sources: Any, **kw: Any) -> RunResult:
        seen.update(kw, playbook=playbook, sources=sources)
        return RunResult(
            status="successful",
            rc=0,
            hosts={"gpu01": HostStats(ok=1)},
            failed={},
            unreachable={},
            artifact_dir=tmp_path / "art",
            strategy="linear",
        )

    def sharded(*_a: Any, **_k: Any) -> None:
        raise AssertionError("no plan: no shards")

    monkeypatch.setattr(plays, "run_playbook", local)
    monkeypatch.setattr(plays, "run_sharded", sharded)
    monkeypatch.setattr(plays.InventoryDir, "open", lambda _p: type("I", (), {"sources": ("x",)})())
    result = plays.run_play(
        "remediate.yml",
        tmp_path,
        ["gpu01", "gpu02"],
        artifact_dir=tmp_path / "art",
        plan=None,
        inputs=(_input(tmp_path),),
        extravars={"remediate_action": "reset"},
        play_record=tmp_path / "rec",
    )
    assert result.hosts == {"gpu01": HostStats(ok=1)}
    assert seen["limit"] == "gpu01,gpu02"
    assert seen["extravars"] == {"remediate_action": "reset"}  # a local role builds its own
    assert seen["play_record"] == tmp_path / "rec"
    assert seen["sources"] == ("x",)


def test_a_plan_runs_shards_with_the_inputs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: dict[str, Any] = {}

    def sharded(playbook: str, inventory: Path, hosts: list[str], pool: Any, **kw: Any) -> Any:
        seen.update(kw, playbook=playbook, hosts=hosts, pool=pool)
        return ShardedResult(
            status="failed", hosts={"gpu01": HostStats()}, failed={"gpu01": "boom"}
        )

    def local(*_a: Any, **_k: Any) -> None:
        raise AssertionError("a plan: no local play")

    monkeypatch.setattr(plays, "run_sharded", sharded)
    monkeypatch.setattr(plays, "run_playbook", local)
    plan = ExecutionPlan(tuple(local_hosts(2)), max_hosts=3)
    needed = _input(tmp_path)
    result = plays.run_play(
        "site.yml", tmp_path, ["gpu01"], artifact_dir=tmp_path, plan=plan, inputs=(needed,)
    )
    assert (result.status, result.rc, result.failed) == ("failed", 2, {"gpu01": "boom"})
    assert seen["pool"] == plan.hosts
    assert seen["max_hosts"] == 3
    assert seen["inputs"] == (needed,)


def test_the_plan_comes_from_the_inventory_and_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(plays, "list_inventory", lambda _inv: {})
    monkeypatch.delenv("GPUFORGE_EXECUTION", raising=False)
    assert plays.plan_for(tmp_path) is None
    monkeypatch.setenv("GPUFORGE_EXECUTION", "local:3")
    plan = plays.plan_for(tmp_path)
    assert plan is not None
    assert [h.slots for h in plan.hosts] == [3]
