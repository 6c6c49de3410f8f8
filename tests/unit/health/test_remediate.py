"""Remediation: which nodes it touches, how it admits them, when it escalates to RMA."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuforge.admission import Admission, AdmissionRecord, parse_reason, verdict_reason
from gpuforge.health import remediate as rem
from gpuforge.history import HistoryStore
from gpuforge.rollout.lock import cluster_lock, holder
from gpuforge.slurm.control import SlurmClient, parse_scontrol_nodes
from gpuforge.validate.result import BatchSummary, CheckResult, Level, Status

from ..history.records import T0
from ..slurm.fake import FakeSlurm, Killed

XID = "gpuforge:gpu.xid:reboot"
DAY = 86400.0


@dataclass
class Clock:
    now: float = T0

    def __call__(self) -> float:
        return self.now


@dataclass
class Playbook:
    """A fake remediation play: records each call, fails the nodes in ``fail``."""

    fail: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[tuple[str, ...], str]] = field(default_factory=list)
    kill: bool = False

    def __call__(self, nodes: Sequence[str], action: str) -> Mapping[str, str]:
        self.calls.append((tuple(nodes), action))
        if self.kill:
            raise Killed
        return {n: self.fail[n] for n in nodes if n in self.fail}


@dataclass
class Validator:
    """A fake burn-in: each node gets ``status[node]`` (default pass) for dcgm and gpu_burn."""

    status: dict[str, Status] = field(default_factory=dict)
    calls: list[tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=list)
    slurm: FakeSlurm | None = None
    seen_reservations: list[dict[str, str]] = field(default_factory=list)

    def __call__(self, nodes: Sequence[str], partners: Sequence[str]) -> BatchSummary:
        self.calls.append((tuple(nodes), tuple(partners)))
        if self.slurm is not None:
            self.seen_reservations.append(dict(self.slurm.reservations))
        results = [
            CheckResult(n, check, self.status.get(n, Status.PASS), level=Level.BURNIN)
            for n in nodes
            for check in ("burnin.dcgm_diag", "burnin.gpu_burn.min_gflops")
        ]
        return BatchSummary.build(nodes, results, level=Level.BURNIN)


@dataclass
class Rig:
    slurm: FakeSlurm
    admission: Admission
    history: HistoryStore
    play: Playbook
    validator: Validator
    clock: Clock
    bundles: list[tuple[str, str, str]]
    tmp: Path

    def remediator(self, policy: rem.Policy | None = None) -> rem.Remediator:
        def bundle(node: str, check: str, why: str) -> Path:
            self.bundles.append((node, check, why))
            path = self.tmp / f"{node}-{len(self.bundles)}.tar.gz"
            path.write_bytes(b"")
            return path

        return rem.Remediator(
            admission=self.admission,
            history=self.history,
            act=self.play,
            validate=self.validator,
            bundle=bundle,
            population=sorted(self.slurm.nodes),
            policy=policy or rem.Policy(),
            clock=self.clock,
        )

    def run(self, nodes: Sequence[str] | None = None) -> dict[str, rem.RemediationOutcome]:
        candidates, skipped = rem.candidates_now(self.admission, nodes)
        outcomes = self.remediator().run(candidates)
        return {o.node: o for o in [*outcomes, *skipped]}

    def state(self, node: str) -> tuple[str, str]:
        return self.slurm.nodes[node]


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    slurm = FakeSlurm(
        {
            "gpu01": ("IDLE+DRAIN", XID),
            "gpu02": ("IDLE+DRAIN", "bad fan, ticket 4711"),  # an operator's drain
            "gpu03": ("MIXED+DRAIN", "gpuforge:gpu.ecc_uncorrectable:reset_gpu"),  # busy
            "gpu04": ("IDLE", ""),
            "gpu05": ("IDLE", ""),
        }
    )
    clock = Clock()
    admission = Admission(
        SlurmClient(slurm, "ctl01"),
        AdmissionRecord(tmp_path / "admission.db"),
        source=rem.SOURCE,
        clock=clock,
    )
    history = HistoryStore.open(tmp_path / "history.db")
    return Rig(slurm, admission, history, Playbook(), Validator(slurm=slurm), clock, [], tmp_path)


def _steps(history: HistoryStore, node: str) -> list[str]:
    return [
        str((e.data or {}).get("step"))
        for e in history.events(node=node, kinds=[rem.EVENT_REMEDIATION, rem.EVENT_RMA])
    ]


def test_select_only_idle_gpuforge_drains_for_an_action() -> None:
    by = " [root@2026-11-30T05:00:00]"
    text = "\n".join(
        [
            f"NodeName=a State=IDLE+DRAIN CPUAlloc=0 Reason={XID}{by}",
            "NodeName=b State=IDLE+DRAIN CPUAlloc=0 Reason=disk swap [bob@2026-11-30T05:00:00]",
            f"NodeName=c State=MIXED+DRAIN CPUAlloc=8 Reason={XID}{by}",
            "NodeName=d State=IDLE CPUAlloc=0",
            f"NodeName=e State=IDLE+DRAIN CPUAlloc=0 Reason=gpuforge:join:validate{by}",
            f"NodeName=f State=IDLE+DRAIN CPUAlloc=0 Reason=gpuforge:gpu.xid:rma{by}",
            f"NodeName=g State=IDLE+DRAIN CPUAlloc=0 Reason=gpuforge:gpu.nvlink:inspect{by}",
            f"NodeName=h State=IDLE+COMPLETING+DRAIN CPUAlloc=0 Reason={XID}{by}",
        ]
    )
    candidates, skipped = rem.select(parse_scontrol_nodes(text))
    assert [(c.node, c.check, c.action) for c in candidates] == [
        ("a", "gpu.xid", "reboot"),
        ("g", "gpu.nvlink", "inspect"),
    ]
    why = {o.node: o.detail for o in skipped}
    assert set(why) == {"b", "c", "e", "f", "h"}  # d is in service: not news
    assert "operator" in why["b"]
    assert why["c"].startswith("busy")
    assert why["h"].startswith("busy")
    assert "RMA" in why["f"]


def test_operator_drain_and_busy_node_untouched(rig: Rig) -> None:
    out = rig.run()
    assert out["gpu02"].result == "skipped"
    assert out["gpu03"].result == "skipped"
    assert rig.state("gpu02") == ("IDLE+DRAIN", "bad fan, ticket 4711")
    assert rig.state("gpu03") == ("MIXED+DRAIN", "gpuforge:gpu.ecc_uncorrectable:reset_gpu")
    assert rig.play.calls == [(("gpu01",), "reboot")]
    touched = {n for c in rig.slurm.updates() for n in c[2].removeprefix("NodeName=").split(",")}
    assert not touched & {"gpu02", "gpu03"}
    # named explicitly, they are still left alone
    out = rig.run(["gpu02", "gpu03"])
    assert {o.result for o in out.values()} == {"skipped"}
    assert rig.state("gpu02") == ("IDLE+DRAIN", "bad fan, ticket 4711")


def test_pass_resumes_through_admission_in_a_window(rig: Rig) -> None:
    out = rig.run()
    assert out["gpu01"].result == "resumed"
    assert rig.state("gpu01") == ("IDLE", "")
    # validated with idle in-service partners, inside the maintenance reservation
    assert rig.validator.calls == [(("gpu01",), ("gpu04", "gpu05"))]
    assert rig.validator.seen_reservations == [{"gpuforge_remediate": "gpu[01,04-05]"}]
    assert rig.slurm.reservations == {}  # window closed
    assert rig.state("gpu04") == ("IDLE", "")
    assert _steps(rig.history, "gpu01") == ["start", "acted", "concluded"]
    resumed = [a for a in rig.admission.record.actions() if a.action.action == "resume"]
    assert [a.action.node for a in resumed] == ["gpu01"]


def test_reset_action_goes_to_the_play(rig: Rig) -> None:
    rig.slurm.nodes["gpu03"] = ("IDLE+DRAIN", "gpuforge:gpu.ecc_uncorrectable:reset_gpu")
    out = rig.run()
    assert sorted(rig.play.calls) == [(("gpu01",), "reboot"), (("gpu03",), "reset_gpu")]
    assert out["gpu03"].result == "resumed"


def test_failed_revalidation_stays_drained_with_its_reason(rig: Rig) -> None:
    rig.validator.status["gpu01"] = Status.FAIL
    out = rig.run()
    assert out["gpu01"].result == "failed"
    assert out["gpu01"].failures == 1
    assert rig.state("gpu01") == ("IDLE+DRAIN", XID)
    assert rig.slurm.reservations == {}
    assert rig.bundles == []


def test_two_failures_within_seven_days_escalate_to_rma_with_bundle(rig: Rig) -> None:
    rig.validator.status["gpu01"] = Status.FAIL
    rig.run()
    rig.clock.now += 2 * DAY
    out = rig.run()
    assert out["gpu01"].result == "escalated"
    assert out["gpu01"].failures == 2
    assert rig.state("gpu01") == ("IDLE+DRAIN", "gpuforge:gpu.xid:rma")
    assert rig.bundles and rig.bundles[0][:2] == ("gpu01", "gpu.xid")
    assert out["gpu01"].bundle.endswith(".tar.gz")
    assert _steps(rig.history, "gpu01")[-2:] == ["escalating", "escalated"]
    # an RMA node is left for the person from now on
    rig.clock.now += DAY
    again = rig.run()
    assert again["gpu01"].result == "skipped"
    assert len(rig.play.calls) == 2


def test_failures_older_than_the_window_do_not_count(rig: Rig) -> None:
    rig.validator.status["gpu01"] = Status.FAIL
    rig.run()
    rig.clock.now += 8 * DAY
    out = rig.run()
    assert out["gpu01"].result == "failed"
    assert out["gpu01"].failures == 1
    assert rig.state("gpu01") == ("IDLE+DRAIN", XID)


def test_failed_action_counts_and_leaves_node_drained(rig: Rig) -> None:
    rig.play.fail["gpu01"] = "Reboot the node: timed out waiting for the node"
    out = rig.run()
    assert out["gpu01"].result == "failed"
    assert "timed out" in out["gpu01"].detail
    assert rig.validator.calls == []
    assert rig.state("gpu01") == ("IDLE+DRAIN", XID)
    out = rig.run()
    assert out["gpu01"].result == "escalated"


def test_inconclusive_revalidation_holds_without_counting(rig: Rig) -> None:
    rig.validator.status["gpu01"] = Status.ERROR
    out = rig.run()
    assert out["gpu01"].result == "held"
    assert out["gpu01"].failures == 0
    assert rig.state("gpu01") == ("IDLE+DRAIN", XID)


def test_inspect_goes_straight_to_rma(rig: Rig) -> None:
    rig.slurm.nodes["gpu01"] = ("IDLE+DRAIN", "gpuforge:gpu.nvlink:inspect")
    out = rig.run()
    assert out["gpu01"].result == "escalated"
    assert rig.play.calls == []
    assert rig.state("gpu01") == ("IDLE+DRAIN", "gpuforge:gpu.nvlink:rma")
    assert rig.bundles[0][:2] == ("gpu01", "gpu.nvlink")


def test_dry_run_changes_nothing(rig: Rig) -> None:
    rig.slurm.nodes["gpu04"] = ("IDLE+DRAIN", "gpuforge:gpu.nvlink:inspect")
    before = dict(rig.slurm.nodes)
    candidates, _ = rem.candidates_now(rig.admission, None)
    plan = {o.node: o for o in rig.remediator().plan(candidates)}
    assert plan["gpu01"].result == "planned"
    assert "would reboot" in plan["gpu01"].detail
    assert "would escalate" in plan["gpu04"].detail
    assert rig.slurm.nodes == before
    assert rig.slurm.updates() == []
    assert rig.slurm.reservations == {}
    assert rig.play.calls == []
    assert rig.validator.calls == []
    assert rig.bundles == []
    assert rig.history.events() == []
    assert rig.admission.record.actions() == []


def test_killed_after_the_action_validates_without_acting_again(rig: Rig) -> None:
    def kill_in_window(argv: list[str]) -> str | None:
        if argv[1:2] == ["create"]:  # the window is recorded, then the run dies
            raise Killed
        return None

    rig.slurm.intercept = kill_in_window
    with pytest.raises(Killed):
        rig.run()
    assert _steps(rig.history, "gpu01") == ["start", "acted"]
    rig.slurm.intercept = None
    out = rig.run()
    assert out["gpu01"].result == "resumed"
    assert rig.play.calls == [(("gpu01",), "reboot")]  # not rebooted twice
    assert rig.slurm.reservations == {}
    assert rig.admission.record.windows() == []


def test_killed_during_the_action_runs_it_again(rig: Rig) -> None:
    rig.play.kill = True
    with pytest.raises(Killed):
        rig.run()
    assert _steps(rig.history, "gpu01") == ["start"]
    assert rig.state("gpu01") == ("IDLE+DRAIN", XID)
    rig.play.kill = False
    out = rig.run()
    assert out["gpu01"].result == "resumed"
    assert len(rig.play.calls) == 2
    assert out["gpu01"].failures == 0  # the interrupted attempt does not count


def test_rma_verdict_reason_is_the_check_with_rma() -> None:
    verdict = rem.rma_verdict("gpu01", "gpu.row_remap", "two failures")
    reason = parse_reason(verdict_reason(verdict, "rma"))
    assert reason is not None
    assert (reason.check, reason.action) == ("gpu.row_remap", "rma")


def test_dry_run_counts_earlier_failures(rig: Rig) -> None:
    rig.validator.status["gpu01"] = Status.FAIL
    rig.run()
    events = len(rig.history.events())
    candidates, _ = rem.candidates_now(rig.admission, None)
    (plan,) = rig.remediator(rem.Policy(failures=1)).plan(candidates)
    assert plan.failures == 1
    assert "would escalate to RMA (1 remediations within 7 days failed or did not hold)" in (
        plan.detail
    )
    assert len(rig.history.events()) == events
    assert rig.state("gpu01") == ("IDLE+DRAIN", XID)


def test_a_fix_that_does_not_hold_counts(rig: Rig) -> None:
    assert rig.run()["gpu01"].result == "resumed"
    rig.clock.now += DAY
    rig.slurm.nodes["gpu01"] = ("IDLE+DRAIN", XID)  # the same fault is back
    again = rig.run()["gpu01"]
    assert (again.result, again.failures) == ("resumed", 1)
    rig.clock.now += DAY
    rig.slurm.nodes["gpu01"] = ("IDLE+DRAIN", XID)
    third = rig.run()["gpu01"]
    assert third.result == "escalated"  # straight away: two fixes within 7 days did not hold
    assert "did not hold" in third.detail
    assert len(rig.play.calls) == 2
    assert rig.state("gpu01") == ("IDLE+DRAIN", "gpuforge:gpu.xid:rma")


def test_a_fix_of_another_check_does_not_count(rig: Rig) -> None:
    assert rig.run()["gpu01"].result == "resumed"
    rig.clock.now += DAY
    rig.slurm.nodes["gpu01"] = ("IDLE+DRAIN", "gpuforge:gpu.row_remap:reset_gpu")
    out = rig.run()["gpu01"]
    assert (out.result, out.failures) == ("resumed", 0)


def test_remediate_under_the_lock_then_the_skipped_and_the_exit_code(rig: Rig) -> None:
    lock = rig.tmp / "rollout.lock"
    outcomes = rem.remediate(rig.remediator(), None, dry_run=False, lock_path=lock)
    assert [(o.node, o.result) for o in outcomes] == [
        ("gpu01", "resumed"),
        ("gpu02", "skipped"),
        ("gpu03", "skipped"),
    ]
    assert rem.exit_code(outcomes) == 0
    assert lock.exists() and holder(lock) is None  # held for the run, released after


def test_a_dry_run_plans_without_the_lock(rig: Rig) -> None:
    with cluster_lock(rig.tmp / "rollout.lock", "someone else"):
        outcomes = rem.remediate(
            rig.remediator(), ["gpu01"], dry_run=True, lock_path=rig.tmp / "rollout.lock"
        )
    assert [(o.node, o.result) for o in outcomes] == [("gpu01", "planned")]
    assert rig.play.calls == []
    assert rig.state("gpu01") == ("IDLE+DRAIN", XID)


@pytest.mark.parametrize(
    ("results", "code"),
    [
        (("resumed", "skipped"), 0),
        (("resumed", "held"), 2),
        (("held", "failed"), 1),
        (("escalated",), 1),
        ((), 0),
    ],
)
def test_exit_code_failures_first_then_inconclusive(results: tuple[str, ...], code: int) -> None:
    assert (
        rem.exit_code([rem.RemediationOutcome(f"gpu0{i}", r, "") for i, r in enumerate(results)])
        == code
    )
