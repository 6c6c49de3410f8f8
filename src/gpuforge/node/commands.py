"""Every external command the node checker runs, under a timeout taken from the tier's budget.

A tier has a time budget (``tiers.<tier>.timeout_s``). :class:`Budget` counts it down and keeps a
reserve for writing the results; :meth:`Runner.run` gives each command what is left (capped),
so the whole run ends inside the budget even when a tool hangs. A tool that is missing, hangs
or exits with an error raises :class:`ToolError`: the check that needed it is ERROR, never FAIL.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

#: Seconds kept back from the budget for judging and writing the results.
RESERVE_FRACTION = 0.15
RESERVE_MAX_S = 1.0


class ToolError(Exception):
    """A command could not give an answer: missing, timed out, failed or out of budget."""

    def __init__(self, argv: Sequence[str], why: str, output: str = "") -> None:
        self.argv = tuple(argv)
        self.why = why
        self.output = output
        super().__init__(f"{' '.join(argv)}: {why}")


@dataclass(frozen=True, slots=True)
class Output:
    """What a command printed, with its exit status and how long it took."""

    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str
    duration_s: float

    def evidence(self) -> str:
        """The command line and its output, as a check's evidence."""
        text = self.stdout if self.stdout.strip() else self.stderr
        return f"$ {' '.join(self.argv)}  (rc={self.rc})\n{text}"


class Budget:
    """The time left to a tier's run."""

    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.total_s = total_s
        self.clock = clock
        self.start = clock()
        self.reserve_s = min(total_s * RESERVE_FRACTION, RESERVE_MAX_S)

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return self.clock() - self.start

    def remaining(self) -> float:
        """Seconds a command may still take (the reserve excluded); may be negative."""
        return self.total_s - self.reserve_s - self.elapsed()


class Runner:
    """Runs commands on this node without a shell, each under the budget's remaining time."""

    def __init__(
        self,
        budget: Budget,
        *,
        env: Mapping[str, str] | None = None,
        cap_s: float | None = None,
    ) -> None:
        self.budget = budget
        self.env = dict(env) if env is not None else None
        self.cap_s = cap_s
        #: Every command run, in order (what the prolog test checks: no Slurm command).
        self.history: list[tuple[str, ...]] = []

    def run(
        self, argv: Sequence[str], *, ok: Sequence[int] = (0,), cap_s: float | None = None
    ) -> Output:
        """Run ``argv``; its exit status must be in ``ok``. Raises :class:`ToolError` otherwise."""
        argv = tuple(argv)
        self.history.append(argv)
        timeout = self.budget.remaining()
        for cap in (self.cap_s, cap_s):
            if cap is not None:
                timeout = min(timeout, cap)
        if timeout <= 0.05:
            raise ToolError(
                argv, f"not run: the tier's time budget ({self.budget.total_s:g} s) is spent"
            )
        path = self.env.get("PATH") if self.env is not None else os.environ.get("PATH")
        if shutil.which(argv[0], path=path) is None:
            raise ToolError(argv, "not installed (not found in PATH)")
        start = time.monotonic()
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
                env=self.env,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
            raise ToolError(argv, f"timed out after {timeout:.1f} s", out) from None
        except OSError as exc:
            raise ToolError(argv, f"cannot run: {exc.strerror or exc}") from None
        result = Output(argv, done.returncode, done.stdout, done.stderr, time.monotonic() - start)
        if done.returncode not in ok:
            raise ToolError(argv, f"exit status {done.returncode}", result.evidence())
        return result
