"""``gpuforge conformance``: bad input exits 2 with nothing changed; report and history read the
store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest
from click.testing import CliRunner

from gpuforge.cli import main
from gpuforge.cli.conformance import MIN_JUDGED_VAR, _min_judged
from gpuforge.cli.context import ClusterContext
from gpuforge.conformance.report import MIN_JUDGED
from gpuforge.errors import InputError
from gpuforge.history.conformance import ConformanceHistory, NodeResult
from gpuforge.history.store import HistoryStore
from gpuforge.inventory.reader import ClusterView, InventoryDir
from gpuforge.node.record import Drift
from gpuforge.resources import project_path
from gpuforge.state_paths import StatePaths
from gpuforge.validate.result import CheckResult, Status

SAMPLE = project_path("inventory", "sample")


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_unknown_cluster_exits_2(tmp_path: Path) -> None:
    code, out = _invoke("conformance", "run", "nosuch", "--state-dir", str(tmp_path))
    assert code == 2
    assert "unknown cluster: inventory/nosuch" in out
    assert not any(tmp_path.iterdir())


def test_unknown_level_exits_2(tmp_path: Path) -> None:
    code, out = _invoke("conformance", "run", "--inventory", str(SAMPLE), "--level", "full")
    assert code == 2
    assert "'full' is not one of 'passive', 'quick', 'burnin'" in out


def test_a_corrupt_history_database_exits_2_untouched(tmp_path: Path) -> None:
    db = tmp_path / "lab" / "history.db"
    db.parent.mkdir()
    db.write_bytes(b"this is not SQLite" * 50)
    code, out = _invoke(
        "conformance", "report", "--inventory", str(SAMPLE), "--state-dir", str(tmp_path)
    )
    assert code == 2
    assert "history.db" in out and "not a readable gpuforge history database" in out
    assert db.read_bytes() == b"this is not SQLite" * 50


def _seed(state: Path) -> None:
    store = HistoryStore.open(state / "lab" / "history.db")
    hist = ConformanceHistory(store)
    first = hist.begin("quick", 8, at=1_795_000_000.0)
    hist.add(
        first.id,
        [
            NodeResult(
                "gpu01",
                "fail",
                "conformance.drift",
                (CheckResult("gpu01", "conformance.drift", Status.FAIL, action="quarantine"),),
                (Drift("service", "nvidia-dcgm", "active", "not active"),),
            )
        ]
        + [NodeResult(f"gpu0{i}", "pass") for i in range(2, 9)],
    )
    hist.finish(first.id, "complete", at=1_795_000_100.0)
    second = hist.begin("quick", 8, at=1_795_086_400.0)
    hist.add(second.id, [NodeResult(f"gpu0{i}", "pass") for i in range(1, 9)])
    hist.finish(second.id, "complete", at=1_795_086_500.0)
    store.close()


def test_report_shows_what_was_fixed_and_exits_0(tmp_path: Path) -> None:
    _seed(tmp_path)
    code, out = _invoke(
        "conformance", "report", "--inventory", str(SAMPLE), "--state-dir", str(tmp_path),
        "--report-dir", str(tmp_path / "reports"), "--json",
    )  # fmt: skip
    assert code == 0, out
    data = json.loads(out)
    assert data["cleared"] == ["gpu01"]
    assert data["drift_fixed"] == {
        "gpu01": [
            {"kind": "service", "item": "nvidia-dcgm", "desired": "active", "actual": "not active"}
        ]
    }
    assert (tmp_path / "reports" / "lab" / "run-00002" / "report.html").is_file()


def test_report_of_the_failing_run_exits_1(tmp_path: Path) -> None:
    _seed(tmp_path)
    code, out = _invoke(
        "conformance", "report", "--inventory", str(SAMPLE), "--state-dir", str(tmp_path),
        "--report-dir", str(tmp_path / "reports"), "--run", "1",
    )  # fmt: skip
    assert code == 1
    assert "new failures: gpu01" in out
    assert "gpu01 service nvidia-dcgm: desired 'active', actual 'not active'" in out


def test_node_history_newest_first(tmp_path: Path) -> None:
    _seed(tmp_path)
    code, out = _invoke(
        "conformance", "history", "gpu01", "--cluster", "lab", "--state-dir", str(tmp_path)
    )
    assert code == 0
    lines = out.splitlines()
    assert "run 2 quick: pass" in lines[0]
    assert "run 1 quick: fail conformance.drift service nvidia-dcgm" in lines[1]


def _ctx_with(hostvars: dict[str, dict[str, object]], controllers: list[str]) -> ClusterContext:
    view = ClusterView(
        cast(InventoryDir, None),
        {"nodes": []},
        {"_meta": {"hostvars": hostvars}, "slurm_controllers": {"hosts": controllers}},
    )
    return ClusterContext("lab", StatePaths(Path("state"), "lab"), None, view)


def test_min_judged_the_option_wins_over_the_inventory_and_the_default() -> None:
    ctx = _ctx_with({"ctl01": {MIN_JUDGED_VAR: 0.9}}, ["ctl01"])
    assert _min_judged(ctx, 0.75) == 0.75
    assert _min_judged(ctx, None) == 0.9
    assert _min_judged(_ctx_with({"ctl01": {}}, ["ctl01"]), None) == MIN_JUDGED
    # before Slurm (no controller): the GPU nodes' variables
    assert _min_judged(_ctx_with({"gpu01": {MIN_JUDGED_VAR: "0.8"}}, []), None) == 0.8


@pytest.mark.parametrize("value", ["most", 0, 2, True])
def test_min_judged_a_bad_inventory_value_is_named(value: object) -> None:
    ctx = _ctx_with({"ctl01": {MIN_JUDGED_VAR: value}}, ["ctl01"])
    with pytest.raises(InputError, match=MIN_JUDGED_VAR):
        _min_judged(ctx, None)


def test_report_of_a_run_that_judged_no_node_exits_1_and_says_why(tmp_path: Path) -> None:
    # The lab's night (issue 28): the array went to 4 idle nodes, no result came back.
    store = HistoryStore.open(tmp_path / "lab" / "history.db")
    hist = ConformanceHistory(store)
    night = hist.begin("quick", 8, at=1_795_000_000.0, meta={"sent": 4, "min_judged": 0.9})
    why = "no result: the task was preempted, did not start before the deadline, or failed"
    hist.add(night.id, [NodeResult(f"gpu0{i}", "not_checked", why) for i in range(1, 5)])
    hist.add(night.id, [NodeResult(f"gpu0{i}", "not_checked", "busy") for i in range(5, 9)])
    hist.finish(night.id, "complete", at=1_795_000_100.0)
    store.close()
    code, out = _invoke(
        "conformance", "report", "--inventory", str(SAMPLE), "--state-dir", str(tmp_path),
        "--report-dir", str(tmp_path / "reports"),
    )  # fmt: skip
    assert code == 1, out
    assert "  exit 1: judged no node: none of the 4 node(s) sent a task gave a result" in out
    junit = (tmp_path / "reports" / "lab" / "run-00001" / "junit.xml").read_text()
    assert 'name="judged share"' in junit
