"""A fake Slurm controller for unit tests: answers scontrol command lines like 22.05 does.

It implements :class:`gpuforge.command.CommandRunner`, so tests wrap it in a
:class:`~gpuforge.slurm.control.SlurmClient` exactly as production wraps an SSH runner.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

import hostlist

from gpuforge.command import CommandResult


class Killed(BaseException):
    """Raised by the fake when a test simulates the run being killed at a given command."""


@dataclass
class FakeSlurm:
    """Holds ``nodes`` (name -> (state, reason)) and reservations; records every command."""

    nodes: dict[str, tuple[str, str]]
    reservations: dict[str, str] = field(default_factory=dict)  # name -> hostlist
    calls: list[list[str]] = field(default_factory=list)
    #: Called with each argv before it runs; return an error text to make it fail (rc 1),
    #: or raise :class:`Killed` to simulate a kill at that point.
    intercept: Callable[[list[str]], str | None] | None = None
    reason_user: str = "root"

    def line(self, name: str) -> str:
        state, reason = self.nodes[name]
        if any(name in hostlist.expand_hostlist(h) for h in self.reservations.values()):
            state += "+MAINT"
        text = (
            f"NodeName={name} Arch=x86_64 CoresPerSocket=56 CPUAlloc=0 CPUTot=224 "
            f"Gres=gpu:h100:8 OS=Linux 6.1.0-18-amd64 #1 SMP Debian RealMemory=2063937 "
            f"State={state} Partitions=gpu"
        )
        if reason:
            text += f" Reason={reason} [{self.reason_user}@2026-11-30T05:00:00]"
        return text

    def run(self, host: str, command: str, *, timeout: float) -> CommandResult:
        """The :class:`~gpuforge.command.CommandRunner` entry point."""
        assert timeout > 0
        argv = shlex.split(command)
        self.calls.append(argv)
        if self.intercept is not None:
            error = self.intercept(argv)
            if error:
                return CommandResult(host, command, 1, "", error)
        rc, out, err = self._answer(argv)
        return CommandResult(host, command, rc, out, err)

    def _answer(self, argv: list[str]) -> tuple[int, str, str]:  # noqa: PLR0911 - one per command
        if argv[:4] == ["scontrol", "--oneliner", "show", "node"]:
            names = hostlist.expand_hostlist(argv[4]) if len(argv) > 4 else list(self.nodes)
            unknown = [n for n in names if n not in self.nodes]
            if unknown:
                return 1, "", f"Node {unknown[0]} not found\n"
            return 0, "\n".join(self.line(n) for n in names) + "\n", ""
        if argv[:4] == ["scontrol", "--oneliner", "show", "reservation"]:
            name = argv[4]
            if name not in self.reservations:
                return 1, "", f"Reservation {name} not found\n"
            return (
                0,
                f"ReservationName={name} StartTime=2026-11-30T05:00:00 "
                f"EndTime=2027-11-30T05:00:00 Duration=365-00:00:00 "
                f"Nodes={self.reservations[name]} NodeCnt=1 CoreCnt=224 Features=(null) "
                f"PartitionName=(null) Flags=MAINT,IGNORE_JOBS,SPEC_NODES TRES=cpu=224 "
                f"Users=root Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE "
                f"BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n",
                "",
            )
        fields = dict(a.split("=", 1) for a in argv[2:] if "=" in a)
        if argv[:2] == ["scontrol", "update"] and "NodeName" in fields:
            for name in hostlist.expand_hostlist(fields["NodeName"]):
                base = self.nodes[name][0].split("+")[0]
                if fields["State"] == "DRAIN":
                    self.nodes[name] = (f"{base}+DRAIN", fields["Reason"])
                else:
                    self.nodes[name] = ("IDLE" if base == "DOWN" else base, "")
            return 0, "", ""
        if argv[1:2] in (["create"], ["update"]) and "ReservationName" in fields:
            name = fields["ReservationName"]
            if argv[1] == "create" and name in self.reservations:
                return 1, "", "Error creating the reservation: Duplicate reservation name\n"
            self.reservations[name] = fields["Nodes"]
            return 0, f"Reservation created: {name}\n" if argv[1] == "create" else "", ""
        if argv[1:2] == ["delete"] and "ReservationName" in fields:
            name = fields["ReservationName"]
            if name not in self.reservations:
                return 1, "", "Error deleting the reservation: Requested reservation is invalid\n"
            del self.reservations[name]
            return 0, "", ""
        return 1, "", f"unexpected {argv}"

    def updates(self) -> list[list[str]]:
        """The ``scontrol update NodeName=...`` commands issued so far."""
        return [c for c in self.calls if c[:2] == ["scontrol", "update"] and "NodeName" in c[2]]
