"""Progress of a deploy, from its stages and ansible-runner's events.

On a terminal, a live display: a bar per stage and one status line per host. Anywhere else (CI,
cron, a log file) a live display shows nothing for minutes and then a final frame, so
:class:`PlainProgress` prints one line when a stage starts and one when a host fails.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

_STATUS_STYLE = {"ok": "green", "changed": "yellow", "failed": "bold red", "unreachable": "red"}


class DeployProgress:
    """Feed it ``stage()`` calls and ansible-runner events; it redraws the screen."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description:<10}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} hosts"),
            TextColumn("{task.fields[task]}", style="dim"),
            TimeElapsedColumn(),
            console=console,
        )
        self.hosts: dict[str, tuple[str, str]] = {}  # host -> (status, last task)
        self._stage_task: Any = None
        self._done: set[str] = set()
        self._live = Live(self._render(), console=console, refresh_per_second=4, transient=False)

    def __enter__(self) -> DeployProgress:
        self._live.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._finish_stage()
        self._live.update(self._render())
        self._live.__exit__(exc_type, exc, tb)

    def _render(self) -> Group:
        table = Table.grid(padding=(0, 2))
        for host, (status, task) in sorted(self.hosts.items()):
            style = _STATUS_STYLE.get(status, "")
            table.add_row(host, f"[{style}]{status}[/]" if style else status, task)
        return Group(self.progress, table)

    def _finish_stage(self) -> None:
        if self._stage_task is not None:
            task = self.progress.tasks[-1]
            self.progress.update(self._stage_task, completed=task.total, task="")

    def stage(self, name: str, hosts: list[str]) -> None:
        self._finish_stage()
        self._done = set()
        self._stage_task = self.progress.add_task(name, total=max(len(hosts), 1), task="")
        for host in hosts:
            self.hosts[host] = ("waiting", name)
        self._live.update(self._render())

    def event(self, event: dict[str, Any]) -> None:
        data = event.get("event_data") or {}
        kind = str(event.get("event", ""))
        host = data.get("host")
        if kind == "playbook_on_task_start" and self._stage_task is not None:
            self.progress.update(self._stage_task, task=str(data.get("task", ""))[:60])
        if not host:
            return
        status = {
            "runner_on_ok": "changed" if (data.get("res") or {}).get("changed") else "ok",
            "runner_on_failed": "failed",
            "runner_on_unreachable": "unreachable",
            "runner_on_start": "running",
        }.get(kind)
        if status is None:
            return
        previous = self.hosts.get(host, ("", ""))[0]
        if previous in ("failed", "unreachable") and status != "running":
            status = previous
        self.hosts[host] = (status, str(data.get("task", ""))[:70])
        if status in ("failed", "unreachable") and host not in self._done:
            self._done.add(host)
            self.progress.advance(self._stage_task)
        self._live.update(self._render())


def _failure(data: dict[str, Any]) -> str:
    """The failed task and its message, on one line."""
    res = data.get("res") or {}
    msg = res.get("msg") or res.get("stderr") or res.get("module_stderr") or ""
    text = " ".join(str(msg).split())
    task = str(data.get("task", ""))
    return f"{task}: {text[:200]}" if task else text[:200]


class PlainProgress:
    """One plain line per stage and per failed host, for output that is not a terminal."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._stage = ""
        self._started = 0.0
        self._failed: set[str] = set()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def _line(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        self.console.print(f"{stamp} {text}", markup=False, highlight=False, soft_wrap=True)

    def stage(self, name: str, hosts: list[str]) -> None:
        now = time.monotonic()
        took = f" ({self._stage} took {now - self._started:.1f} s)" if self._stage else ""
        self._stage, self._started, self._failed = name, now, set()
        self._line(f"{name}: {len(hosts)} hosts{took}")

    def event(self, event: dict[str, Any]) -> None:
        data = event.get("event_data") or {}
        kind = str(event.get("event", ""))
        host = data.get("host")
        if not host or host in self._failed:
            return
        if kind == "runner_on_failed" and not data.get("ignore_errors"):
            state = "failed"
        elif kind == "runner_on_unreachable":
            state = "unreachable"
        else:
            return
        self._failed.add(host)
        self._line(f"{self._stage}: {host} {state}: {_failure(data)}")


def deploy_progress(console: Console) -> DeployProgress | PlainProgress:
    """The live display on a terminal, plain lines anywhere else."""
    return DeployProgress(console) if console.is_terminal else PlainProgress(console)
