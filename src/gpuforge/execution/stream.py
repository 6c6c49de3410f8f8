"""One shard through ansible-runner's transmit -> worker -> process, on one execution host."""

from __future__ import annotations

import configparser
import contextlib
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner

from gpuforge.execution import artifacts
from gpuforge.execution.executors import ExecutionHost
from gpuforge.playbook import HostStats, host_stats, message
from gpuforge.resources import project_path

Event = dict[str, Any]
#: ansible-runner's statuses of a run that reached its end (anything else: the worker was lost).
FINISHED = frozenset({"successful", "failed", "timeout", "canceled"})
#: Seconds past the play's own limit before the controller gives up on a silent worker.
WATCHDOG_GRACE_S = 120


@dataclass(slots=True)
class ShardRun:
    """What one attempt of a shard on one execution host did."""

    executor: str
    status: str
    rc: int | None
    hosts: dict[str, HostStats] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)
    #: Hosts whose result is final (stats seen, or removed from the play by a failure).
    done: set[str] = field(default_factory=set)
    explanation: str = ""
    artifact_bytes: int = 0
    #: Whether changed events were slimmed to keep the attempt within its artifact budget.
    slimmed: bool = False

    @property
    def lost(self) -> bool:
        """Whether the worker went away before the play ended (its host died, ssh broke)."""
        return self.status not in FINISHED


def build_project(dest: Path, ansible_cfg: Path | None = None) -> Path:
    """The ``project/`` of a private data directory: playbooks, roles and an ansible.cfg.

    The config is the operator's (``ANSIBLE_CONFIG``) or the project's, with ``roles_path``
    pointed at the shipped roles and no ``inventory`` of its own (the shard's comes with ``-i``).
    """
    shutil.copytree(project_path("playbooks"), dest / "playbooks")
    shutil.copytree(
        project_path("roles"),
        dest / "roles",
        ignore=shutil.ignore_patterns("molecule", "__pycache__", "*.pyc"),
    )
    source = ansible_cfg or Path(os.environ.get("ANSIBLE_CONFIG", project_path("ansible.cfg")))
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(source)
    if not cfg.has_section("defaults"):
        cfg.add_section("defaults")
    cfg.set("defaults", "roles_path", "roles")
    cfg.remove_option("defaults", "inventory")
    with (dest / "ansible.cfg").open("w") as out:
        out.write(f"# Shipped by gpuforge from {source}\n")
        cfg.write(out)
    return dest


def stream_shard(  # noqa: PLR0915  # one pipeline: start, transmit, process, collect
    host: ExecutionHost,
    private: Path,
    *,
    playbook: str,
    inventory: Sequence[str],
    limit: Sequence[str],
    artifact_dir: Path,
    extravars: Mapping[str, Any] | None = None,
    envvars: Mapping[str, str] | None = None,
    tags: str | None = None,
    forks: int = 16,
    timeout_s: int = 3600,
    on_event: Callable[[Event], None] | None = None,
    artifact_budget: int | None = None,
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> ShardRun:
    """Stream the job in ``private`` (``project/`` and the inventory paths, relative to it).

    ``inventory`` paths are relative to ``private``; ``playbook`` to ``private/project``.
    Events go to ``on_event`` as they arrive; only what :mod:`.artifacts` keeps is written.
    ``artifact_budget`` bounds the bytes kept (:func:`.artifacts.enforce`).
    ``started`` is told the worker process (to stop it on Ctrl-C).
    """
    run = ShardRun(executor=host.name, status="unstarted", rc=None)
    cmdline = " ".join(f"-i ../{p}" for p in inventory) + f" --forks {forks}"
    if tags:
        cmdline += f" --tags {tags}"
    artifact_dir.mkdir(parents=True, exist_ok=True)
    stderr_path = artifact_dir / "worker.stderr"

    def handler(event: Event) -> bool:
        data = event.get("event_data") or {}
        name = data.get("host")
        kind = event.get("event")
        if name and kind == "runner_on_failed" and not data.get("ignore_errors"):
            run.failed.setdefault(name, message(data))
            run.done.add(name)
        elif name and kind == "runner_on_unreachable":
            run.unreachable.setdefault(name, message(data))
            run.done.add(name)
        elif kind == "playbook_on_stats":
            run.hosts = host_stats(data, (*run.failed, *run.unreachable))
            run.done.update(run.hosts)
        if on_event is not None:
            on_event(event)
        return artifacts.keep_event(event)

    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(  # argv built from the execution host entry
            host.worker_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr
        )
        if started is not None:
            started(proc)
        watchdog = threading.Timer(timeout_s + WATCHDOG_GRACE_S, proc.kill)
        watchdog.start()
        try:
            assert proc.stdin is not None and proc.stdout is not None  # noqa: S101  # PIPE above
            # The worker closes its stdin once it has unpacked the job (ansible-runner's base64
            # reader closes the stream it wraps), so the transmitter's last line and our close
            # may meet a broken pipe: a worker that really died shows in the processor's status.
            with contextlib.suppress(BrokenPipeError):
                ansible_runner.interface.run(
                    streamer="transmit",
                    _output=proc.stdin,
                    private_data_dir=str(private),
                    playbook=playbook,
                    cmdline=cmdline,
                    limit=",".join(limit),
                    extravars=dict(extravars or {}),
                    envvars=dict(envvars or {}),
                    timeout=timeout_s,
                    quiet=True,
                ).run()
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
            processor = ansible_runner.interface.run(
                streamer="process",
                _input=proc.stdout,
                private_data_dir=str(private),
                artifact_dir=str(artifact_dir),
                event_handler=handler,
                status_handler=lambda data, **_kw: _status(run, data),
                cancel_callback=lambda: False,
                quiet=True,
            )
            processor.run()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
    run.status = str(processor.status) if run.status == "unstarted" else run.status
    rc_file = artifact_dir / "rc"
    if rc_file.is_file():
        run.rc = int(rc_file.read_text().strip() or 0)
    if run.lost:
        tail = stderr_path.read_text(errors="replace").strip().splitlines()
        why = run.explanation or (tail[-1][:300] if tail else "no output")
        run.explanation = f"worker on {host.name} lost (exit {proc.returncode}): {why}"
    artifacts.prune(artifact_dir)
    if artifact_budget is not None:
        # A lost attempt's hosts run again: its changed events (the only record of what it
        # changed) are kept as slim as they get, so that the re-run fits in what is left.
        run.slimmed = artifacts.enforce(artifact_dir, 0 if run.lost else artifact_budget)
    run.artifact_bytes = artifacts.measure(artifact_dir)
    return run


def _status(run: ShardRun, data: Mapping[str, Any]) -> None:
    status = str(data.get("status", ""))
    if status == "error" and run.status in FINISHED:
        # The worker already said how the play ended and sent its artifacts: the processor's
        # base64 reader of that zip closes the stream it wraps, so the final {"eof"} line is
        # never read, which ansible-runner then reports as "Unexpected empty line".
        return
    if status == "error":
        run.explanation = str(data.get("job_explanation", ""))[:500]
    run.status = status
