"""Running commands on hosts with a hard timeout, and the evidence they leave.

Every command gpuforge runs on a node or a controller goes through a :class:`CommandRunner`:
:class:`SshRunner` over OpenSSH, :class:`LocalRunner` on this machine. The validators and
:class:`gpuforge.slurm.control.SlurmClient` share these. A hang is not an exception: it comes back
as a :class:`CommandResult` with ``timed_out`` set, which the checks turn into a result with
evidence (and Slurm control into an error, since it cannot go on without an answer).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpuforge.ssh import SshTarget

#: rc that coreutils ``timeout`` returns when it had to kill the command.
TIMEOUT_RC = 124
#: rc ssh returns when it could not connect or authenticate.
SSH_FAILED_RC = 255
#: Extra seconds the local side waits beyond the remote ``timeout`` before killing ssh itself.
_GRACE_S = 15.0


@dataclass(frozen=True)
class CommandResult:
    """What one command did: exit status, output and whether it had to be killed."""

    host: str
    command: str
    rc: int | None
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """Exited 0 within its timeout."""
        return self.rc == 0 and not self.timed_out

    @property
    def unreachable(self) -> bool:
        """ssh could not reach or log in to the host (nothing ran there)."""
        return self.rc == SSH_FAILED_RC

    def evidence(self) -> str:
        """The command, its exit status and its output, for a result's evidence."""
        state = "timed out" if self.timed_out else f"rc={self.rc}"
        parts = [f"$ {self.command}  # {self.host}, {state}, {self.duration_s:.1f}s"]
        if self.stdout.strip():
            parts.append(self.stdout.rstrip())
        if self.stderr.strip():
            parts.append("[stderr]\n" + self.stderr.rstrip())
        return "\n".join(parts)


class CommandRunner(Protocol):
    """Runs a shell command line on a host and always returns within ``timeout`` (+ grace)."""

    def run(self, host: str, command: str, *, timeout: float) -> CommandResult:
        """Run ``command`` (a POSIX shell line) on ``host``."""
        ...


def remote_line(command: str, timeout: float) -> str:
    """``command`` wrapped in coreutils ``timeout`` so that the remote side dies on its own too."""
    secs = max(int(timeout), 1)
    return f"timeout -k 5 {secs} sh -c {shlex.quote(command)}"


@dataclass
class SshRunner:
    """Runs commands over OpenSSH in batch mode; a dead or hung host costs at most the timeout."""

    targets: Mapping[str, SshTarget] = field(default_factory=dict)
    connect_timeout: int = 10
    ssh: str = "ssh"

    def argv(self, host: str, command: str, timeout: float) -> list[str]:
        """The ssh command line for ``command`` on ``host``."""
        target = self.targets.get(host, SshTarget(address=host))
        remote = remote_line(command, timeout)
        return target.command(remote, connect_timeout=self.connect_timeout, ssh=self.ssh)

    def run(self, host: str, command: str, *, timeout: float) -> CommandResult:
        """Run ``command`` on ``host``; never raises for the command's own failure or hang."""
        return run_argv(
            host, command, self.argv(host, command, timeout), timeout=timeout + _GRACE_S
        )


@dataclass
class LocalRunner:
    """Runs commands on this machine (the node-local health check and tests use it)."""

    def run(self, host: str, command: str, *, timeout: float) -> CommandResult:
        """Run ``command`` with ``sh -c`` here; ``host`` only labels the result."""
        return run_argv(host, command, ["sh", "-c", command], timeout=timeout)


def run_argv(
    host: str,
    command: str,
    argv: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
) -> CommandResult:
    """Run ``argv`` with a hard timeout and return what happened (never raises for the tool).

    ``env`` adds to (or overrides in) this process's environment.
    """
    start = time.monotonic()
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env} if env else None,
        )
    except subprocess.TimeoutExpired as exc:
        return CommandResult(
            host,
            command,
            None,
            _text(exc.stdout),
            _text(exc.stderr),
            time.monotonic() - start,
            timed_out=True,
        )
    except OSError as exc:
        return CommandResult(host, command, 127, "", str(exc), time.monotonic() - start)
    rc = proc.returncode
    return CommandResult(
        host,
        command,
        rc,
        _text(proc.stdout),
        _text(proc.stderr),
        time.monotonic() - start,
        timed_out=rc == TIMEOUT_RC,
    )


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data
