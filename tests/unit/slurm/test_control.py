"""Slurm control: parsers on real 22.05 output, idempotent drain/resume, reservations, the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpuforge.admission import AdmissionRecord
from gpuforge.cli import main
from gpuforge.command import CommandResult, LocalRunner, SshRunner
from gpuforge.errors import InputError, OperationError
from gpuforge.slurm import control as slurm
from gpuforge.slurm.control import SlurmClient
from tests.unit.slurm.fake import FakeSlurm

FIXTURES = Path(__file__).parents[1] / "fixtures" / "slurm"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# -- parsers -----------------------------------------------------------------------------------


def test_oneliner_parses_every_node() -> None:
    nodes = slurm.parse_scontrol_nodes(fixture("scontrol_show_node_oneliner_22.05.txt"))
    assert [n.name for n in nodes] == ["gpu01", "gpu02", "gpu03", "gpu04"]


@pytest.mark.parametrize(
    ("name", "state", "flags", "drained"),
    [
        ("gpu01", "IDLE", (), False),
        ("gpu02", "MIXED", ("DRAIN",), True),
        ("gpu03", "IDLE", ("DRAIN",), True),
        ("gpu04", "DOWN", ("NOT_RESPONDING",), False),
    ],
)
def test_oneliner_states(name: str, state: str, flags: tuple[str, ...], drained: bool) -> None:
    nodes = {
        n.name: n
        for n in slurm.parse_scontrol_nodes(fixture("scontrol_show_node_oneliner_22.05.txt"))
    }
    assert (nodes[name].state, nodes[name].flags, nodes[name].drained) == (state, flags, drained)


def test_reason_keeps_free_text_and_splits_user_and_time() -> None:
    nodes = slurm.parse_scontrol_nodes(fixture("scontrol_show_node_oneliner_22.05.txt"))
    gpu02 = nodes[1]
    assert gpu02.reason == "gpuforge: nccl busbw 312 GB/s < 360 GB/s"
    assert (gpu02.reason_user, gpu02.reason_time) == ("root", "2026-11-30T05:02:10")


def test_os_field_with_spaces_does_not_leak_into_other_fields() -> None:
    gpu01 = slurm.parse_scontrol_nodes(fixture("scontrol_show_node_oneliner_22.05.txt"))[0]
    assert gpu01.fields["OS"].startswith("Linux 6.1.0-27-amd64 #1 SMP")
    assert gpu01.real_memory_mb == 2063937
    assert (gpu01.cpus, gpu01.gres, gpu01.partitions) == (224, "gpu:h100:8", ("gpu",))
    assert gpu01.version == "22.05.8"
    assert gpu01.reason == ""


def test_multiline_form_matches_oneliner() -> None:
    multi = slurm.parse_scontrol_nodes(fixture("scontrol_show_node_22.05.txt"))
    one = slurm.parse_scontrol_nodes(fixture("scontrol_show_node_oneliner_22.05.txt"))
    assert multi[0] == one[1]
    assert multi[1].partitions == ("gpu", "debug")
    assert multi[1].state_text == "ALLOCATED"
    assert multi[1].cpus_alloc == 224


def test_reason_with_equals_sign_is_kept_whole() -> None:
    line = (
        "NodeName=gpu07 State=IDLE+DRAIN Partitions=gpu"
        " Reason=XID=79 GPU fell off the bus [root@2026-11-30T05:00:00]"
    )
    (node,) = slurm.parse_scontrol_nodes(line)
    assert node.reason == "XID=79 GPU fell off the bus"
    assert node.partitions == ("gpu",)


def test_no_nodes_is_empty() -> None:
    assert slurm.parse_scontrol_nodes("No nodes in the system\n") == []


def test_garbage_is_rejected() -> None:
    with pytest.raises(InputError):
        slurm.parse_scontrol_nodes("slurm_load_node error: Unable to contact slurm controller")


def test_sinfo_rows() -> None:
    rows = slurm.parse_sinfo(fixture("sinfo_node_22.05.txt"))
    assert [(r.node, r.partition, r.state) for r in rows] == [
        ("gpu01", "gpu", "idle"),
        ("gpu02", "gpu", "draining"),
        ("gpu03", "gpu", "drained"),
        ("gpu04", "gpu", "down*"),
    ]
    assert rows[0].reason == ""
    assert rows[2].reason == "gpuforge-healthcheck: munge | unmunge failed"


def test_sinfo_rejects_other_formats() -> None:
    with pytest.raises(InputError):
        slurm.parse_sinfo("PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST\n")


def test_hostlists() -> None:
    assert slurm.expand_nodes("gpu[01-03],ctl01") == ["gpu01", "gpu02", "gpu03", "ctl01"]
    assert slurm.collect_nodes(["gpu01", "gpu02", "gpu04"]) == "gpu[01-02,04]"
    with pytest.raises(InputError):
        slurm.expand_nodes("gpu[01-")


# -- operations against a fake controller ------------------------------------------------------


@pytest.fixture
def fake() -> FakeSlurm:
    return FakeSlurm(
        {
            "gpu01": ("IDLE", ""),
            "gpu02": ("IDLE", ""),
            "gpu03": ("IDLE+DRAIN", "burn-in failed"),
            "gpu04": ("DOWN+NOT_RESPONDING", "Not responding"),
        }
    )


@pytest.fixture
def ctl(fake: FakeSlurm) -> SlurmClient:
    return SlurmClient(fake, "ctl01")


def test_drain_issues_one_update_for_a_hostlist(ctl: SlurmClient, fake: FakeSlurm) -> None:
    changes = slurm.drain(ctl, "gpu[01-02]", "burn-in failed")
    assert [c.changed for c in changes] == [True, True]
    assert fake.updates() == [
        ["scontrol", "update", "NodeName=gpu[01-02]", "State=DRAIN", "Reason=burn-in failed"]
    ]
    assert changes[0].after == "IDLE+DRAIN"


def test_drain_same_reason_changes_nothing(ctl: SlurmClient, fake: FakeSlurm) -> None:
    changes = slurm.drain(ctl, "gpu03", "burn-in failed")
    assert [c.changed for c in changes] == [False]
    assert fake.updates() == []


def test_drain_twice_is_idempotent(ctl: SlurmClient, fake: FakeSlurm) -> None:
    slurm.drain(ctl, "gpu01", "maintenance")
    again = slurm.drain(ctl, "gpu01", "maintenance")
    assert [c.changed for c in again] == [False]
    assert len(fake.updates()) == 1


def test_drain_with_new_reason_updates_it(ctl: SlurmClient, fake: FakeSlurm) -> None:
    (change,) = slurm.drain(ctl, "gpu03", "XID 79")
    assert change.changed
    assert fake.nodes["gpu03"] == ("IDLE+DRAIN", "XID 79")


def test_drain_needs_a_reason(ctl: SlurmClient, fake: FakeSlurm) -> None:
    with pytest.raises(InputError, match="reason"):
        slurm.drain(ctl, "gpu01", "   ")
    assert fake.calls == []


def test_resume_only_touches_drained_or_down(ctl: SlurmClient, fake: FakeSlurm) -> None:
    changes = slurm.resume(ctl, "gpu[01,03-04]", "passed burn-in")
    assert {c.node: c.changed for c in changes} == {"gpu01": False, "gpu03": True, "gpu04": True}
    assert fake.updates() == [["scontrol", "update", "NodeName=gpu[03-04]", "State=RESUME"]]
    assert all(c.reason == "passed burn-in" for c in changes)


def test_resume_in_service_node_changes_nothing(ctl: SlurmClient, fake: FakeSlurm) -> None:
    (change,) = slurm.resume(ctl, "gpu02", "why not")
    assert not change.changed
    assert fake.updates() == []


def test_unknown_node_is_bad_input(ctl: SlurmClient) -> None:
    with pytest.raises(InputError, match="gpu99"):
        slurm.node_states(ctl, "gpu99")


def test_failed_update_is_an_operation_error(ctl: SlurmClient, fake: FakeSlurm) -> None:
    fake.intercept = lambda argv: "Invalid user id" if argv[1] == "update" else None
    with pytest.raises(OperationError, match="Invalid user id"):
        slurm.drain(ctl, "gpu01", "x")


# -- runners -----------------------------------------------------------------------------------


def test_ssh_client_builds_a_batch_command_from_hostvars() -> None:
    client = SlurmClient.over_ssh(
        "ctl01",
        {
            "ansible_host": "10.231.0.10",
            "ansible_user": "root",
            "ansible_port": 2222,
            "ansible_ssh_private_key_file": "/lab/id_ed25519",
            "ansible_ssh_common_args": "-o UserKnownHostsFile=/lab/known_hosts",
        },
    )
    runner = client.runner
    assert isinstance(runner, SshRunner)
    cmd = runner.argv("ctl01", "scontrol update NodeName=gpu01 'Reason=two words'", 60)
    assert cmd[0] == "ssh"
    assert "BatchMode=yes" in cmd
    assert cmd[cmd.index("-p") + 1] == "2222"
    assert cmd[cmd.index("-i") + 1] == "/lab/id_ed25519"
    assert "UserKnownHostsFile=/lab/known_hosts" in cmd
    assert cmd[-3:-1] == ["root@10.231.0.10", "--"]
    # the remote side runs under coreutils timeout, so a hung scontrol dies there too
    assert cmd[-1].startswith("timeout -k 5 60 sh -c ")


def test_client_quotes_arguments_into_one_shell_line(ctl: SlurmClient, fake: FakeSlurm) -> None:
    slurm.drain(ctl, "gpu01", "two words; rm -rf /")
    assert fake.nodes["gpu01"] == ("IDLE+DRAIN", "two words; rm -rf /")


def test_local_client_times_out() -> None:
    client = SlurmClient(LocalRunner())
    with pytest.raises(OperationError, match="timed out"):
        client.run(["sleep", "5"], timeout=0.2)


def test_local_client_reports_missing_binary() -> None:
    with pytest.raises(OperationError, match="not found"):
        SlurmClient.local().run(["gpuforge-no-such-binary"])


def test_unreachable_controller_is_an_operation_error() -> None:
    class Unreachable:
        def run(self, host: str, command: str, *, timeout: float) -> CommandResult:
            return CommandResult(host, command, 255, "", "ssh: connect to host ctl01: refused")

    with pytest.raises(OperationError, match="refused"):
        slurm.node_states(SlurmClient(Unreachable(), "ctl01"))


# -- CLI ---------------------------------------------------------------------------------------


@pytest.fixture
def cli(ctl: SlurmClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> CliRunner:
    monkeypatch.setattr("gpuforge.cli.slurm._client", lambda *_args: ctl)
    monkeypatch.setenv("GPUFORGE_STATE_DIR", str(tmp_path / "state"))  # the admission record
    return CliRunner()


def test_cli_state_json(cli: CliRunner) -> None:
    result = cli.invoke(main, ["slurm", "state", "gpu[03-04]", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [(d["name"], d["state_text"], d["drained"]) for d in data] == [
        ("gpu03", "IDLE+DRAIN", True),
        ("gpu04", "DOWN+NOT_RESPONDING", False),
    ]


def test_cli_state_table_shows_reason(cli: CliRunner) -> None:
    result = cli.invoke(main, ["slurm", "state"])
    assert result.exit_code == 0, result.output
    assert re.search(r"gpu03\s+IDLE\+DRAIN\s+gpu\s+gpu:h100:8\s+burn-in failed", result.output)


def test_cli_drain_then_again_is_unchanged(cli: CliRunner, fake: FakeSlurm) -> None:
    first = cli.invoke(main, ["slurm", "drain", "gpu01", "--reason", "rma", "--cluster", "lab"])
    second = cli.invoke(main, ["slurm", "drain", "gpu01", "--reason", "rma", "--cluster", "lab"])
    assert (first.exit_code, second.exit_code) == (0, 0)
    assert "drain changed" in first.output
    assert "drain unchanged" in second.output
    assert len(fake.updates()) == 1


def test_cli_drain_requires_reason(cli: CliRunner) -> None:
    result = cli.invoke(main, ["slurm", "drain", "gpu01", "--cluster", "lab"])
    assert result.exit_code == 2


def test_cli_unknown_node_exits_2(cli: CliRunner) -> None:
    result = cli.invoke(main, ["slurm", "resume", "gpu99", "--cluster", "lab"])
    assert result.exit_code == 2
    assert "gpu99" in result.output


def test_cli_resume_json(cli: CliRunner) -> None:
    result = cli.invoke(
        main, ["slurm", "resume", "gpu03", "--reason", "fixed", "--json", "--cluster", "lab"]
    )
    assert result.exit_code == 0, result.output
    (change,) = json.loads(result.output)
    assert change == {
        "node": "gpu03",
        "action": "resume",
        "changed": True,
        "reason": "fixed",
        "detail": "",
        "before": "IDLE+DRAIN",
        "after": "IDLE",
        "shadow": False,
    }


def test_cli_drain_and_resume_are_recorded_as_the_operator(
    cli: CliRunner, fake: FakeSlurm, tmp_path: Path
) -> None:
    drained = cli.invoke(main, ["slurm", "drain", "gpu01", "--reason", "rma", "--cluster", "lab"])
    resumed = cli.invoke(main, ["slurm", "resume", "gpu03", "--cluster", "lab", "--settle", "0"])
    assert (drained.exit_code, resumed.exit_code) == (0, 0), drained.output + resumed.output
    rows = AdmissionRecord(tmp_path / "state" / "lab" / "admission.db").actions()
    assert [(r.source, r.action.node, r.action.action, r.action.reason) for r in rows] == [
        ("operator", "gpu01", "drain", "rma"),
        ("operator", "gpu03", "resume", "returned to service by gpuforge"),
    ]


def test_cli_drain_without_a_cluster_exits_2_and_changes_nothing(
    cli: CliRunner, fake: FakeSlurm
) -> None:
    result = cli.invoke(main, ["slurm", "drain", "gpu01", "--reason", "rma"])
    assert result.exit_code == 2
    assert "give --cluster NAME or --inventory DIR" in result.output
    assert fake.updates() == []


# -- roles: declared inputs match the defaults ---------------------------------------------------

ROLES_DIR = Path(__file__).resolve().parents[3] / "roles"


@pytest.mark.parametrize("role", ["munge", "slurm"])
def test_role_defaults_are_declared_in_argument_specs(role: str) -> None:
    defaults = yaml.safe_load((ROLES_DIR / role / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLES_DIR / role / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    assert set(defaults) == set(options)


def test_reserve_creates_a_maint_reservation(ctl: SlurmClient, fake: FakeSlurm) -> None:
    slurm.reserve(ctl, "gpuforge_phase01", ["gpu03", "gpu04"])
    create = next(c for c in fake.calls if c[1] == "create")
    assert create == [
        "scontrol",
        "create",
        "ReservationName=gpuforge_phase01",
        "Nodes=gpu[03-04]",
        "StartTime=now",
        "Duration=infinite",
        "Users=root",
        "Flags=maint,ignore_jobs",
    ]
    # reserving resumes nothing: that is admission's decision, recorded there
    assert fake.nodes["gpu03"] == ("IDLE+DRAIN", "burn-in failed")
    assert fake.updates() == []


def test_reserve_again_moves_the_existing_reservation(ctl: SlurmClient, fake: FakeSlurm) -> None:
    slurm.reserve(ctl, "gpuforge_phase01", "gpu03")
    slurm.reserve(ctl, "gpuforge_phase01", "gpu[03-04]")
    changes = [c[1] for c in fake.calls if c[2:3] == ["ReservationName=gpuforge_phase01"]]
    assert changes == ["create", "update"]
    assert fake.reservations == {"gpuforge_phase01": "gpu[03-04]"}


def test_release_deletes_only_an_existing_reservation(ctl: SlurmClient, fake: FakeSlurm) -> None:
    assert slurm.release(ctl, "gpuforge_phase01") is False
    slurm.reserve(ctl, "gpuforge_phase01", "gpu01")
    assert slurm.release(ctl, "gpuforge_phase01") is True
    assert fake.reservations == {}


def test_reservation_is_read_back(ctl: SlurmClient) -> None:
    assert slurm.reservation(ctl, "gf") is None
    slurm.reserve(ctl, "gf", "gpu[01-02]")
    found = slurm.reservation(ctl, "gf")
    assert found is not None
    assert (found.nodes, found.users) == ("gpu[01-02]", "root")
    assert "MAINT" in found.flags


def test_node_in_a_maint_reservation_keeps_its_drain_reading(
    ctl: SlurmClient, fake: FakeSlurm
) -> None:
    slurm.reserve(ctl, "gf", "gpu03")
    (node,) = slurm.node_states(ctl, "gpu03")
    assert node.flags == ("DRAIN", "MAINT")
    assert node.drained
    assert node.reason == "burn-in failed"


# -- a resume prints the state Slurm settles in --------------------------------------------------


def _answers_after(fake: FakeSlurm, node: str, polls: int) -> None:
    """After a resume, ``node`` reads IDLE+NOT_RESPONDING for ``polls`` reads, then IDLE."""
    seen = {"reads": 0, "resumed": False}

    def intercept(argv: list[str]) -> None:
        if argv[:2] == ["scontrol", "update"] and "State=RESUME" in argv:
            seen["resumed"] = True
        elif seen["resumed"] and argv[:4] == ["scontrol", "--oneliner", "show", "node"]:
            seen["reads"] += 1
            # the fake answers after this hook: set what this read returns
            done = seen["reads"] > polls
            fake.nodes[node] = ("IDLE", "") if done else ("IDLE+NOT_RESPONDING", "")

    fake.intercept = intercept  # type: ignore[assignment]


def test_settle_waits_out_not_responding(ctl: SlurmClient, fake: FakeSlurm) -> None:
    _answers_after(fake, "gpu04", polls=3)
    slurm.resume(ctl, "gpu04", "back")
    naps: list[float] = []
    states, settled = slurm.settle(ctl, ["gpu04"], within=60, poll=2, sleep=naps.append)
    assert settled
    assert states["gpu04"].state_text == "IDLE"
    assert naps == [2, 2]


def test_settle_gives_up_after_its_time(ctl: SlurmClient, fake: FakeSlurm) -> None:
    _answers_after(fake, "gpu04", polls=100)
    slurm.resume(ctl, "gpu04", "back")
    now = [0.0]

    def nap(s: float) -> None:
        now[0] += s

    states, settled = slurm.settle(
        ctl, ["gpu04"], within=10, poll=2, sleep=nap, clock=lambda: now[0]
    )
    assert not settled
    assert states["gpu04"].state_text == "IDLE+NOT_RESPONDING"
    assert now[0] <= 10


def test_cli_resume_prints_the_settled_state(
    cli: CliRunner, fake: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    _answers_after(fake, "gpu04", polls=2)
    monkeypatch.setattr("gpuforge.slurm.control.time.sleep", lambda _s: None)
    result = cli.invoke(main, ["slurm", "resume", "gpu04", "--reason", "fixed", "--cluster", "lab"])
    assert result.exit_code == 0, result.output
    # before: "(DOWN+NOT_RESPONDING -> IDLE+NOT_RESPONDING)", the state right after the resume
    assert "(DOWN+NOT_RESPONDING -> IDLE)" in result.output
