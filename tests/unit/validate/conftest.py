"""Fake command runners fed with real tool output from tests/fixtures/real."""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Callable, Mapping

import pytest
from tests.unit.conftest import real_fixture

from gpuforge.command import CommandResult

#: Kept under the name the validate tests import.
real = real_fixture

Reply = CommandResult | Callable[[str, str], CommandResult]


class FakeRunner:
    """Answers by the first (host or '*', command substring) rule that matches."""

    def __init__(self) -> None:
        self.rules: list[tuple[str, str, Reply]] = []
        self.calls: list[tuple[str, str, float]] = []

    def on(self, host: str, needle: str, stdout: str = "", rc: int = 0, **kw: object) -> None:
        self.rules.append(
            (host, needle, CommandResult(host, needle, rc, stdout, **kw))  # type: ignore[arg-type]
        )

    def on_call(self, host: str, needle: str, fn: Callable[[str, str], CommandResult]) -> None:
        self.rules.append((host, needle, fn))

    def run(self, host: str, command: str, *, timeout: float) -> CommandResult:
        self.calls.append((host, command, timeout))
        for h, needle, reply in self.rules:
            if h in (host, "*") and needle in command:
                if callable(reply):
                    return reply(host, command)
                return CommandResult(
                    host,
                    command,
                    reply.rc,
                    reply.stdout,
                    reply.stderr,
                    reply.duration_s,
                    reply.timed_out,
                )
        return CommandResult(host, command, 127, "", f"fake: no rule for {command}")


@pytest.fixture
def fake() -> FakeRunner:
    return FakeRunner()


def counter_reply(
    growth: Mapping[tuple[str, str, str], int] | None = None,
) -> Callable[[str, str], CommandResult]:
    """Answers ``burnin.counter_command``: every counter at 0 on the first read of a host, then
    up by ``growth[(host, device, counter)]`` on each later read."""
    reads: Counter[str] = Counter()

    def reply(host: str, command: str) -> CommandResult:
        reads[host] += 1
        lines = []
        for path in shlex.split(command)[3:]:  # grep -H . PATH...
            parts = path.split("/")  # /sys/class/infiniband/<dev>/ports/<port>/counters/<name>
            step = (growth or {}).get((host, parts[4], parts[-1]), 0)
            lines.append(f"{path}:{step * (reads[host] - 1)}")
        return CommandResult(host, command, 0, "\n".join(lines) + "\n")

    return reply
