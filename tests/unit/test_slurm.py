"""Slurm node state operations: parsers on real 22.05 output, idempotent drain/resume, the CLI."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpuforge import slurm
from gpuforge.cli import main
from gpuforge.errors import InputError, OperationError
from gpuforge.slurm import CommandResult

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


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


@dataclass
class FakeScontrol:
    """Answers scontrol like a 22.05 controller holding ``nodes`` (name -> (state, reason))."""

    nodes: dict[str, tuple[str, str]]
    calls: list[list[str]] = field(default_factory=list)
    reservations: dict[str, str] = field(default_factory=dict)  # name -> nodes

    def line(self, name: str) -> str:
        state, reason = self.nodes[name]
        text = f"NodeName={name} CPUTot=224 Gres=gpu:h100:8 State={state} Partitions=gpu"
        return text + (f" Reason={reason} [root@2026-11-30T05:00:00]" if reason else "")

    def run(self, argv: Sequence[str], *, timeout: float = 60.0) -> CommandResult:
        assert timeout > 0
        self.calls.append(list(argv))
        if len(argv) > 2 and argv[2].startswith("ReservationName="):
            return self.reservation(argv)
        if argv[:3] == ["scontrol", "--oneliner", "show"]:
            names = slurm.expand_nodes(argv[4]) if len(argv) > 4 else list(self.nodes)
            unknown = [n for n in names if n not in self.nodes]
            if unknown:
                return CommandResult(1, "", f"Node {unknown[0]} not found\n")
            return CommandResult(0, "\n".join(self.line(n) for n in names) + "\n", "")
        if argv[:2] == ["scontrol", "update"]:
            fields = dict(a.split("=", 1) for a in argv[2:])
            for name in slurm.expand_nodes(fields["NodeName"]):
                base = self.nodes[name][0].split("+")[0]
                if fields["State"] == "DRAIN":
                    self.nodes[name] = (f"{base}+DRAIN", fields["Reason"])
                else:
                    self.nodes[name] = ("IDLE" if base == "DOWN" else base, "")
            return CommandResult(0, "", "")
        return CommandResult(1, "", f"unexpected {argv}")

    def reservation(self, argv: Sequence[str]) -> CommandResult:
        name = argv[2].split("=", 1)[1]
        if argv[1] == "show":
            if name in self.reservations:
                return CommandResult(
                    0, f"ReservationName={name} Nodes={self.reservations[name]}", ""
                )
            return CommandResult(1, "", f"Reservation {name} not found\n")
        if argv[1] == "delete":
            del self.reservations[name]
        else:
            self.reservations[name] = dict(a.split("=", 1) for a in argv[2:])["Nodes"]
        return CommandResult(0, "", "")

    def updates(self) -> list[list[str]]:
        return [c for c in self.calls if c[:2] == ["scontrol", "update"]]


@pytest.fixture
def ctl() -> FakeScontrol:
    return FakeScontrol(
        {
            "gpu01": ("IDLE", ""),
            "gpu02": ("IDLE", ""),
            "gpu03": ("IDLE+DRAIN", "burn-in failed"),
            "gpu04": ("DOWN+NOT_RESPONDING", "Not responding"),
        }
    )


def test_drain_issues_one_update_for_a_hostlist(ctl: FakeScontrol) -> None:
    changes = slurm.drain(ctl, "gpu[01-02]", "burn-in failed")
    assert [c.changed for c in changes] == [True, True]
    assert ctl.updates() == [
        ["scontrol", "update", "NodeName=gpu[01-02]", "State=DRAIN", "Reason=burn-in failed"]
    ]
    assert changes[0].after == "IDLE+DRAIN"


def test_drain_same_reason_changes_nothing(ctl: FakeScontrol) -> None:
    changes = slurm.drain(ctl, "gpu03", "burn-in failed")
    assert [c.changed for c in changes] == [False]
    assert ctl.updates() == []


def test_drain_twice_is_idempotent(ctl: FakeScontrol) -> None:
    slurm.drain(ctl, "gpu01", "maintenance")
    again = slurm.drain(ctl, "gpu01", "maintenance")
    assert [c.changed for c in again] == [False]
    assert len(ctl.updates()) == 1


def test_drain_with_new_reason_updates_it(ctl: FakeScontrol) -> None:
    (change,) = slurm.drain(ctl, "gpu03", "XID 79")
    assert change.changed
    assert ctl.nodes["gpu03"] == ("IDLE+DRAIN", "XID 79")


def test_drain_needs_a_reason(ctl: FakeScontrol) -> None:
    with pytest.raises(InputError, match="reason"):
        slurm.drain(ctl, "gpu01", "   ")
    assert ctl.calls == []


def test_resume_only_touches_drained_or_down(ctl: FakeScontrol) -> None:
    changes = slurm.resume(ctl, "gpu[01,03-04]", "passed burn-in")
    assert {c.node: c.changed for c in changes} == {"gpu01": False, "gpu03": True, "gpu04": True}
    assert ctl.updates() == [["scontrol", "update", "NodeName=gpu[03-04]", "State=RESUME"]]
    assert all(c.reason == "passed burn-in" for c in changes)


def test_resume_in_service_node_changes_nothing(ctl: FakeScontrol) -> None:
    (change,) = slurm.resume(ctl, "gpu02", "why not")
    assert not change.changed
    assert ctl.updates() == []


def test_unknown_node_is_bad_input(ctl: FakeScontrol) -> None:
    with pytest.raises(InputError, match="gpu99"):
        slurm.node_states(ctl, "gpu99")


def test_failed_update_is_an_operation_error(ctl: FakeScontrol) -> None:
    def refuse(argv: Sequence[str], *, timeout: float = 60.0) -> CommandResult:
        if argv[1] == "update":
            return CommandResult(1, "", "Invalid user id")
        return FakeScontrol.run(ctl, argv, timeout=timeout)

    ctl.run = refuse  # type: ignore[method-assign]
    with pytest.raises(OperationError, match="Invalid user id"):
        slurm.drain(ctl, "gpu01", "x")


# -- runners -----------------------------------------------------------------------------------


def test_ssh_runner_builds_a_batch_command_from_hostvars() -> None:
    runner = slurm.ssh_runner_from_hostvars(
        "ctl01",
        {
            "ansible_host": "10.231.0.10",
            "ansible_user": "root",
            "ansible_port": 2222,
            "ansible_ssh_private_key_file": "/lab/id_ed25519",
            "ansible_ssh_common_args": "-o UserKnownHostsFile=/lab/known_hosts",
        },
    )
    cmd = runner.command(["scontrol", "update", "NodeName=gpu01", "Reason=two words"])
    assert cmd[0] == "ssh"
    assert "BatchMode=yes" in cmd
    assert cmd[cmd.index("-p") + 1] == "2222"
    assert cmd[cmd.index("-i") + 1] == "/lab/id_ed25519"
    assert "UserKnownHostsFile=/lab/known_hosts" in cmd
    assert cmd[-3:] == [
        "root@10.231.0.10",
        "--",
        "scontrol update NodeName=gpu01 'Reason=two words'",
    ]


def test_local_runner_times_out() -> None:
    with pytest.raises(OperationError, match="timed out"):
        slurm.LocalRunner().run(["sleep", "5"], timeout=0.2)


def test_local_runner_reports_missing_binary() -> None:
    with pytest.raises(OperationError, match="not found"):
        slurm.LocalRunner().run(["gpuforge-no-such-binary"])


# -- CLI ---------------------------------------------------------------------------------------


@pytest.fixture
def cli(ctl: FakeScontrol, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setattr("gpuforge.cli.slurm._runner", lambda *_args: ctl)
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


def test_cli_drain_then_again_is_unchanged(cli: CliRunner, ctl: FakeScontrol) -> None:
    first = cli.invoke(main, ["slurm", "drain", "gpu01", "--reason", "rma"])
    second = cli.invoke(main, ["slurm", "drain", "gpu01", "--reason", "rma"])
    assert (first.exit_code, second.exit_code) == (0, 0)
    assert "drain changed" in first.output
    assert "drain unchanged" in second.output
    assert len(ctl.updates()) == 1


def test_cli_drain_requires_reason(cli: CliRunner) -> None:
    result = cli.invoke(main, ["slurm", "drain", "gpu01"])
    assert result.exit_code == 2


def test_cli_unknown_node_exits_2(cli: CliRunner) -> None:
    result = cli.invoke(main, ["slurm", "resume", "gpu99"])
    assert result.exit_code == 2
    assert "gpu99" in result.output


def test_cli_resume_json(cli: CliRunner) -> None:
    result = cli.invoke(main, ["slurm", "resume", "gpu03", "--reason", "fixed", "--json"])
    assert result.exit_code == 0, result.output
    (change,) = json.loads(result.output)
    assert change == {
        "node": "gpu03",
        "action": "resume",
        "changed": True,
        "before": "IDLE+DRAIN",
        "after": "IDLE",
        "reason": "fixed",
    }


# -- roles: declared inputs match the defaults ---------------------------------------------------

ROLES_DIR = Path(__file__).resolve().parents[2] / "roles"


@pytest.mark.parametrize("role", ["munge", "slurm"])
def test_role_defaults_are_declared_in_argument_specs(role: str) -> None:
    defaults = yaml.safe_load((ROLES_DIR / role / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLES_DIR / role / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    assert set(defaults) == set(options)


def test_reserve_creates_a_maint_reservation_and_resumes_drained_nodes(ctl: FakeScontrol) -> None:
    changes = slurm.reserve(ctl, "gpuforge_phase01", ["gpu03", "gpu04"])
    create = next(c for c in ctl.calls if c[1] == "create")
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
    assert [c.changed for c in changes] == [True, True]
    assert ctl.nodes["gpu03"][0] == "IDLE"


def test_reserve_again_moves_the_existing_reservation(ctl: FakeScontrol) -> None:
    slurm.reserve(ctl, "gpuforge_phase01", "gpu03")
    slurm.reserve(ctl, "gpuforge_phase01", "gpu[03-04]")
    changes = [
        c[1] for c in ctl.calls if c[1] != "show" and c[2:3] == ["ReservationName=gpuforge_phase01"]
    ]
    assert changes == ["create", "update"]
    assert ctl.reservations == {"gpuforge_phase01": "gpu[03-04]"}


def test_release_deletes_only_an_existing_reservation(ctl: FakeScontrol) -> None:
    assert slurm.release(ctl, "gpuforge_phase01") is False
    slurm.reserve(ctl, "gpuforge_phase01", "gpu01")
    assert slurm.release(ctl, "gpuforge_phase01") is True
    assert ctl.reservations == {}


def test_maintenance_window_puts_drained_nodes_back_even_after_a_crash(ctl: FakeScontrol) -> None:
    with pytest.raises(RuntimeError), slurm.maintenance_window(ctl, "gf_check", "gpu[01-03]"):
        assert ctl.reservations == {"gf_check": "gpu[01-03]"}
        assert ctl.nodes["gpu03"] == ("IDLE", "")  # schedulable inside the reservation
        raise RuntimeError("validation died")
    assert ctl.nodes["gpu03"] == ("IDLE+DRAIN", "burn-in failed")  # its own reason, not ours
    assert ctl.nodes["gpu01"] == ("IDLE", "")
    assert ctl.reservations == {}
