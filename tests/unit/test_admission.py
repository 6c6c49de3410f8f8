"""The admission rules against a fake Slurm controller: one suite for deploy, validate, health."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpuforge.admission import (
    JOIN_REASON,
    REASON_MAX,
    Admission,
    AdmissionRecord,
    BreakerPolicy,
    format_reason,
    is_ours,
    parse_reason,
    verdict_reason,
)
from gpuforge.cli import main
from gpuforge.errors import InputError, OperationError
from gpuforge.resources import project_path
from gpuforge.slurm.control import SlurmClient
from gpuforge.validate.result import CheckResult, NodeVerdict, Status, Verdict
from tests.unit.slurm.fake import FakeSlurm, Killed

OPERATOR = "RMA 4711 waiting for a new HGX board"


def passed(node: str) -> NodeVerdict:
    return NodeVerdict(node, Verdict.ADMIT)


def failed(node: str, *checks: str) -> NodeVerdict:
    return NodeVerdict(node, Verdict.QUARANTINE, checks or ("gpu.count",))


def held(node: str) -> NodeVerdict:
    return NodeVerdict(node, Verdict.HOLD, ("burnin.dcgm_diag",))


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake() -> FakeSlurm:
    return FakeSlurm(
        {
            "gpu01": ("IDLE", ""),
            "gpu02": ("IDLE", ""),
            "gpu03": ("IDLE+DRAIN", JOIN_REASON),  # new node, joined drained
            "gpu04": ("IDLE+DRAIN", OPERATOR),  # an operator's drain
            "gpu05": ("IDLE+DRAIN", "gpuforge:gpu.count:quarantine"),  # ours, from before
            "gpu06": ("DOWN+NOT_RESPONDING", "Not responding"),  # Slurm's own
        }
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def record(tmp_path: Path) -> AdmissionRecord:
    return AdmissionRecord(tmp_path / "lab" / "admission.db")


def make(fake: FakeSlurm, record: AdmissionRecord, clock: Clock, **kw: object) -> Admission:
    return Admission(SlurmClient(fake, "ctl01"), record, source="test", clock=clock, **kw)  # type: ignore[arg-type]


@pytest.fixture
def adm(fake: FakeSlurm, record: AdmissionRecord, clock: Clock) -> Admission:
    return make(fake, record, clock)


# -- the reason format ---------------------------------------------------------------------------


def test_reason_format_and_parse_round_trip() -> None:
    text = format_reason("burnin.ib_write_bw[rail3]", "quarantine", more=2)
    assert text == "gpuforge:burnin.ib_write_bw[rail3]+2:quarantine"
    parsed = parse_reason(text)
    assert parsed is not None
    assert (parsed.check, parsed.more, parsed.action) == (
        "burnin.ib_write_bw[rail3]",
        2,
        "quarantine",
    )
    assert str(parsed) == text


def test_reason_is_bounded_and_the_cut_is_marked() -> None:
    long = "nccl.multinode." + "very_long_test_name_" * 10
    text = format_reason(long, "quarantine", more=12)
    assert len(text) == REASON_MAX
    assert text.startswith("gpuforge:nccl.multinode.very_long")
    assert text.endswith("~+12:quarantine")
    parsed = parse_reason(text)
    assert parsed is not None
    assert parsed.truncated
    assert (parsed.more, parsed.action) == (12, "quarantine")


def test_reason_keeps_fields_apart() -> None:
    text = format_reason("fabric port: mlx5_0", "inspect")
    assert text == "gpuforge:fabric_port__mlx5_0:inspect"
    assert is_ours(text)


def test_unknown_action_is_refused() -> None:
    with pytest.raises(InputError, match="unknown drain action"):
        format_reason("gpu.count", "format_the_disk")


@pytest.mark.parametrize(
    "reason",
    [
        OPERATOR,
        "gpuforge: failed gpu.count",  # free text that merely starts with our name
        "gpuforge-healthcheck: munge is not running",
        "gpuforge:gpu.count:explode",  # not an action of ours
        "Not responding",
        "",
        "maintenance gpuforge:gpu.count:quarantine",
    ],
)
def test_only_our_format_is_ours(reason: str) -> None:
    assert not is_ours(reason)


def test_verdict_reason_names_the_first_check_and_counts_the_rest() -> None:
    v = failed("gpu01", "gpu.count", "gpu.ecc_enabled", "burnin.gpu_burn")
    assert verdict_reason(v) == "gpuforge:gpu.count+2:quarantine"
    assert verdict_reason(v, "reboot") == "gpuforge:gpu.count+2:reboot"


def test_join_reason_is_ours() -> None:
    assert parse_reason(JOIN_REASON) is not None


# -- admit ---------------------------------------------------------------------------------------


def test_failed_node_is_drained_with_the_formatted_reason(adm: Admission, fake: FakeSlurm) -> None:
    (action,) = adm.admit([failed("gpu01", "gpu.count", "burnin.gpu_burn")])
    assert fake.nodes["gpu01"] == ("IDLE+DRAIN", "gpuforge:gpu.count+1:quarantine")
    assert (action.action, action.changed, action.reason) == (
        "drain",
        True,
        "gpuforge:gpu.count+1:quarantine",
    )
    assert (action.before, action.after) == ("IDLE", "IDLE+DRAIN")


def test_drain_action_comes_from_the_caller(adm: Admission, fake: FakeSlurm) -> None:
    adm.admit([failed("gpu01", "health.xid[79]")], actions={"gpu01": "reboot"})
    assert fake.nodes["gpu01"][1] == "gpuforge:health.xid[79]:reboot"


def test_drain_action_comes_from_the_failed_checks(adm: Admission, fake: FakeSlurm) -> None:
    def result(check: str, action: str = "") -> CheckResult:
        return CheckResult("gpu01", check, Status.FAIL, action=action)

    results = (
        result("gpu.count"),
        result("gpu.xid", "reboot"),
        result("gpu.ecc", "reset_gpu"),
    )
    verdict = NodeVerdict(
        "gpu01", Verdict.QUARANTINE, ("gpu.count", "gpu.xid", "gpu.ecc"), results=results
    )
    assert verdict.action == "reboot"
    adm.admit([verdict])
    # the check that calls for the action is named first
    assert fake.nodes["gpu01"][1] == "gpuforge:gpu.xid+2:reboot"
    # an action the drain reason cannot carry (monitor) never stands for quarantine
    plain = NodeVerdict("gpu03", Verdict.QUARANTINE, ("x",), results=(result("x", "monitor"),))
    assert plain.action == ""


def test_operator_drain_is_never_resumed(adm: Admission, fake: FakeSlurm) -> None:
    (action,) = adm.admit([passed("gpu04")])
    assert fake.nodes["gpu04"] == ("IDLE+DRAIN", OPERATOR)
    assert (action.action, action.changed) == ("none", False)
    assert OPERATOR in action.detail
    assert fake.updates() == []


def test_operator_drain_keeps_its_reason_when_the_node_fails(
    adm: Admission, fake: FakeSlurm
) -> None:
    (action,) = adm.admit([failed("gpu04")])
    assert fake.nodes["gpu04"] == ("IDLE+DRAIN", OPERATOR)
    assert action.action == "none"
    assert fake.updates() == []


def test_slurm_own_down_reason_is_not_resumed(adm: Admission, fake: FakeSlurm) -> None:
    (action,) = adm.admit([passed("gpu06")])
    assert fake.nodes["gpu06"] == ("DOWN+NOT_RESPONDING", "Not responding")
    assert action.action == "none"


def test_inconclusive_node_is_held_untouched(adm: Admission, fake: FakeSlurm) -> None:
    actions = adm.admit([held("gpu01"), held("gpu03"), held("gpu05")])
    assert [a.action for a in actions] == ["hold", "hold", "hold"]
    assert not any(a.changed for a in actions)
    assert fake.nodes["gpu01"] == ("IDLE", "")
    assert fake.nodes["gpu03"] == ("IDLE+DRAIN", JOIN_REASON)
    assert fake.updates() == []


def test_passed_node_we_drained_is_resumed(adm: Admission, fake: FakeSlurm) -> None:
    actions = {a.node: a for a in adm.admit([passed("gpu03"), passed("gpu05"), passed("gpu01")])}
    assert fake.nodes["gpu03"] == ("IDLE", "")
    assert fake.nodes["gpu05"] == ("IDLE", "")
    assert (actions["gpu03"].action, actions["gpu03"].changed) == ("resume", True)
    assert (actions["gpu01"].action, actions["gpu01"].changed) == ("none", False)
    assert fake.updates() == [["scontrol", "update", "NodeName=gpu[03,05]", "State=RESUME"]]


def test_admit_is_idempotent(adm: Admission, fake: FakeSlurm) -> None:
    batch = [failed("gpu01"), passed("gpu03"), held("gpu02"), passed("gpu04")]
    adm.admit(batch)
    state = dict(fake.nodes)
    updates = len(fake.updates())
    again = adm.admit(batch)
    assert fake.nodes == state
    assert len(fake.updates()) == updates
    assert not any(a.changed for a in again)


def test_actions_are_recorded(adm: Admission, record: AdmissionRecord) -> None:
    adm.admit([failed("gpu01"), passed("gpu03")])
    rows = record.actions()
    assert [(r.source, r.action.node, r.action.action) for r in rows] == [
        ("test", "gpu01", "drain"),
        ("test", "gpu03", "resume"),
    ]
    assert rows[0].out_of_service
    assert not rows[1].out_of_service


def test_unknown_node_is_bad_input(adm: Admission) -> None:
    with pytest.raises(InputError, match="gpu99"):
        adm.admit([failed("gpu99")])


# -- shadow mode ---------------------------------------------------------------------------------


def test_shadow_mode_records_and_changes_nothing(
    fake: FakeSlurm, record: AdmissionRecord, clock: Clock
) -> None:
    adm = make(fake, record, clock, shadow=True)
    before = dict(fake.nodes)
    actions = {a.node: a for a in adm.admit([failed("gpu01"), passed("gpu03")])}
    assert fake.nodes == before
    assert fake.updates() == []
    assert actions["gpu01"].action == "drain"
    assert actions["gpu01"].shadow
    assert not actions["gpu01"].changed
    assert actions["gpu01"].detail.startswith("shadow mode, not done")
    assert [r.action.shadow for r in record.actions()] == [True, True]


# -- the circuit breaker -------------------------------------------------------------------------


@pytest.fixture
def fleet() -> FakeSlurm:
    return FakeSlurm({f"gpu{i:02d}": ("IDLE", "") for i in range(1, 21)})


def leaves() -> dict[str, str]:
    return {f"gpu{i:02d}": f"leaf{(i - 1) // 5}" for i in range(1, 21)}


def test_breaker_trips_at_the_share_limit_and_records_refusals(
    fleet: FakeSlurm, record: AdmissionRecord, clock: Clock
) -> None:
    policy = BreakerPolicy(population=20, max_fraction=0.1, window_s=600)  # 2 nodes
    adm = make(fleet, record, clock, breaker=policy)
    actions = adm.admit([failed(f"gpu{i:02d}") for i in (1, 7, 13, 19)])
    assert [a.action for a in actions] == ["drain", "drain", "refused", "refused"]
    drained = {n for n, (st, _) in fleet.nodes.items() if "DRAIN" in st}
    assert drained == {"gpu01", "gpu07"}
    refused = adm.refused()
    assert [a.node for a in refused] == ["gpu13", "gpu19"]
    assert refused[0].reason == "gpuforge:gpu.count:quarantine"  # what it would have written
    assert "limit 2" in refused[0].detail


def test_breaker_counts_drains_of_earlier_runs_within_its_window(
    fleet: FakeSlurm, record: AdmissionRecord, clock: Clock
) -> None:
    policy = BreakerPolicy(population=20, max_fraction=0.1, window_s=600)
    make(fleet, record, clock, breaker=policy).admit([failed("gpu01"), failed("gpu02")])
    clock.now += 300  # a second health run, five minutes later: same window
    (third,) = make(fleet, record, clock, breaker=policy).admit([failed("gpu03")])
    assert third.action == "refused"
    clock.now += 301  # the first drains have left the window
    (fourth,) = make(fleet, record, clock, breaker=policy).admit([failed("gpu03")])
    assert (fourth.action, fleet.nodes["gpu03"][0]) == ("drain", "IDLE+DRAIN")


def test_breaker_limits_drains_per_leaf(
    fleet: FakeSlurm, record: AdmissionRecord, clock: Clock
) -> None:
    policy = BreakerPolicy(population=20, max_fraction=0.5, max_per_group=1, groups=leaves())
    adm = make(fleet, record, clock, breaker=policy)
    actions = {
        a.node: a.action for a in adm.admit([failed(n) for n in ("gpu01", "gpu02", "gpu06")])
    }
    assert actions == {"gpu01": "drain", "gpu02": "refused", "gpu06": "drain"}
    assert "leaf0" in adm.refused()[0].detail


def test_breaker_never_refuses_a_node_already_out_of_service(
    fake: FakeSlurm, record: AdmissionRecord, clock: Clock
) -> None:
    policy = BreakerPolicy(population=100, max_fraction=0.01)  # one node
    adm = make(fake, record, clock, breaker=policy)
    actions = {a.node: a for a in adm.admit([failed("gpu01"), failed("gpu03"), failed("gpu02")])}
    # gpu03 was drained already (a new node): draining it again takes nothing out of service
    assert actions["gpu03"].action == "drain"
    assert actions["gpu01"].action == "drain"
    assert actions["gpu02"].action == "refused"
    assert fake.nodes["gpu02"] == ("IDLE", "")


def test_breaker_policy_is_checked() -> None:
    with pytest.raises(InputError, match="max_fraction"):
        BreakerPolicy(population=10, max_fraction=0)
    with pytest.raises(InputError, match="population"):
        BreakerPolicy(population=0)


# -- maintenance windows -------------------------------------------------------------------------


def test_window_resumes_inside_a_root_reservation_and_close_restores(
    adm: Admission, fake: FakeSlurm
) -> None:
    adm.open_window("gf_val", ["gpu01", "gpu03", "gpu04"])
    assert fake.reservations == {"gf_val": "gpu[01,03-04]"}
    assert fake.nodes["gpu03"] == ("IDLE", "")
    assert fake.nodes["gpu04"] == ("IDLE", "")  # schedulable for root's acceptance jobs only
    restored = adm.close_window("gf_val")
    assert fake.reservations == {}
    assert fake.nodes["gpu03"] == ("IDLE+DRAIN", JOIN_REASON)
    assert fake.nodes["gpu04"] == ("IDLE+DRAIN", OPERATOR)
    assert fake.nodes["gpu01"] == ("IDLE", "")
    assert {a.node for a in restored} == {"gpu03", "gpu04"}
    assert adm.open_windows() == []


def test_admit_inside_a_window_judges_against_the_state_before_it(
    adm: Admission, fake: FakeSlurm
) -> None:
    adm.open_window("gf_val", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05"])
    actions = {
        a.node: a
        for a in adm.admit(
            [passed("gpu01"), failed("gpu02"), passed("gpu03"), passed("gpu04"), held("gpu05")],
            window="gf_val",
        )
    }
    adm.close_window("gf_val")
    assert fake.nodes["gpu01"] == ("IDLE", "")
    assert fake.nodes["gpu02"] == ("IDLE+DRAIN", "gpuforge:gpu.count:quarantine")
    assert fake.nodes["gpu03"] == ("IDLE", "")  # new node admitted
    assert fake.nodes["gpu04"] == ("IDLE+DRAIN", OPERATOR)  # passed, still the operator's
    assert fake.nodes["gpu05"] == ("IDLE+DRAIN", "gpuforge:gpu.count:quarantine")  # held as before
    assert (actions["gpu03"].action, actions["gpu03"].changed) == ("resume", True)
    assert (actions["gpu04"].action, actions["gpu04"].changed) == ("none", False)
    assert actions["gpu05"].action == "hold"
    assert fake.reservations == {}


def test_window_survives_a_killed_run(
    fake: FakeSlurm, record: AdmissionRecord, clock: Clock
) -> None:
    first = make(fake, record, clock)
    first.open_window("gf_val", ["gpu03", "gpu04"])

    def die(argv: list[str]) -> str | None:
        raise Killed  # the run is killed while validating: nothing else reaches Slurm

    fake.intercept = die
    with pytest.raises(Killed):
        first.admit([passed("gpu03")], window="gf_val")
    fake.intercept = None
    assert fake.nodes["gpu04"] == ("IDLE", "")  # resumed inside the window, as the kill left it

    # the next run (a new process: a new Admission on the same record) finds and closes it
    second = make(fake, AdmissionRecord(record.path), clock)
    (left,) = second.open_windows()
    assert (left.name, left.nodes) == ("gf_val", ("gpu03", "gpu04"))
    second.close_window("gf_val")
    assert fake.nodes["gpu03"] == ("IDLE+DRAIN", JOIN_REASON)
    assert fake.nodes["gpu04"] == ("IDLE+DRAIN", OPERATOR)
    assert fake.reservations == {}
    assert second.open_windows() == []


def test_window_killed_while_opening_is_closed_by_the_next_run(
    fake: FakeSlurm, record: AdmissionRecord, clock: Clock
) -> None:
    def die_on_resume(argv: list[str]) -> str | None:
        if "State=RESUME" in argv:
            raise Killed
        return None

    fake.intercept = die_on_resume
    with pytest.raises(Killed):
        make(fake, record, clock).open_window("gf_val", ["gpu03"])
    fake.intercept = None
    make(fake, record, clock).close_window("gf_val")
    assert fake.nodes["gpu03"] == ("IDLE+DRAIN", JOIN_REASON)
    assert fake.reservations == {}


def test_reopening_a_killed_window_keeps_the_state_before_it(
    fake: FakeSlurm, record: AdmissionRecord, clock: Clock
) -> None:
    make(fake, record, clock).open_window("gf_val", ["gpu03", "gpu04"])
    # killed; the rerun opens the same window over its batch: gpu03 is resumed now only because
    # of the first window, so its recorded state, not its current one, is what gets restored
    again = make(fake, record, clock)
    again.open_window("gf_val", ["gpu03", "gpu04", "gpu01"])
    again.admit([held("gpu03"), passed("gpu04"), passed("gpu01")], window="gf_val")
    again.close_window("gf_val")
    assert fake.nodes["gpu03"] == ("IDLE+DRAIN", JOIN_REASON)
    assert fake.nodes["gpu04"] == ("IDLE+DRAIN", OPERATOR)
    assert fake.nodes["gpu01"] == ("IDLE", "")


def test_close_is_idempotent(adm: Admission, fake: FakeSlurm) -> None:
    adm.open_window("gf_val", ["gpu03"])
    adm.close_window("gf_val")
    updates = len(fake.updates())
    assert adm.close_window("gf_val") == []
    assert len(fake.updates()) == updates


def test_admit_in_a_window_that_is_not_open_fails(adm: Admission) -> None:
    with pytest.raises(OperationError, match="not open"):
        adm.admit([passed("gpu01")], window="gf_nothing")


def test_shadow_admit_in_a_window_leaves_restoring_to_close(
    fake: FakeSlurm, record: AdmissionRecord, clock: Clock
) -> None:
    adm = make(fake, record, clock, shadow=True)
    adm.open_window("gf_val", ["gpu03"])
    adm.admit([passed("gpu03")], window="gf_val")
    adm.close_window("gf_val")
    assert fake.nodes["gpu03"] == ("IDLE+DRAIN", JOIN_REASON)


def test_drained_during_the_window_by_someone_else_stays_drained(
    adm: Admission, fake: FakeSlurm
) -> None:
    adm.open_window("gf_val", ["gpu03"])
    fake.nodes["gpu03"] = ("IDLE+DRAIN", "gpuforge-healthcheck: munge is not running")
    (action,) = adm.admit([passed("gpu03")], window="gf_val")
    adm.close_window("gf_val")
    assert fake.nodes["gpu03"] == ("IDLE+DRAIN", "gpuforge-healthcheck: munge is not running")
    assert (action.action, action.changed) == ("none", False)
    assert "drained since by someone else" in action.detail


# -- partners ------------------------------------------------------------------------------------


def test_idle_in_service_partners(adm: Admission, fake: FakeSlurm) -> None:
    fake.nodes["gpu02"] = ("ALLOCATED", "")
    assert adm.idle_in_service(["gpu01", "gpu02", "gpu03", "gpu04"], 2) == ["gpu01"]
    assert adm.idle_in_service([], 2) == []


# -- the operator's view: gpuforge slurm window ----------------------------------------------------


def test_cli_lists_and_closes_a_window_a_killed_run_left(
    fake: FakeSlurm, tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = AdmissionRecord(tmp_path / "lab" / "admission.db")
    make(fake, record, clock).open_window("gf_val", ["gpu03", "gpu04"])  # then the run was killed
    monkeypatch.setattr("gpuforge.cli.slurm._client", lambda *_a: SlurmClient(fake, "ctl01"))
    cli = CliRunner()
    listed = cli.invoke(
        main, ["slurm", "window", "list", "--cluster", "lab", "--state-dir", str(tmp_path)]
    )
    assert listed.exit_code == 0, listed.output
    assert "gf_val: gpu[03-04] (2 nodes, 2 drained before, 0 decided)" in listed.output
    closed = cli.invoke(
        main,
        ["slurm", "window", "close", "gf_val", "--cluster", "lab", "--state-dir", str(tmp_path)],
    )
    assert closed.exit_code == 0, closed.output
    assert fake.nodes["gpu03"] == ("IDLE+DRAIN", JOIN_REASON)
    assert fake.nodes["gpu04"] == ("IDLE+DRAIN", OPERATOR)
    assert fake.reservations == {}
    again = cli.invoke(
        main, ["slurm", "window", "list", "--cluster", "lab", "--state-dir", str(tmp_path)]
    )
    assert again.output == ""


def test_cli_close_without_a_record_is_bad_input(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["slurm", "window", "close", "x", "--cluster", "lab", "--state-dir", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "no admission record" in result.output


def test_the_slurm_role_joins_new_nodes_with_a_reason_admission_lifts() -> None:
    defaults = yaml.safe_load(project_path("roles", "slurm", "defaults", "main.yml").read_text())
    assert defaults["slurm_join_drained_reason"] == JOIN_REASON
    assert is_ours(defaults["slurm_join_drained_reason"])


def test_close_keeps_a_drain_set_during_the_window(adm: Admission, fake: FakeSlurm) -> None:
    adm.open_window("gf_val", ["gpu03", "gpu04"])
    fake.nodes["gpu04"] = ("IDLE+DRAIN", "PSU replaced, burn-in tomorrow")  # operator, meanwhile
    restored = adm.close_window("gf_val")
    assert fake.nodes["gpu04"] == ("IDLE+DRAIN", "PSU replaced, burn-in tomorrow")
    assert fake.nodes["gpu03"] == ("IDLE+DRAIN", JOIN_REASON)
    assert [a.node for a in restored] == ["gpu03"]


@pytest.mark.parametrize(
    "damage",
    [b"not a database at all\n", b"SQLite format 3\x00" + bytes(range(256)) * 32],
    ids=["text", "garbage pages"],
)
def test_unreadable_admission_record_is_an_input_error(tmp_path: Path, damage: bytes) -> None:
    """A corrupt admission.db ended deploy in sqlite3.DatabaseError and a traceback."""
    db = tmp_path / "lab" / "admission.db"
    AdmissionRecord(db)
    db.write_bytes(damage)
    with pytest.raises(InputError, match=r"admission record is unreadable .*move it aside"):
        AdmissionRecord(db)
    assert db.read_bytes() == damage
