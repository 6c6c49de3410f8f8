"""Run one playbook on a batch, shard by shard, on execution hosts: :func:`run_sharded`.

    result = run_sharded("site.yml", cluster_dir, hosts, executors, artifact_dir=out)
    result.failed, result.hosts, result.shards  # merged over every shard and attempt

Shards (:mod:`.shards`) queue up; each execution host runs ``slots`` of them at once through
ansible-runner's streaming protocol (:mod:`.stream`). Infrastructure nodes in the batch run
first, in a shard of their own, before the others start (the GPU nodes' plays need them).
Events of every shard reach one ``on_event`` (one progress display), one at a time. When an
execution host is lost mid-shard, the shard goes back in the queue with only the hosts whose
result the event stream had not yet given (a host that failed stays failed; a host is done
when the play's stats name it) and the lost host takes no more shards. ``shards.json`` in
``artifact_dir`` is the record of which shard ran where and what each attempt did.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuforge.atomic import write_atomic
from gpuforge.errors import InputError, Interrupted, OperationError
from gpuforge.execution import artifacts, shards
from gpuforge.execution.executors import ExecutionHost, local_hosts, preflight
from gpuforge.execution.stream import Event, ShardRun, build_project, stream_shard
from gpuforge.inventory.reader import InventoryDir, read_generated_hosts
from gpuforge.node import bundle
from gpuforge.playbook import HostStats, RunResult, strategy_settings

#: The health role's prebuilt node checker (a path on the machine that runs Ansible).
HEALTH_BUNDLE_VAR = "health_bundle_src"
BUNDLE_TIMEOUT_S = 120
#: Attempts of one shard before its remaining hosts are given up as failed.
MAX_ATTEMPTS = 3
DEFAULT_LOCAL_WORKERS = 2


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run of one shard on one execution host, as ``shards.json`` records it."""

    shard: str
    attempt: int
    executor: str
    hosts: tuple[str, ...]
    status: str
    rc: int | None
    done: tuple[str, ...]
    seconds: float
    artifact_bytes: int
    explanation: str = ""
    slimmed: bool = False


@dataclass(slots=True)
class ShardedResult:
    """What the sharded run did to each host, merged over shards and attempts."""

    status: str
    hosts: dict[str, HostStats] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)
    attempts: list[Attempt] = field(default_factory=list)
    lost_executors: list[str] = field(default_factory=list)
    artifact_dir: Path = Path()
    strategy: str = ""

    @property
    def artifact_bytes(self) -> int:
        """Bytes kept on disk for the whole run."""
        return sum(a.artifact_bytes for a in self.attempts)

    def as_run_result(self) -> RunResult:
        """The merged run as the facade's :class:`~gpuforge.playbook.RunResult`."""
        return RunResult(
            status=self.status,
            rc=0 if self.status == "successful" else 2,
            hosts=dict(self.hosts),
            failed=dict(self.failed),
            unreachable=dict(self.unreachable),
            artifact_dir=self.artifact_dir,
            strategy=self.strategy,
        )


