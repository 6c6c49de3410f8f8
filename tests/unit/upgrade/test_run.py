"""The upgrade run engine against fake nodes: limits, drain waits, policies, gates, resume."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuforge.admission import REASON_MAX, is_ours, parse_reason
from gpuforge.errors import InputError, Interrupted
from gpuforge.rollout.deploy import ValidationOutcome
from gpuforge.rollout.lock import LockHeld, cluster_lock
from gpuforge.rollout.state import NodeState, StateStore, open_store
from gpuforge.slurm.control import NodeAction, SlurmNode
from gpuforge.topology import load_cluster
from gpuforge.topology.cluster import Cluster
from gpuforge.upgrade.plan import Installed, Limits, UpgradePlan, plan_upgrade
from gpuforge.upgrade.run import (
    UpgradeRecord,
    UpgradeRequest,
    run_upgrade,
    upgrade_id,
    upgrade_reason,
)
from gpuforge.validate.result import NodeVerdict, Verdict

from ..conftest import LAB
from .test_plan import OLD

OPERATOR = "disk swap ticket 4711"


@dataclass
class FakeNodes:
    """Slurm and Ansible as the engine sees them; jobs end after ``busy_polls`` looks."""

    hosts: Sequence[str]
    busy_polls: dict[str, int] = field(default_factory=dict)
    operator: set[str] = field(default_factory=set)
    fail_apply: set[str] = field(default_factory=set)
    fail_validate: set[str] = field(default_factory=set)
    interrupt_apply_on: str | None = None
    reasons: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    max_out: int = 0
    requeued: list[str] = field(default_factory=list)
    upgraded: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        for host in self.operator:
            self.reasons[host] = OPERATOR

    def _out(self) -> None:
        self.max_out = max(self.max_out, len(self.reasons.keys() - self.operator))

    def node_states(self, hosts: list[str]) -> dict[str, SlurmNode]:
        out = {}
        for h in hosts:
            busy = self.busy_polls.get(h, 0) > 0
            if busy and h in self.reasons:
                self.busy_polls[h] -= 1
            state = "MIXED" if busy else "IDLE"
            flags = ("DRAIN",) if h in self.reasons else ()
            out[h] = SlurmNode(h, state, flags, self.reasons.get(h, ""), cpus_alloc=8 * busy)
        return out

    def drain(self, hosts: list[str], check: str) -> list[NodeAction]:
        self.calls.append(("drain", tuple(hosts)))
        out = []
        for h in hosts:
            if h in self.operator:
                out.append(NodeAction(h, "none", False, "", "drained by someone else"))
                continue
            self.reasons[h] = f"gpuforge:{check}:validate"
            out.append(NodeAction(h, "drain", True, self.reasons[h], "drained"))
        self._out()
        return out

    def release(self, hosts: list[str]) -> list[NodeAction]:
        self.calls.append(("release", tuple(hosts)))
        for h in hosts:
            assert is_ours(self.reasons.pop(h))
        return [NodeAction(h, "resume", True, "", "") for h in hosts]

    def requeue(self, hosts: list[str]) -> list[str]:
        self.calls.append(("requeue", tuple(hosts)))
        jobs = [str(100 + i) for i, h in enumerate(hosts) if self.busy_polls.get(h)]
        for h in hosts:
            self.busy_polls[h] = 0
        self.requeued.extend(jobs)
        return jobs

    def apply(self, hosts: list[str]) -> dict[str, str]:
        self.calls.append(("apply", tuple(hosts)))
        assert all(h in self.reasons for h in hosts), "applied to a node in service"
        assert not any(self.busy_polls.get(h) for h in hosts), "applied under a running job"
        if self.interrupt_apply_on in hosts:
            self.interrupt_apply_on = None
            raise Interrupted("interrupted by SIGTERM")
        self.upgraded.update(h for h in hosts if h not in self.fail_apply)
        return {h: "apt failed" for h in hosts if h in self.fail_apply}

    def validate(self, hosts: list[str], level: str, admitted: list[str]) -> ValidationOutcome:
        self.calls.append(("validate", tuple(hosts)))
        return ValidationOutcome(
            {
                h: NodeVerdict(h, Verdict.QUARANTINE, ("software.versions",))
                if h in self.fail_validate
                else NodeVerdict(h, Verdict.ADMIT)
                for h in hosts
            }
        )

    def admit(self, verdicts: Sequence[NodeVerdict]) -> list[NodeAction]:
        self.calls.append(("admit", tuple(v.node for v in verdicts)))
        for v in verdicts:
            if v.verdict is Verdict.ADMIT:
                self.reasons.pop(v.node, None)
            else:
                self.reasons[v.node] = "gpuforge:software.versions:quarantine"
        return []

    def quarantine(self, reasons: Mapping[str, str]) -> list[NodeAction]:
        self.calls.append(("quarantine", tuple(reasons)))
        for h, check in reasons.items():
            self.reasons[h] = f"gpuforge:{check}:quarantine"
        return []


@pytest.fixture(scope="module")
def lab() -> Cluster:
    return load_cluster(LAB)


def _plan(cluster: Cluster, done: set[str] = frozenset(), fraction: float = 0.25) -> UpgradePlan:
    new = OLD | {"nvidia_driver": "570.133.20", "fabricmanager": "570.133.20", "nccl": "2.26.2"}
    installed = {
        n.hostname: Installed(dict(new if n.hostname in done else OLD), "test")
        for n in cluster.gpu_nodes
    }
    return plan_upgrade(cluster, installed, Limits(None, fraction))


def _request(cluster: Cluster, plan: UpgradePlan, **kw: object) -> UpgradeRequest:
    return UpgradeRequest(
        plan=plan,
        phase_of={h: p.number for p in cluster.phases for h in p.hosts},
        gate_fraction={p.number: 1.0 for p in cluster.phases},
        poll_s=1.0,
        operator="test",
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    return open_store(tmp_path / "rollout.db")


def _run(store: StateStore, fake: FakeNodes, request: UpgradeRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    clock = [0.0]
    return run_upgrade(
        store,
        fake,
        request,
        lock_path=tmp_path / "rollout.lock",
        sleep=lambda s: clock.__setitem__(0, clock[0] + s),
        clock=lambda: clock[0],
    )


def test_reason_is_admissions_own_format() -> None:
    uid = upgrade_id({"nvidia_driver": "570.133.20", "nccl": "2.26.2"})
    reason = upgrade_reason(uid)
    assert reason == f"gpuforge:upgrade.{uid}:validate"
    parsed = parse_reason(reason)
    assert parsed is not None and parsed.check == f"upgrade.{uid}" and not parsed.truncated
    assert len(reason) <= REASON_MAX
    # Same pins, same upgrade (a re-run resumes it); other pins (a rollback), another one.
    assert uid == upgrade_id({"nccl": "2.26.2", "nvidia_driver": "570.133.20"})
    assert uid != upgrade_id({"nvidia_driver": "570.124.06", "nccl": "2.25.1"})


def test_every_node_moved_wave_by_wave_within_limits(
    lab: Cluster, store: StateStore, tmp_path: Path
) -> None:
    plan = _plan(lab)
    assert len(plan.waves) == 4 and all(len(w.nodes) == 2 for w in plan.waves)
    fake = FakeNodes([n.hostname for n in lab.gpu_nodes], busy_polls={"gpu01": 3})
    outcome = _run(store, fake, _request(lab, plan), tmp_path)
    assert outcome.status == "finished" and outcome.passed
    assert fake.upgraded == set(fake.hosts)
    assert fake.reasons == {}, "every node resumed"
    assert fake.max_out == 2, "never more nodes out than one wave"
    # Applied only once gpu01's job ended (the fake asserts it); drains in wave order.
    assert [c[1] for c in fake.calls if c[0] == "drain"] == [w.nodes for w in plan.waves]
    assert {n.hostname: n.state for n in store.nodes()} == dict.fromkeys(
        fake.hosts, NodeState.ADMITTED
    )
    summary = UpgradeRecord(store).summary()[0]
    assert summary["status"] == "finished" and summary["counts"] == {"done": 8}
    first = next(n for n in summary["nodes"] if n["hostname"] == "gpu01")
    assert first["drained_s"] == 3.0, "waited three polls for the job"
    assert [w["passed"] for w in summary["waves"]] == [True] * 4


def test_operator_drain_never_touched(lab: Cluster, store: StateStore, tmp_path: Path) -> None:
    fake = FakeNodes([n.hostname for n in lab.gpu_nodes], operator={"gpu02"})
    outcome = _run(store, fake, _request(lab, _plan(lab)), tmp_path)
    assert outcome.passed
    assert fake.reasons == {"gpu02": OPERATOR}
    assert "gpu02" not in fake.upgraded
    assert all("gpu02" not in hosts for kind, hosts in fake.calls if kind != "drain")
    assert "drained by someone else" in outcome.waves[0].skipped["gpu02"]


@pytest.mark.parametrize("policy", ["skip", "requeue", "wait"])
def test_deadline_policy(lab: Cluster, store: StateStore, tmp_path: Path, policy: str) -> None:
    fake = FakeNodes([n.hostname for n in lab.gpu_nodes], busy_polls={"gpu01": 50})
    request = _request(lab, _plan(lab), drain_deadline_s=5.0, policy=policy)
    outcome = _run(store, fake, request, tmp_path)
    assert outcome.passed
    if policy == "skip":
        assert ("release", ("gpu01",)) in fake.calls
        assert "gpu01" not in fake.upgraded and "gpu01" not in fake.reasons
        assert "policy skip" in outcome.waves[0].skipped["gpu01"]
    elif policy == "requeue":
        assert ("requeue", ("gpu01",)) in fake.calls and fake.requeued == ["100"]
        assert "gpu01" in fake.upgraded
    else:
        assert not any(c[0] in ("requeue", "release") for c in fake.calls)
        assert "gpu01" in fake.upgraded  # waited the job out (50 polls)


def test_failed_wave_stops_the_upgrade(lab: Cluster, store: StateStore, tmp_path: Path) -> None:
    fake = FakeNodes([n.hostname for n in lab.gpu_nodes], fail_validate={"gpu02"})
    outcome = _run(store, fake, _request(lab, _plan(lab)), tmp_path)
    assert outcome.status == "failed" and not outcome.passed
    assert len(outcome.waves) == 1
    assert fake.reasons == {"gpu02": "gpuforge:software.versions:quarantine"}
    assert fake.upgraded == {"gpu01", "gpu02"}, "no later wave started"
    assert store.node("gpu02").state is NodeState.QUARANTINED
    assert "software.versions" in store.node("gpu02").reason


def test_apply_failure_quarantines_with_the_step(
    lab: Cluster, store: StateStore, tmp_path: Path
) -> None:
    fake = FakeNodes([n.hostname for n in lab.gpu_nodes], fail_apply={"gpu01"})
    outcome = _run(store, fake, _request(lab, _plan(lab)), tmp_path)
    assert not outcome.passed
    assert fake.reasons["gpu01"] == "gpuforge:upgrade.apply:quarantine"
    assert "apt failed" in store.node("gpu01").reason


def test_killed_run_resumes_and_finishes(lab: Cluster, store: StateStore, tmp_path: Path) -> None:
    fake = FakeNodes([n.hostname for n in lab.gpu_nodes], interrupt_apply_on="gpu03")
    with pytest.raises(Interrupted):
        _run(store, fake, _request(lab, _plan(lab)), tmp_path)
    record = UpgradeRecord(store)
    uid = upgrade_id(_plan(lab).pins)
    assert record.steps(uid) == {
        "gpu01": "done",
        "gpu02": "done",
        "gpu03": "applying",
        "gpu04": "applying",
    }
    assert record.summary()[0]["status"] == "interrupted"
    assert fake.reasons.keys() == {"gpu03", "gpu04"}, "the killed run left them drained"
    # The re-run plans what the nodes report. Even when gpu03/04 report the new versions (the
    # play got that far) they are finished first, alone: never with the next wave's nodes.
    plan = _plan(lab, done={"gpu01", "gpu02", "gpu03", "gpu04"})
    fake.max_out = 0
    outcome = _run(store, fake, _request(lab, plan), tmp_path)
    assert outcome.passed
    assert [w.nodes for w in outcome.waves] == [
        ("gpu03", "gpu04"),
        ("gpu05", "gpu06"),
        ("gpu07", "gpu08"),
    ]
    assert fake.max_out == 2
    assert fake.upgraded == set(fake.hosts) and fake.reasons == {}
    assert set(record.steps(uid).values()) == {"done"}


def test_one_operator_at_a_time(lab: Cluster, store: StateStore, tmp_path: Path) -> None:
    fake = FakeNodes([n.hostname for n in lab.gpu_nodes])
    with cluster_lock(tmp_path / "rollout.lock", "deploy --phase 1"), pytest.raises(LockHeld):
        _run(store, fake, _request(lab, _plan(lab)), tmp_path)
    assert fake.calls == []


def test_unknown_policy_is_bad_input(lab: Cluster, store: StateStore, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--on-deadline"):
        _run(store, FakeNodes([]), _request(lab, _plan(lab), policy="kill"), tmp_path)


def test_status_shows_the_upgrade(lab: Cluster, tmp_path: Path) -> None:
    from click.testing import CliRunner  # noqa: PLC0415

    from gpuforge.cli import main  # noqa: PLC0415

    store = open_store(tmp_path / lab.name / "rollout.db")
    fake = FakeNodes([n.hostname for n in lab.gpu_nodes], fail_validate={"gpu04"})
    run_upgrade(
        store,
        fake,
        _request(lab, _plan(lab)),
        lock_path=tmp_path / lab.name / "rollout.lock",
        sleep=lambda _s: None,
    )
    result = CliRunner().invoke(main, ["status", str(LAB), "--state-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    uid = upgrade_id(_plan(lab).pins)
    assert f"upgrade {uid}" in text and "failed" in text
    assert "done 3, quarantined 1" in text and "waves: 1 passed of 2 started" in text
    as_json = CliRunner().invoke(main, ["status", str(LAB), "--state-dir", str(tmp_path), "--json"])
    import json  # noqa: PLC0415

    upgrades = json.loads(as_json.output)["upgrades"]
    assert upgrades[0]["id"] == uid and upgrades[0]["counts"] == {"done": 3, "quarantined": 1}


def test_node_failed_halfway_recovered_by_rerun_and_rollback_moves_back(
    lab: Cluster, store: StateStore, tmp_path: Path
) -> None:
    fake = FakeNodes([n.hostname for n in lab.gpu_nodes], fail_validate={"gpu01"})
    first = _run(store, fake, _request(lab, _plan(lab)), tmp_path)
    assert first.status == "failed"
    assert fake.reasons == {"gpu01": "gpuforge:software.versions:quarantine"}
    # The repair is the re-run: gpu01 still reports a mismatch, so the plan has it again; its
    # quarantine drain is gpuforge's, so the upgrade's drain replaces it and the node comes back.
    fake.fail_validate.clear()
    fake.upgraded.clear()
    again = _run(store, fake, _request(lab, _plan(lab, done={"gpu02"})), tmp_path)
    assert again.passed and again.upgrade == first.upgrade
    assert "gpu01" in fake.upgraded and fake.reasons == {}
    assert store.node("gpu01").state is NodeState.ADMITTED
    # Rollback: the previous pins are another upgrade, run the same way.
    back = _plan(lab, fraction=0.25)
    old_pins = UpgradePlan(
        back.cluster,
        {**back.pins, "nvidia_driver": "570.124.06", "nccl": "2.25.1"},
        back.limits,
        back.partition,
        back.partition_gpus,
        back.waves,
        back.up_to_date,
        back.unknown,
    )
    fake.upgraded.clear()
    rollback = _run(store, fake, _request(lab, old_pins), tmp_path)
    assert rollback.passed and rollback.upgrade != first.upgrade
    assert fake.upgraded == set(fake.hosts)
    ids = [u["id"] for u in UpgradeRecord(store).summary()]
    assert set(ids) == {first.upgrade, rollback.upgrade}


def test_other_gpuforge_drains_are_left_to_their_process(
    lab: Cluster, store: StateStore, tmp_path: Path
) -> None:
    fake = FakeNodes([n.hostname for n in lab.gpu_nodes])
    fake.reasons["gpu02"] = "gpuforge:gpu.xid:reboot"  # the health collector's
    outcome = _run(store, fake, _request(lab, _plan(lab)), tmp_path)
    assert outcome.passed
    assert fake.reasons == {"gpu02": "gpuforge:gpu.xid:reboot"}
    assert "gpu02" not in fake.upgraded
    assert "repair it first" in outcome.waves[0].skipped["gpu02"]


def test_cli_refuses_an_inventory_generated_from_other_pins(tmp_path: Path) -> None:
    import yaml  # noqa: PLC0415
    from click.testing import CliRunner  # noqa: PLC0415

    from gpuforge.cli import main  # noqa: PLC0415

    runner = CliRunner()
    inv = tmp_path / "inv"
    gen = runner.invoke(main, ["inventory", "generate", str(LAB), "--output", str(inv)])
    assert gen.exit_code == 0, gen.output
    doc = yaml.safe_load(LAB.read_text())
    doc["versions"]["nccl"] = "2.25.1" if doc["versions"]["nccl"] != "2.25.1" else "2.26.2"
    new = tmp_path / "new.yaml"
    new.write_text(yaml.safe_dump(doc, sort_keys=False))
    args = ["upgrade", "run", str(new), "--inventory", str(inv), "--state-dir", str(tmp_path)]
    result = runner.invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "nccl_version" in result.output and "inventory generate" in result.output
    assert not (tmp_path / doc["name"] / "rollout.db").exists(), "nothing ran"


def test_an_inventory_generated_from_other_pins_is_refused(lab: Cluster, tmp_path: Path) -> None:
    import yaml  # noqa: PLC0415

    from gpuforge.inventory.render import all_vars  # noqa: PLC0415
    from gpuforge.upgrade.run import require_generated_pins  # noqa: PLC0415

    group_vars = tmp_path / "generated" / "group_vars"
    group_vars.mkdir(parents=True)
    pins = all_vars(lab)
    (group_vars / "all.yml").write_text(yaml.safe_dump(pins))
    require_generated_pins(lab, tmp_path, LAB)  # the same pins: nothing to say
    (group_vars / "all.yml").write_text(yaml.safe_dump({**pins, "nccl_version": "2.0.0"}))
    with pytest.raises(InputError, match=r"generated from other pins than .*nccl_version 2\.0\.0"):
        require_generated_pins(lab, tmp_path, LAB)
    (group_vars / "all.yml").unlink()
    with pytest.raises(InputError, match="cannot read the generated inventory"):
        require_generated_pins(lab, tmp_path, LAB)
