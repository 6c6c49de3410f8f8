"""A conformance run end to end against fakes: Slurm, the collector's store, admission."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from gpuforge.admission import Admission
from gpuforge.conformance import judge, plan, report
from gpuforge.conformance.run import ConformanceDeps, ConformanceFleet, ConformanceOptions, run
from gpuforge.errors import InputError, OperationError
from gpuforge.history.conformance import ConformanceHistory, NodeResult
from gpuforge.history.store import HistoryStore
from gpuforge.node import drift
from gpuforge.node.record import Drift
from gpuforge.rollout.lock import LockHeld, cluster_lock
from gpuforge.slurm.control import NodeAction, SlurmNode
from gpuforge.validate.result import CheckResult, NodeVerdict, Status, Verdict

NODES = [f"gpu0{i}" for i in range(1, 7)]
T0 = 1_795_000_000.0


def node_record(
    node: str, items: Sequence[drift.DriftItem] = (), vbios: str = "96.00.89"
) -> dict[str, Any]:
    return drift.conformance_record(
        node,
        "quick",
        started="2026-11-18T10:00:00Z",
        duration_s=1.0,
        report=drift.DriftReport(items=list(items), roles=["nccl"], compared=5),
        firmware_versions={"vbios": vbios},
        job_id="77",
    )


@dataclass
class FakeAdmission:
    verdicts: list[NodeVerdict] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)

    def open_window(self, name: str, nodes: Sequence[str]) -> None:
        self.calls.append(f"open {name} {','.join(nodes)}")

    def close_window(self, name: str) -> None:
        self.calls.append(f"close {name}")

    def admit(self, verdicts: Sequence[NodeVerdict], window: str | None = None) -> list[NodeAction]:
        self.calls.append(f"admit {window} {','.join(v.node for v in verdicts)}")
        if window is None:
            self.verdicts = list(verdicts)
        return [
            NodeAction(v.node, "drain" if v.verdict is Verdict.QUARANTINE else "none", False)
            for v in verdicts
        ]


@dataclass
class World:
    """Slurm and the collector as the run sees them."""

    states: dict[str, SlurmNode]
    records: dict[str, Any]
    submitted: list[list[str]] = field(default_factory=list)
    polls: int = 0
    now: float = T0

    def submit(self, argv: Sequence[str]) -> str:
        self.submitted.append(list(argv))
        return "77"

    def active(self, jobs: Sequence[str]) -> bool:
        self.polls += 1
        return self.polls < 3  # the array runs for two polls

    def collect(self, jobs: Sequence[str]) -> Mapping[str, Any]:
        assert set(jobs) == {"77"}
        return self.records

    def clock(self) -> float:
        self.now += 1
        return self.now


def idle(name: str) -> SlurmNode:
    return SlurmNode(name=name, state="IDLE")


@pytest.fixture
def world() -> World:
    states = {n: idle(n) for n in NODES}
    states["gpu02"] = SlurmNode(name="gpu02", state="ALLOCATED")  # runs a sleep job
    states["gpu05"] = SlurmNode(name="gpu05", state="IDLE", flags=("DRAIN",), reason="disk swap")
    wrong_nccl = drift.DriftItem("package", "libnccl2", "2.21.5-1", "2.25.1-1")
    records: dict[str, Any] = {
        "gpu01": node_record("gpu01", [wrong_nccl]),
        "gpu03": "{not json",  # a corrupt result
        "gpu04": node_record("gpu04"),
        # gpu06 is idle but never reports (preempted)
    }
    return World(states, records)


@pytest.fixture
def history(tmp_path: Path) -> ConformanceHistory:
    return ConformanceHistory(HistoryStore.open(tmp_path / "history.db"))


def deps_for(world: World, admission: FakeAdmission | None = None) -> ConformanceDeps:
    return ConformanceDeps(
        states=lambda: world.states,
        submit=world.submit,
        active=world.active,
        collect=world.collect,
        admission=cast(Admission, admission) if admission else None,
        clock=world.clock,
        sleep=lambda _s: None,
    )


FLEET = ConformanceFleet(
    NODES,
    {
        n: report.Placement("su01", f"r00{1 + i // 2}", f"leaf{1 + i // 3}")
        for i, n in enumerate(NODES)
    },
    dict.fromkeys(NODES, "h100"),
)


def test_one_sbatch_array_over_the_idle_nodes_and_each_node_judged(
    tmp_path: Path, world: World, history: ConformanceHistory
) -> None:
    adm = FakeAdmission()
    out = run(
        FLEET,
        history,
        ConformanceOptions(poll_s=0),
        deps_for(world, adm),
        lock_path=tmp_path / "lock",
    )
    assert len(world.submitted) == 1
    argv = world.submitted[0]
    assert "--array=0-3" in argv  # gpu01, gpu03, gpu04, gpu06: the idle ones
    assert "--partition=conformance" in argv
    assert "--exclusive" in argv and "--time=5" in argv
    assert argv[-1].endswith("gpuforge-node.pyz conformance --level quick")
    got = {n: r.outcome for n, r in out.changes.results.items()}
    assert got == {
        "gpu01": "fail",
        "gpu02": "not_checked",
        "gpu03": "error",
        "gpu04": "pass",
        "gpu05": "not_checked",
        "gpu06": "not_checked",
    }
    res = out.changes.results
    assert res["gpu02"].why == "busy (ALLOCATED)"
    assert "disk swap" in res["gpu05"].why
    assert "corrupt result" in res["gpu03"].why
    assert res["gpu01"].drift == (Drift("package", "libnccl2", "2.21.5-1", "2.25.1-1"),)
    # admission: the failed node is quarantined, the corrupt one held, unchecked ones untouched
    decided = {v.node: v.verdict for v in adm.verdicts}
    assert decided == {"gpu01": Verdict.QUARANTINE, "gpu03": Verdict.HOLD, "gpu04": Verdict.ADMIT}
    assert out.changes.new_failures == ["gpu01"]
    assert out.changes.exit_code == 1
    assert out.changes.run.state == "complete"


def test_the_second_run_reports_what_was_fixed(
    tmp_path: Path, world: World, history: ConformanceHistory
) -> None:
    run(FLEET, history, ConformanceOptions(poll_s=0), deps_for(world), lock_path=tmp_path / "lock")
    world.records["gpu01"] = node_record("gpu01")
    world.records["gpu03"] = node_record("gpu03")
    sysctl = drift.DriftItem("sysctl", "net.core.rmem_max", "268435456", "212992")
    world.records["gpu04"] = node_record("gpu04", [sysctl])
    world.polls = 0
    changes = run(
        FLEET, history, ConformanceOptions(poll_s=0), deps_for(world), lock_path=tmp_path / "lock"
    ).changes
    assert changes.cleared == ["gpu01", "gpu03"]
    assert changes.drift_fixed == {"gpu01": [Drift("package", "libnccl2", "2.21.5-1", "2.25.1-1")]}
    assert changes.new_failures == ["gpu04"]
    assert changes.drift_new == {
        "gpu04": [Drift("sysctl", "net.core.rmem_max", "268435456", "212992")]
    }
    assert changes.drift_by_kind == {"sysctl": 1}


def test_repeat_offenders_are_nodes_failing_twice_in_seven_days(
    tmp_path: Path, world: World, history: ConformanceHistory
) -> None:
    for _ in range(2):
        world.polls = 0
        changes = run(
            FLEET, history, ConformanceOptions(poll_s=0), deps_for(world), lock_path=tmp_path / "l"
        ).changes
    assert changes.repeat_offenders == {"gpu01": 2}
    assert changes.still_failing == ["gpu01"]


def test_firmware_odd_one_out_of_the_node_type_is_drift(
    tmp_path: Path, world: World, history: ConformanceHistory
) -> None:
    world.states = {n: idle(n) for n in NODES}
    world.records = {n: node_record(n) for n in NODES}
    world.records["gpu05"] = node_record("gpu05", vbios="95.00.11")
    res = run(
        FLEET, history, ConformanceOptions(poll_s=0), deps_for(world), lock_path=tmp_path / "l"
    ).changes.results
    assert res["gpu05"].outcome == "fail"
    assert res["gpu05"].drift == (Drift("firmware", "vbios", "96.00.89", "95.00.11"),)
    assert all(res[n].outcome == "pass" for n in NODES if n != "gpu05")


NODES_CONF = """# Generated by gpuforge
NodeName=gpu0[1-3] CPUs=224 Gres=gpu:h100:8 Features=su01,r001 State=UNKNOWN
NodeName=gpu0[4-6] CPUs=224 Gres=gpu:h100:8 Features=su01,r002 Weight=10 State=UNKNOWN
PartitionName=gpu Nodes=gpu0[1-6] Default=YES
"""


def shown(name: str, features: str, weight: str, gres: str = "gpu:h100:8(S:0-1)") -> SlurmNode:
    """An idle node as ``scontrol show node`` reports it (GRES with its socket binding)."""
    fields = {"NodeName": name, "Gres": gres, "AvailableFeatures": features, "Weight": weight}
    return SlurmNode(name=name, state="IDLE", fields=fields)


def test_slurms_view_of_a_node_is_compared_with_the_generated_nodes_conf(
    tmp_path: Path, world: World, history: ConformanceHistory
) -> None:
    desired = judge.desired_slurm(NODES_CONF)
    assert desired["gpu02"] == {"Gres": "gpu:h100:8", "Features": "su01,r001", "Weight": "1"}
    assert desired["gpu05"]["Weight"] == "10"
    world.states = {
        n: shown(n, "su01,r001" if n < "gpu04" else "r002,su01", "1" if n < "gpu04" else "10")
        for n in NODES
    }
    world.states["gpu02"] = shown("gpu02", "su01,r001,nvme", "1")  # scontrol update by hand
    world.states["gpu05"] = shown("gpu05", "su01,r002", "1", gres="gpu:h100:7")
    world.records = {n: node_record(n) for n in NODES}
    fleet = ConformanceFleet(FLEET.nodes, FLEET.placement, FLEET.node_types, desired)
    res = run(
        fleet, history, ConformanceOptions(poll_s=0), deps_for(world), lock_path=tmp_path / "l"
    ).changes.results
    assert res["gpu02"].drift == (Drift("slurm", "Features", "su01,r001", "su01,r001,nvme"),)
    assert res["gpu05"].drift == (
        Drift("slurm", "Gres", "gpu:h100:8", "gpu:h100:7"),
        Drift("slurm", "Weight", "10", "1"),
    )
    assert {n for n, r in res.items() if r.outcome == "fail"} == {"gpu02", "gpu05"}
    assert all(
        r.failed == (CheckResult(n, "conformance.drift", Status.FAIL, action="quarantine"),)
        for n, r in res.items()
        if n in {"gpu02", "gpu05"}
    )


def test_an_overlapping_run_refuses_clearly(
    tmp_path: Path, world: World, history: ConformanceHistory
) -> None:
    with (
        cluster_lock(tmp_path / "lock", "gpuforge conformance run"),
        pytest.raises(LockHeld, match="another gpuforge run holds the lock"),
    ):
        run(
            FLEET,
            history,
            ConformanceOptions(poll_s=0),
            deps_for(world),
            lock_path=tmp_path / "lock",
        )
    assert history.runs() == []


def test_a_killed_run_is_reported_partial_by_the_next(
    tmp_path: Path, world: World, history: ConformanceHistory
) -> None:
    killed = history.begin("quick", 6, at=T0 - 3600, meta={"jobs": ["77"]})
    history.add(killed.id, [NodeResult("gpu02", "not_checked", "busy (ALLOCATED)")])
    world.polls = 5  # its job is gone from Slurm
    world.records = {"gpu01": node_record("gpu01")}
    out = run(
        FLEET, history, ConformanceOptions(poll_s=0), deps_for(world), lock_path=tmp_path / "lock"
    )
    old = history.run(killed.id)
    assert old is not None and old.state == "partial"
    kept = history.results(killed.id)
    assert kept["gpu01"].outcome == "pass"  # what arrived is kept
    assert kept["gpu03"].outcome == "not_checked"
    assert "killed" in kept["gpu03"].why
    assert any("closed it partial" in n for n in out.notes)


def test_a_run_whose_job_outlives_the_window_stays_open(
    tmp_path: Path, world: World, history: ConformanceHistory
) -> None:
    world.active = lambda _jobs: True  # type: ignore[method-assign]
    with pytest.raises(OperationError, match="still in Slurm after the window"):
        run(
            FLEET,
            history,
            ConformanceOptions(poll_s=0, window_minutes=1),
            deps_for(world),
            lock_path=tmp_path / "l",
        )
    assert history.unfinished() is not None


def test_unknown_level_is_bad_input() -> None:
    with pytest.raises(InputError, match="--level: 'full' is not one of passive, quick, burnin"):
        ConformanceOptions(level="full")


def test_a_corrupt_history_database_is_refused_untouched(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    db.write_bytes(b"SQLite format 3\x00" + b"garbage" * 100)
    before = db.read_bytes()
    with pytest.raises(InputError, match=r"history\.db"):
        ConformanceHistory(HistoryStore.open(db))
    assert db.read_bytes() == before


def test_without_slurm_the_node_checker_runs_over_ssh(
    tmp_path: Path, history: ConformanceHistory
) -> None:
    asked: list[tuple[list[str], str]] = []

    def ssh(nodes: Sequence[str], level: str) -> Mapping[str, Any]:
        asked.append((list(nodes), level))
        return {n: json.dumps(node_record(n)) for n in nodes if n != "gpu06"}

    out = run(
        FLEET,
        history,
        ConformanceOptions(level="passive"),
        ConformanceDeps(ssh=ssh),
        lock_path=tmp_path / "l",
    )
    assert asked == [(NODES, "passive")]
    assert out.changes.results["gpu06"].outcome == "not_checked"
    assert out.changes.exit_code == 0


def test_reports_are_written_and_readable(
    tmp_path: Path, world: World, history: ConformanceHistory
) -> None:
    changes = run(
        FLEET, history, ConformanceOptions(poll_s=0), deps_for(world), lock_path=tmp_path / "l"
    ).changes
    paths = report.write(changes, tmp_path / "out", textfile=tmp_path / "prom" / "c.prom")
    data = json.loads(paths["json"].read_text())
    assert data["new_failures"] == ["gpu01"]
    assert data["heat"]["rack"]["r001"] == {"fail": 1, "not_checked": 1}
    suite = ET.fromstring(paths["junit"].read_text())  # noqa: S314 - our own file
    assert (
        suite.get("failures") == "1" and suite.get("errors") == "1" and suite.get("skipped") == "3"
    )
    page = paths["html"].read_text()
    assert page.index("What changed") < page.index("Heat map by rack")
    assert "libnccl2" in page
    assert 'gpuforge_conformance_fleet_nodes{outcome="fail"} 1' in paths["metrics"].read_text()


def test_the_sbatch_calls_do_not_grow_with_the_fleet() -> None:
    assert plan.chunks(12_500) == [12_500]
    assert plan.chunks(100_000) == [50_000, 50_000]  # MaxArraySize 50001 (slurm role)
    assert plan.chunks(5, max_array_size=3) == [2, 2, 1]


def test_a_node_conformance_drained_is_rechecked_in_a_window_and_comes_back(
    tmp_path: Path, world: World, history: ConformanceHistory
) -> None:
    world.states["gpu05"] = SlurmNode(
        name="gpu05", state="IDLE", flags=("DRAIN",), reason="gpuforge:conformance.drift:quarantine"
    )
    world.records["gpu05"] = node_record("gpu05")  # fixed since
    adm = FakeAdmission()
    out = run(
        FLEET, history, ConformanceOptions(poll_s=0), deps_for(world, adm), lock_path=tmp_path / "l"
    )
    assert len(world.submitted) == 2  # a fixed number of calls, whatever the node count
    assert "--reservation=gpuforge_conformance" in world.submitted[1]
    assert "--array=0-0" in world.submitted[1]
    assert adm.calls == [
        "open gpuforge_conformance gpu05",
        "admit gpuforge_conformance gpu05",
        "close gpuforge_conformance",
        "admit None gpu01,gpu03,gpu04",
    ]
    assert out.changes.results["gpu05"].outcome == "pass"


def test_an_operators_drain_is_never_rechecked(
    tmp_path: Path, world: World, history: ConformanceHistory
) -> None:
    adm = FakeAdmission()
    run(
        FLEET, history, ConformanceOptions(poll_s=0), deps_for(world, adm), lock_path=tmp_path / "l"
    )
    assert not any(c.startswith("open") for c in adm.calls)
    assert len(world.submitted) == 1


def test_burnin_runs_the_pipeline_only_on_nodes_that_passed_and_records_its_failures(
    tmp_path: Path, world: World, history: ConformanceHistory
) -> None:
    asked: list[list[str]] = []

    def active(nodes: Sequence[str]) -> Mapping[str, NodeResult]:
        asked.append(list(nodes))
        bad = (CheckResult("gpu04", "burnin.ib_write_bw.min", Status.FAIL),)
        return {"gpu04": NodeResult("gpu04", "fail", "burnin.ib_write_bw.min", bad)}

    deps = deps_for(world)
    deps.active_tests = active
    out = run(
        FLEET, history, ConformanceOptions(level="burnin", poll_s=0), deps, lock_path=tmp_path / "l"
    )
    assert asked == [["gpu04"]]  # gpu01 failed, gpu03 errored, the rest were not checked
    assert "--time=25" in world.submitted[0]
    assert out.changes.results["gpu04"].outcome == "fail"
    assert out.changes.results["gpu04"].why == "burnin.ib_write_bw.min"


# -- the share of the nodes sent a task that must be judged (issue 28 item 3) -------------------


def test_a_run_that_judged_no_node_exits_1_and_says_why(
    tmp_path: Path, world: World, history: ConformanceHistory
) -> None:
    world.records = {}  # every task preempted: the lab's "no result" for all four idle nodes
    changes = run(
        FLEET, history, ConformanceOptions(poll_s=0), deps_for(world), lock_path=tmp_path / "l"
    ).changes
    assert {r.outcome for r in changes.results.values()} == {"not_checked"}
    assert changes.exit_code == 1
    assert changes.short is not None and changes.short.startswith("judged no node: none of the 4")
    data = changes.to_dict()
    assert data["judged"] == {"sent": 4, "judged": 0, "min_fraction": 0.5, "short": changes.short}
    suite = ET.fromstring(report.junit(changes))  # noqa: S314 - our own text
    (case,) = [c for c in suite.iter("testcase") if c.get("name") == "judged share"]
    failure = case.find("failure")
    assert failure is not None and failure.get("message") == changes.short
    assert suite.get("failures") == "1"


def test_no_idle_node_at_all_is_judged_no_node(
    tmp_path: Path, world: World, history: ConformanceHistory
) -> None:
    world.states = {n: SlurmNode(name=n, state="ALLOCATED") for n in NODES}
    changes = run(
        FLEET, history, ConformanceOptions(poll_s=0), deps_for(world), lock_path=tmp_path / "l"
    ).changes
    assert world.submitted == []
    assert changes.exit_code == 1
    assert changes.short == "judged no node: none of the 6 GPU node(s) was idle to send a task to"


def test_fewer_than_the_share_exits_1_and_enough_exits_0(
    tmp_path: Path, world: World, history: ConformanceHistory
) -> None:
    # gpu01, gpu04 pass; gpu03 and gpu06 give nothing: 2 of the 4 sent a task judged (50%).
    world.records = {"gpu01": node_record("gpu01"), "gpu04": node_record("gpu04")}

    def night(share: float) -> report.Changes:
        world.polls = 0
        opts = ConformanceOptions(poll_s=0, min_judged=share)
        return run(FLEET, history, opts, deps_for(world), lock_path=tmp_path / "l").changes

    strict = night(0.9)
    assert strict.exit_code == 1
    assert strict.short is not None
    assert (
        "judged 2 of the 4 node(s) sent a task (50%), fewer than the required 90%" in strict.short
    )
    lenient = night(0.5)
    assert lenient.short is None and lenient.exit_code == 0
    assert lenient.to_dict()["judged"] == {
        "sent": 4, "judged": 2, "min_fraction": 0.5, "short": None,
    }  # fmt: skip
    # the share is the run's: `conformance report` of the strict run still exits 1
    again = report.compare(history, strict.run, {})
    assert again.exit_code == 1 and again.short == strict.short


def test_a_run_recorded_before_the_rule_is_not_judged_by_it(
    history: ConformanceHistory,
) -> None:
    old = history.begin("quick", 2, at=T0, meta={"transport": "slurm+collector"})
    history.add(old.id, [NodeResult("gpu01", "not_checked", "no result")])
    done = history.finish(old.id, "complete", at=T0 + 1)
    changes = report.compare(history, done, {})
    assert changes.short is None and changes.exit_code == 0


@pytest.mark.parametrize("share", [0.0, 1.5, -1.0])
def test_a_share_outside_0_1_is_bad_input(share: float) -> None:
    with pytest.raises(InputError, match="--min-judged"):
        ConformanceOptions(min_judged=share)


def test_a_released_hold_fails_the_node_and_is_reported_as_drift(
    tmp_path: Path, world: World, history: ConformanceHistory
) -> None:
    unheld = drift.DriftItem("package", "libnccl2" + drift.HOLD_SUFFIX, "held", "not held")
    world.records = {n: node_record(n) for n in ("gpu01", "gpu03", "gpu06")}
    world.records["gpu04"] = node_record("gpu04", [unheld])
    changes = run(
        FLEET, history, ConformanceOptions(poll_s=0), deps_for(world), lock_path=tmp_path / "l"
    ).changes
    assert changes.new_failures == ["gpu04"]
    assert changes.results["gpu04"].drift == (
        Drift("package", "libnccl2 hold", "held", "not held"),
    )
    assert changes.to_dict()["drift_new"]["gpu04"] == [
        {"kind": "package", "item": "libnccl2 hold", "desired": "held", "actual": "not held"}
    ]
    assert changes.exit_code == 1 and changes.short is None