def run_sharded(
    playbook: str | Path,
    inventory: Path | InventoryDir,
    hosts: Sequence[str],
    executors: Sequence[ExecutionHost] | None = None,
    *,
    artifact_dir: Path,
    max_hosts: int | None = None,
    extravars: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    tags: str | None = None,
    forks: int = 16,
    timeout_s: int = 3600,
    on_event: Callable[[Event], None] | None = None,
    bytes_per_host: int | None = None,
) -> ShardedResult:
    """Run ``playbook`` on ``hosts`` of the cluster ``inventory``.

    ``playbook`` is a name under ``playbooks/``, or an absolute path to a play that is shipped
    beside them (it finds the project's roles).

    ``executors`` default to :data:`DEFAULT_LOCAL_WORKERS` local workers. They are checked
    first (:func:`~gpuforge.execution.executors.preflight`): a bad entry raises InputError
    before any node is touched. ``max_hosts`` cuts each SU's shard to that many hosts.
    ``bytes_per_host`` bounds the artifacts kept per host and attempt (default:
    ``GPUFORGE_ARTIFACT_BYTES_PER_HOST``, else 50 kB).
    """
    inv = inventory if isinstance(inventory, InventoryDir) else InventoryDir.open(inventory)
    pool = list(executors or local_hosts(DEFAULT_LOCAL_WORKERS))
    if not hosts:
        raise InputError(f"{playbook}: no hosts to run on")
    names = [e.name for e in pool]
    if len(set(names)) != len(names):
        raise InputError(f"execution hosts named twice: {', '.join(names)}")
    preflight(pool)
    generated = read_generated_hosts(inv)
    infra = set(shards.infra_hosts(generated))
    su = {h: k for h, k in shards.su_of(generated).items() if h not in infra}
    first = [h for h in hosts if h in infra]
    rest = [h for h in hosts if h not in infra]
    waves = []
    if first:
        waves.append([shards.Shard("infra", tuple(first))])
    if rest:
        waves.append(shards.split(rest, su, max_hosts=max_hosts))
    strategy, strategy_env = strategy_settings()
    envvars = {
        "ANSIBLE_STRATEGY": strategy_env["ANSIBLE_STRATEGY"],
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        **(env or {}),
    }
    artifact_dir.mkdir(parents=True, exist_ok=True)
    result = ShardedResult(status="successful", artifact_dir=artifact_dir, strategy=strategy)
    work = Path(tempfile.mkdtemp(prefix="gpuforge-shards-"))
    try:
        project = build_project(work / "project")
        if Path(playbook).is_absolute():  # a play from outside the project (tests, a site's own)
            shutil.copy2(playbook, project / "playbooks" / Path(playbook).name)
        extras = dict(extravars or {})
        if HEALTH_BUNDLE_VAR not in extras:
            # The health role builds the node checker with the gpuforge package of the Python
            # that runs Ansible; an execution host's runner has no gpuforge. Built once here
            # and shipped with the project, it is also the same file for every shard.
            _build_checker(project / bundle.NAME)
            extras[HEALTH_BUNDLE_VAR] = "{{ playbook_dir }}/../" + bundle.NAME
        job = _Job(
            inv=inv,
            generated=generated,
            project=project,
            work=work,
            playbook=f"playbooks/{Path(playbook).name}",
            artifact_dir=artifact_dir,
            extravars=extras,
            envvars=envvars,
            tags=tags,
            forks=forks,
            timeout_s=timeout_s,
            on_event=on_event,
            result=result,
            bytes_per_host=bytes_per_host or artifacts.bytes_per_host_budget(),
        )
        for wave in waves:
            job.run_wave(wave, pool)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if result.failed or result.unreachable or not _all_done(result, hosts):
            result.status = "failed"
        _write_record(result)
    return result


def _build_checker(out: Path) -> None:
    """``python -m gpuforge.node.bundle OUT`` in a fresh interpreter, as the health role runs it.

    Built inside this process the archive's bytecode differs with what the process has imported
    (marshal marks objects by their reference counts), so every run would install a "changed"
    checker on every node (seen on d2exec: 1 change per converged node).
    """
    try:
        subprocess.run(
            [sys.executable, "-m", "gpuforge.node.bundle", str(out)],
            capture_output=True,
            text=True,
            timeout=BUNDLE_TIMEOUT_S,
            check=True,
        )
    except subprocess.TimeoutExpired:
        raise OperationError(f"building the node checker took over {BUNDLE_TIMEOUT_S} s") from None
    except subprocess.CalledProcessError as exc:
        raise OperationError(
            f"building the node checker failed: {exc.stderr.strip()[-300:]}"
        ) from None


def _all_done(result: ShardedResult, hosts: Sequence[str]) -> bool:
    return all(h in result.hosts for h in hosts)


