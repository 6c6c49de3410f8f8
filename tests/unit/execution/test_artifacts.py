from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuforge.execution import artifacts


def _event(kind: str, **res: Any) -> dict[str, Any]:
    return {"event": kind, "event_data": {"host": "n1", "res": res}}


@pytest.mark.parametrize(
    ("event", "kept"),
    [
        (_event("runner_on_failed", msg="x"), True),
        (_event("runner_on_unreachable", msg="x"), True),
        (_event("playbook_on_stats"), True),
        (_event("runner_on_ok", changed=True), True),
        (_event("runner_on_ok", changed=False), False),
        (_event("runner_on_skipped"), False),
        (_event("runner_on_start"), False),
        (_event("verbose"), False),
    ],
)
def test_keep_event(event: dict[str, Any], kept: bool) -> None:
    assert artifacts.keep_event(event) is kept


def test_prune_keeps_summary_failed_and_changed_only(tmp_path: Path) -> None:
    events = tmp_path / "job_events"
    events.mkdir()
    for n, event in enumerate(
        [_event("runner_on_ok", changed=False), _event("runner_on_ok", changed=True)]
    ):
        (events / f"{n}-x.json").write_text(json.dumps(event))
    (tmp_path / "stdout").write_text("transcript " * 1000)
    (tmp_path / "status").write_text("successful")
    artifacts.prune(tmp_path)
    assert sorted(p.name for p in events.iterdir()) == ["1-x.json"]
    assert not (tmp_path / "stdout").exists()
    assert (tmp_path / "status").read_text() == "successful"
    assert artifacts.measure(tmp_path) < 500


def test_budget_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFORGE_ARTIFACT_BYTES_PER_HOST", "1234")
    assert artifacts.bytes_per_host_budget() == 1234
    monkeypatch.delenv("GPUFORGE_ARTIFACT_BYTES_PER_HOST")
    assert artifacts.bytes_per_host_budget() == artifacts.DEFAULT_BYTES_PER_HOST


def test_enforce_slims_changed_events_but_never_failures(tmp_path: Path) -> None:
    events = tmp_path / "job_events"
    events.mkdir()
    big = "x" * 20_000
    (events / "1-a.json").write_text(json.dumps(_event("runner_on_ok", changed=True, stdout=big)))
    (events / "2-b.json").write_text(json.dumps(_event("runner_on_failed", msg="m", stdout=big)))
    assert artifacts.enforce(tmp_path, budget=25_000) is True
    slim = json.loads((events / "1-a.json").read_text())
    assert slim["event_data"]["res"]["gpuforge_slimmed"] is True
    assert slim["event_data"]["host"] == "n1"
    assert json.loads((events / "2-b.json").read_text())["event_data"]["res"]["stdout"] == big
    assert artifacts.measure(tmp_path) <= 25_000


def test_enforce_leaves_a_run_within_budget_alone(tmp_path: Path) -> None:
    events = tmp_path / "job_events"
    events.mkdir()
    text = json.dumps(_event("runner_on_ok", changed=True, stdout="y" * 100))
    (events / "1-a.json").write_text(text)
    assert artifacts.enforce(tmp_path, budget=10_000) is False
    assert (events / "1-a.json").read_text() == text


def _runner_event(counter: int, host: str) -> dict[str, Any]:
    """A changed result as ansible-runner writes it: ~1 kB of envelope around a small result."""
    play = "4aaf31de-956b-8522-fbb2-0000000000e0"
    return {
        "uuid": f"8c8e816c-40bf-4eef-a6d2-{counter:012d}",
        "counter": counter,
        "stdout": f"changed: [{host}]",
        "start_line": counter,
        "end_line": counter,
        "runner_ident": "9e9ff83d-a71d-4bcd-a2b1-eadfe6d89944",
        "event": "runner_on_ok",
        "pid": 2308,
        "created": "2026-11-30T22:51:01.253956+00:00",
        "parent_uuid": play,
        "event_data": {
            "playbook": "playbooks/site.yml",
            "playbook_uuid": "f9b1ca80-0916-40a2-a1f9-5222325c02e7",
            "play": "Configure the compute fabric on GPU nodes",
            "play_uuid": play,
            "play_pattern": "gpu_nodes",
            "task": "Create the .wants directories of the targets that pull in systemd-networkd",
            "task_uuid": play,
            "task_action": "ansible.builtin.file",
            "resolved_action": "ansible.builtin.file",
            "task_args": "",
            "task_path": "/tmp/tmp.d5XRx0Tezi/project/roles/infiniband/tasks/service.yml:19",
            "role": "infiniband",
            "host": host,
            "remote_addr": host,
            "res": {"changed": True, "msg": "All items completed", "results": ["r" * 300]},
            "start": "2026-11-30T22:51:01.009642+00:00",
            "end": "2026-11-30T22:51:01.253677+00:00",
            "duration": 0.244035,
            "event_loop": None,
            "uuid": f"8c8e816c-40bf-4eef-a6d2-{counter:012d}",
        },
    }


def test_enforce_fits_a_first_deploy_within_the_bound(tmp_path: Path) -> None:
    # d2exec's first site play: ~80 changed results per GPU node; with ansible-runner's whole
    # envelope kept, a slimmed event was still ~1.2 kB and a shard kept 93 kB per host.
    events = tmp_path / "job_events"
    events.mkdir()
    hosts = ("xgpu01", "xgpu02")
    for n in range(160):
        event = _runner_event(n, hosts[n % 2])
        (events / f"{n}-e.json").write_text(json.dumps(event))
    budget = artifacts.DEFAULT_BYTES_PER_HOST * len(hosts)
    assert artifacts.measure(tmp_path) > budget
    assert artifacts.enforce(tmp_path, budget) is True
    assert artifacts.measure(tmp_path) <= budget
    kept = [json.loads(p.read_text()) for p in events.iterdir()]
    slimmed = [e for e in kept if e["event_data"]["res"].get("gpuforge_slimmed")]
    assert len(kept) == 160
    assert slimmed
    slim = slimmed[0]
    assert slim["event_data"]["host"] in hosts
    assert slim["event_data"]["task"].startswith("Create the .wants directories")
    assert slim["event_data"]["res"] == {
        "changed": True,
        "msg": "All items completed",
        "gpuforge_slimmed": True,
    }
