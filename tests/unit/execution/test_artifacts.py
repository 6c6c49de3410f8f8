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