@dataclass
class _Job:
    inv: InventoryDir
    generated: Any
    project: Path
    work: Path
    playbook: str
    artifact_dir: Path
    extravars: dict[str, Any]
    envvars: dict[str, str]
    tags: str | None
    forks: int
    timeout_s: int
    on_event: Callable[[Event], None] | None
    result: ShardedResult
    bytes_per_host: int
    lock: threading.Condition = field(default_factory=threading.Condition)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: Per shard: the artifact bytes its hosts may keep over all its attempts, and kept so far
    #: (a lost attempt's events count against its re-run: the bound is per host and run).
    budgets: dict[str, int] = field(default_factory=dict)
    spent: dict[str, int] = field(default_factory=dict)

    def _event(self, event: Event) -> None:
        if self.on_event is not None:
            with self.lock:
                self.on_event(event)

    def run_wave(self, wave: list[shards.Shard], pool: list[ExecutionHost]) -> None:
        """Run ``wave``'s shards on the live execution hosts until none is left to run."""
        pending: deque[tuple[shards.Shard, int]] = deque((s, 1) for s in wave)
        live = {e.name for e in pool if e.name not in self.result.lost_executors}
        running = [0]

        def loop(host: ExecutionHost) -> None:
            while True:
                with self.lock:
                    while not pending and running[0] and host.name in live:
                        self.lock.wait(1.0)
                    if not pending or host.name not in live:
                        self.lock.notify_all()
                        return
                    shard, attempt = pending.popleft()
                    running[0] += 1
                try:
                    run = self._attempt(host, shard, attempt)
                finally:
                    with self.lock:
                        running[0] -= 1
                        self.lock.notify_all()
                with self.lock:
                    again = self._merge(host, shard, attempt, run, live)
                    if again is not None:
                        pending.append(again)
                    self.lock.notify_all()

        threads = [
            threading.Thread(target=loop, args=(h,), name=f"shard-{h.name}-{n}", daemon=True)
            for h in pool
            if h.name in live
            for n in range(h.slots)
        ]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.5)
        except KeyboardInterrupt:
            with self.lock:
                live.clear()
                for proc in self.procs:
                    if proc.poll() is None:
                        proc.terminate()
            raise Interrupted(f"interrupted during {self.playbook}") from None
        with self.lock:
            for shard, _attempt in pending:  # every execution host was lost
                for h in shard.hosts:
                    self.result.failed.setdefault(h, "no execution host left to run its shard")

    def _attempt(self, host: ExecutionHost, shard: shards.Shard, attempt: int) -> ShardRun:
        private = self.work / f"{shard.key}-{attempt}"
        shutil.copytree(self.project, private / "project", copy_function=_link)
        sources = shards.write_shard_inventory(
            self.inv, self.generated, shard.hosts, private / "shard"
        )
        started = time.monotonic()
        with self.lock:
            per_host = max(0, self.bytes_per_host - artifacts.RECORD_RESERVE)
            total = self.budgets.setdefault(shard.key, per_host * len(shard.hosts))
            budget = max(0, total - self.spent.get(shard.key, 0))

        def register(proc: subprocess.Popen[bytes]) -> None:
            with self.lock:
                self.procs.append(proc)

        run = stream_shard(
            host,
            private,
            playbook=self.playbook,
            inventory=[str(p.relative_to(private)) for p in sources],
            limit=shard.hosts,
            artifact_dir=self.artifact_dir / f"{shard.key}-{attempt}",
            extravars=self.extravars,
            envvars=self.envvars,
            tags=self.tags,
            forks=self.forks,
            timeout_s=self.timeout_s,
            on_event=self._event,
            artifact_budget=budget,
            started=register,
        )
        with self.lock:
            self.spent[shard.key] = self.spent.get(shard.key, 0) + run.artifact_bytes
        self.result.attempts.append(
            Attempt(
                shard=shard.key,
                attempt=attempt,
                executor=host.name,
                hosts=shard.hosts,
                status=run.status,
                rc=run.rc,
                done=tuple(sorted(run.done & set(shard.hosts))),
                seconds=round(time.monotonic() - started, 1),
                artifact_bytes=run.artifact_bytes,
                explanation=run.explanation,
                slimmed=run.slimmed,
            )
        )
        shutil.rmtree(private, ignore_errors=True)
        return run

    def _merge(
        self,
        host: ExecutionHost,
        shard: shards.Shard,
        attempt: int,
        run: ShardRun,
        live: set[str],
    ) -> tuple[shards.Shard, int] | None:
        """Take the attempt's per-host results; return the shard to run again, if any."""
        mine = set(shard.hosts)
        for h in run.done & mine:
            if h in run.failed:
                self.result.failed[h] = run.failed[h]
            if h in run.unreachable:
                self.result.unreachable[h] = run.unreachable[h]
            self.result.hosts[h] = run.hosts.get(h, HostStats())
        if not run.lost:
            for h in mine - run.done:  # the play ended without a word on them
                self.result.failed.setdefault(h, f"play {run.status} (rc {run.rc})")
            return None
        live.discard(host.name)
        if host.name not in self.result.lost_executors:
            self.result.lost_executors.append(host.name)
        remaining = tuple(h for h in shard.hosts if h not in run.done)
        if not remaining:
            return None
        if attempt >= MAX_ATTEMPTS or not live:
            why = f"execution host {host.name} lost: {run.explanation}"
            for h in remaining:
                self.result.failed.setdefault(h, why)
            return None
        return shards.Shard(shard.key, remaining), attempt + 1


def _link(src: str, dst: str) -> None:
    shutil.copy2(src, dst) if Path(src).is_symlink() else Path(dst).hardlink_to(src)


def _write_record(result: ShardedResult) -> None:
    record = {
        "status": result.status,
        "strategy": result.strategy,
        "lost_executors": result.lost_executors,
        "artifact_bytes": result.artifact_bytes,
        "hosts": {h: asdict(s) for h, s in sorted(result.hosts.items())},
        "failed": result.failed,
        "unreachable": result.unreachable,
        "attempts": [asdict(a) for a in result.attempts],
    }
    path = result.artifact_dir / "shards.json"
    write_atomic(path, json.dumps(record, indent=1, sort_keys=True), mode=None)
