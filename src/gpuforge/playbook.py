"""The one facade over ansible-runner: :func:`run_playbook` returns a typed :class:`RunResult`.

Speed defaults: the Mitogen strategy (``mitogen_linear``) when the pinned ``mitogen`` package is
importable, with pipelining and a persistent SSH control socket from ``ansible.cfg``. Set
``GPUFORGE_ANSIBLE_STRATEGY=linear`` (or ``free``) to switch back to a stock Ansible strategy, e.g.
right after an ansible-core upgrade that Mitogen does not support yet.
"""

from __future__ import annotations

import configparser
import contextlib
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner

from gpuforge import playguard
from gpuforge.errors import Interrupted, OperationError
from gpuforge.resources import project_path, work_dir

PLAYBOOKS = project_path("playbooks")

Event = dict[str, Any]
EventHandler = Callable[[Event], None]


@dataclass(frozen=True, slots=True)
class HostStats:
    ok: int = 0
    changed: int = 0
    failures: int = 0
    unreachable: int = 0
    skipped: int = 0


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one playbook run did."""

    status: str  # ansible-runner's: successful, failed, timeout, canceled
    rc: int
    hosts: dict[str, HostStats]
    failed: dict[str, str]  # host -> message of its first failed task
    unreachable: dict[str, str]  # host -> connection error
    artifact_dir: Path
    strategy: str
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def ok_hosts(self) -> list[str]:
        return sorted(h for h in self.hosts if h not in self.failed and h not in self.unreachable)


def strategy_settings() -> tuple[str, dict[str, str]]:
    """The Ansible strategy to use and the environment that selects it."""
    wanted = os.environ.get("GPUFORGE_ANSIBLE_STRATEGY", "mitogen_linear")
    if not wanted.startswith("mitogen"):
        return wanted, {"ANSIBLE_STRATEGY": wanted}
    try:
        import ansible_mitogen  # type: ignore[import-untyped]  # noqa: PLC0415
    except ImportError:
        return "linear", {"ANSIBLE_STRATEGY": "linear"}
    plugins = Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"
    return wanted, {"ANSIBLE_STRATEGY": wanted, "ANSIBLE_STRATEGY_PLUGINS": str(plugins)}


def message(event_data: Mapping[str, Any]) -> str:
    """One line saying why a task failed or a host was unreachable."""
    res = event_data.get("res") or {}
    if not isinstance(res, Mapping):
        return str(res)[:500]
    msg = res.get("msg") or res.get("stderr") or res.get("module_stderr") or ""
    task = event_data.get("task", "")
    return f"{task}: {str(msg).strip()[:500]}" if task else str(msg)[:500]


def run_playbook(
    playbook: Path | str,
    inventory: Path | Sequence[Path],
    *,
    limit: str | None = None,
    extravars: Mapping[str, Any] | None = None,
    tags: str | None = None,
    artifact_dir: Path | None = None,
    on_event: EventHandler | None = None,
    timeout_s: int = 3600,
    forks: int = 16,
    play_record: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> RunResult:
    """Run ``playbook`` against ``inventory`` and return what happened to each host.

    ``inventory`` is one inventory source or several, read in order (later wins): a cluster
    directory's ``InventoryDir.sources``.

    The full event log stays under ``artifact_dir`` (ansible-runner's artifacts). ``timeout_s``
    bounds the whole run; ansible-runner stops the play when it is exceeded. The play runs
    under :mod:`gpuforge.playguard`: it dies with this process, and its process group is written
    to ``play_record`` while it runs (the cluster lock reads it to stop a play a killed run left).
    ``env`` adds Ansible settings for this play only (``ANSIBLE_TIMEOUT``, ...).
    """
    playbook_path = Path(playbook)
    sources = [inventory] if isinstance(inventory, Path | str) else list(inventory)
    if not playbook_path.is_absolute():
        playbook_path = PLAYBOOKS / playbook_path
    if not playbook_path.is_file():
        raise OperationError(f"playbook not found: {playbook_path}")
    private = Path(tempfile.mkdtemp(prefix="gpuforge-runner-"))
    strategy, run_env = _run_env(forks, env, private, play_record)
    artifacts = Path(artifact_dir).resolve() if artifact_dir else private / "artifacts"
    failed: dict[str, str] = {}
    unreachable: dict[str, str] = {}
    facts: dict[str, dict[str, Any]] = {}

    def handler(event: Event) -> bool:
        data = event.get("event_data") or {}
        host = data.get("host")
        kind = event.get("event")
        if host and kind == "runner_on_failed" and not data.get("ignore_errors"):
            failed.setdefault(host, message(data))
        elif host and kind == "runner_on_unreachable":
            unreachable.setdefault(host, message(data))
        elif host and kind == "runner_on_ok":
            res = data.get("res") or {}
            if isinstance(res, Mapping) and "ansible_facts" in res:
                facts.setdefault(host, {}).update(res["ansible_facts"])
        if on_event is not None:
            on_event(event)
        return True

    received: list[int] = []
    cancel, restore = _signals_cancel(received)
    try:
        run = ansible_runner.run(
            private_data_dir=str(private),
            artifact_dir=str(artifacts),
            playbook=str(playbook_path),
            # ansible-runner takes a string that is not an existing path as inventory *content*;
            # a list becomes one -i per source (a cluster's generated and site layers).
            inventory=[str(Path(p).resolve()) for p in sources],
            limit=limit,
            extravars=dict(extravars or {}),
            tags=tags,
            envvars=run_env,
            event_handler=handler,
            quiet=True,
            timeout=timeout_s,
            rotate_artifacts=0,
            cancel_callback=cancel,
            # ansible-runner points the jsonfile fact cache into this run's artifacts unless told
            # otherwise (an absolute path): smart gathering then gathered again on every run.
            fact_cache=str(fact_cache_dir(run_env)),
        )
    except BaseException:
        # Ctrl-C or an error in a handler: ansible-runner leaves its play running.
        if play_record is not None:
            playguard.stop_recorded_play(play_record)
        raise
    finally:
        restore()
        shutil.rmtree(private / "env", ignore_errors=True)
        shutil.rmtree(private / "bin", ignore_errors=True)
    if play_record is not None:
        play_record.unlink(missing_ok=True)
    if received:
        # ansible-runner killed the play ("canceled", rc 254): the operator asked for it.
        raise Interrupted(
            f"interrupted by {signal.Signals(received[0]).name} during {playbook_path.name}"
        )
    hosts = host_stats(run.stats or {}, (*failed, *unreachable))
    if not hosts and run.status != "successful":
        raise OperationError(
            f"{playbook_path.name} stopped before reaching any host ({run.status}, rc {run.rc}):"
            f" {_tail(Path(artifacts))}"
        )
    return RunResult(
        status=str(run.status),
        rc=int(run.rc),
        hosts=hosts,
        failed=failed,
        unreachable=unreachable,
        artifact_dir=Path(artifacts),
        strategy=strategy,
        facts=facts,
    )


def _run_env(
    forks: int, env: Mapping[str, str] | None, private: Path, play_record: Path | None
) -> tuple[str, dict[str, str]]:
    """The strategy and the environment of one play."""
    strategy, strategy_env = strategy_settings()
    run_env = {
        **strategy_env,
        # An operator's (or the lab's) ansible.cfg carries the SSH settings; else the project's.
        "ANSIBLE_CONFIG": os.environ.get("ANSIBLE_CONFIG", str(project_path("ansible.cfg"))),
        "ANSIBLE_ROLES_PATH": str(project_path("roles")),
        "ANSIBLE_FORKS": str(forks),
        # Deprecation notices of Ansible itself are noise to an operator (issue 15, item 7).
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        **(env or {}),
    }
    if "ANSIBLE_CONFIG" not in os.environ:
        # The project's ansible.cfg names build/facts relative to itself: inside an installed
        # package that is no place to write.
        run_env["ANSIBLE_CACHE_PLUGIN_CONNECTION"] = str(work_dir() / "build" / "facts")
    run_env.update(_guard_env(private, play_record))
    return strategy, run_env


def fact_cache_dir(run_env: Mapping[str, str]) -> Path:
    """The jsonfile fact cache a play keeps between runs (``fact_caching_connection``).

    From the play's environment, else the ``ansible.cfg`` in effect (a relative path is relative
    to that file), else ``build/facts`` of the work directory.
    """
    if run_env.get("ANSIBLE_CACHE_PLUGIN_CONNECTION"):
        return Path(run_env["ANSIBLE_CACHE_PLUGIN_CONNECTION"]).resolve()
    cfg = Path(run_env.get("ANSIBLE_CONFIG", str(project_path("ansible.cfg"))))
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    with contextlib.suppress(configparser.Error):
        parser.read(cfg)
    configured = parser.get("defaults", "fact_caching_connection", fallback="")
    if configured:
        return (cfg.parent / Path(configured).expanduser()).resolve()
    return work_dir() / "build" / "facts"


def _signals_cancel(received: list[int]) -> tuple[Callable[[], bool], Callable[[], None]]:
    """A cancel callback for ansible-runner fed by SIGINT/SIGTERM, and how to undo it.

    ansible-runner's own handler replaces gpuforge's for good (a later Ctrl-C would be ignored)
    and reports a cancel as "canceled, rc 254"; this one is restored when the play ends.
    """
    if threading.current_thread() is not threading.main_thread():
        return (lambda: False), (lambda: None)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, _frame: object) -> None:
        received.append(signum)

    for signum in previous:
        signal.signal(signum, handler)

    def restore() -> None:
        for signum, old in previous.items():
            signal.signal(signum, old)

    return (lambda: bool(received)), restore


def _guard_env(private: Path, play_record: Path | None) -> dict[str, str]:
    """Environment that starts ``ansible-playbook`` through :mod:`gpuforge.playguard`.

    ansible-runner looks the command up on the PATH it passes: a shim first on that PATH runs
    the real one under the guard.
    """
    real = shutil.which("ansible-playbook") or "ansible-playbook"
    shim_dir = private / "bin"
    shim_dir.mkdir()
    shim = shim_dir / "ansible-playbook"
    guard = [sys.executable, "-m", "gpuforge.playguard", real]
    shim.write_text(f'#!/bin/sh\nexec {shlex.join(guard)} "$@"\n')
    shim.chmod(0o755)
    env = {
        "PATH": os.pathsep.join([str(shim_dir), os.environ.get("PATH", "")]),
        playguard.PARENT_ENV: str(os.getpid()),
    }
    if play_record is not None:
        play_record.parent.mkdir(parents=True, exist_ok=True)
        # Absolute: the guard runs in ansible-runner's private data directory, not our cwd.
        env[playguard.RECORD_ENV] = str(play_record.absolute())
    return env


def host_stats(stats: Mapping[str, Any], reported: tuple[str, ...]) -> dict[str, HostStats]:
    """Per-host counters from ansible-runner's stats; hosts that only reported an error too."""
    hosts: dict[str, HostStats] = {}
    for key, attr in (
        ("ok", "ok"),
        ("changed", "changed"),
        ("failures", "failures"),
        ("dark", "unreachable"),
        ("skipped", "skipped"),
    ):
        for host, count in (stats.get(key) or {}).items():
            current = hosts.get(host, HostStats())
            hosts[host] = HostStats(**{**_as_dict(current), attr: count})
    for host in reported:
        hosts.setdefault(host, HostStats())
    return hosts


def _tail(artifacts: Path, lines: int = 5) -> str:
    """The last lines ansible-playbook printed, without colour codes."""
    outputs = sorted(artifacts.glob("**/stdout"), key=lambda p: p.stat().st_mtime)
    if not outputs:
        return "no output"
    text = re.sub(r"\x1b\[[0-9;]*m", "", outputs[-1].read_text(errors="replace"))
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _as_dict(stats: HostStats) -> dict[str, int]:
    return {
        "ok": stats.ok,
        "changed": stats.changed,
        "failures": stats.failures,
        "unreachable": stats.unreachable,
        "skipped": stats.skipped,
    }
