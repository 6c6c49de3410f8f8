"""Execution hosts: where ansible-runner workers run, and the check that they can.

Every shard runs through ansible-runner's streaming protocol, the one AWX's receptor mesh uses:
``interface.run(streamer='transmit')`` writes the private data directory (the project, the
shard's inventory, the job's arguments) to the worker's stdin; ``ansible-runner worker`` runs
the play and writes status, events and its artifacts to stdout; ``streamer='process'`` reads
them back on the controller. An :class:`ExecutionHost` only says how the worker is started:

* :data:`LOCAL` (the default): a subprocess on the controller, under :mod:`gpuforge.playguard`;
* ``ssh``: ``ssh HOST sh -c ...`` with the pinned runner in ``venv`` on that host (the
  ``execution_host`` role puts it there).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from gpuforge.errors import InputError

#: The packages an execution host must have at the controller's versions. ``ansible`` carries
#: the collections the roles use (community.general, ansible.posix); ansible-core has none.
PINNED = ("ansible", "ansible-runner", "ansible-core", "mitogen")
#: Where the ``execution_host`` role installs the runner on an execution host.
DEFAULT_VENV = "/opt/gpuforge/runner"
PREFLIGHT_TIMEOUT_S = 30.0
#: ssh options of a worker: no prompt, and a dead host noticed in ~15 s, not at TCP's pace.
SSH_OPTIONS = (
    "-o", "BatchMode=yes",
    "-o", "ConnectTimeout=10",
    "-o", "ServerAliveInterval=5",
    "-o", "ServerAliveCountMax=3",
)  # fmt: skip

_VERSIONS = (
    "import json,importlib.metadata as m\n"
    "def v(n):\n"
    "    try: return m.version(n)\n"
    "    except m.PackageNotFoundError: return None\n"
    f"print(json.dumps({{n: v(n) for n in {list(PINNED)!r}}}))"
)


@dataclass(frozen=True, slots=True)
class ExecutionHost:
    """One place workers run. ``ssh`` is the ssh destination, None for the controller."""

    name: str
    ssh: str | None = None
    venv: str = DEFAULT_VENV
    #: Shards this host runs at once.
    slots: int = 1
    ssh_args: tuple[str, ...] = ()

    @property
    def is_local(self) -> bool:
        """Whether workers run on the controller itself."""
        return self.ssh is None

    def command(self, script: str) -> list[str]:
        """argv that runs the shell ``script`` on this host."""
        if self.ssh is None:
            return ["sh", "-c", script]
        return ["ssh", *SSH_OPTIONS, *self.ssh_args, self.ssh, f"sh -c {shlex.quote(script)}"]

    def worker_command(self) -> list[str]:
        """argv of one ``ansible-runner worker`` reading a job on stdin."""
        v = shlex.quote(self.venv)
        script = (
            f'V={v}; export PATH="$V/bin:$PATH"; '
            # Mitogen's strategy plugins live inside its package on that host.
            'M=$("$V/bin/python" -c \'import ansible_mitogen,os;'
            "print(os.path.dirname(ansible_mitogen.__file__))' 2>/dev/null)"
            ' && export ANSIBLE_STRATEGY_PLUGINS="$M/plugins/strategy"; '
            'D=$(mktemp -d) && exec "$V/bin/ansible-runner" worker --private-data-dir "$D" --delete'
        )
        argv = self.command(script)
        if self.is_local:
            # Dies with gpuforge and takes its play along (the play is in the worker's group).
            argv = [sys.executable, "-m", "gpuforge.playguard", *argv]
        return argv


LOCAL = ExecutionHost("local", None, venv=str(Path(sys.executable).parent.parent))


def local_hosts(workers: int) -> list[ExecutionHost]:
    """The embedded default: ``workers`` shards at once on the controller."""
    return [ExecutionHost("local", None, venv=LOCAL.venv, slots=max(1, workers))]


def controller_versions() -> dict[str, str | None]:
    """The pinned packages' versions in gpuforge's own environment."""
    out: dict[str, str | None] = {}
    for name in PINNED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def probe(host: ExecutionHost, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> dict[str, str | None]:
    """The pinned packages' versions on ``host``; OSError/ValueError when it cannot say."""
    script = f"exec {shlex.quote(host.venv + '/bin/python')} -c {shlex.quote(_VERSIONS)}"
    try:
        proc = subprocess.run(
            host.command(script),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise OSError(f"no answer in {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise OSError(tail[:300])
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: data.get(name) for name in PINNED}


def preflight(hosts: Sequence[ExecutionHost], timeout_s: float = PREFLIGHT_TIMEOUT_S) -> None:
    """Refuse (InputError, exit 2) unless every host answers with the controller's versions.

    Runs before any shard starts, so a bad execution-host entry touches no node.
    """
    want = controller_versions()
    problems: list[str] = []
    for host in hosts:
        try:
            have = probe(host, timeout_s)
        except (OSError, ValueError, IndexError) as exc:
            problems.append(f"{host.name}: unreachable or no runner in {host.venv}: {exc}")
            continue
        wrong = [
            f"{n} {have[n] or 'missing'} (want {want[n]})" for n in PINNED if have[n] != want[n]
        ]
        if wrong:
            problems.append(f"{host.name}: {', '.join(wrong)}")
    if problems:
        raise InputError("execution hosts not usable: " + "; ".join(problems))


#: The site inventory layer's group of execution hosts (``site/hosts.yml``).
EXECUTION_GROUP = "gpuforge_execution_hosts"
#: ``local`` or ``local:N`` (N local workers), ``off`` (one ansible-playbook, no shards).
MODE_ENV = "GPUFORGE_EXECUTION"
#: Most hosts in one shard (default: one shard per SU).
SHARD_HOSTS_ENV = "GPUFORGE_SHARD_HOSTS"


@dataclass(frozen=True, slots=True)
class ExecutionPlan:
    """Where a rollout's plays run: these hosts, shards of at most ``max_hosts`` (or per SU)."""

    hosts: tuple[ExecutionHost, ...]
    max_hosts: int | None = None


def from_inventory(listing: Mapping[str, Any]) -> list[ExecutionHost]:
    """The execution hosts an ``ansible-inventory --list`` names in :data:`EXECUTION_GROUP`.

    Per host: ``ansible_host`` (else the name), ``ansible_user``, ``ansible_port``,
    ``gpuforge_runner_venv``, ``gpuforge_execution_slots`` and ``gpuforge_execution_ssh_args``.
    """
    names = (listing.get(EXECUTION_GROUP) or {}).get("hosts") or []
    hostvars = (listing.get("_meta") or {}).get("hostvars") or {}
    out = []
    for name in names:
        hv = hostvars.get(name) or {}
        dest = str(hv.get("ansible_host") or name)
        if hv.get("ansible_user"):
            dest = f"{hv['ansible_user']}@{dest}"
        args = [str(a) for a in hv.get("gpuforge_execution_ssh_args") or []]
        if hv.get("ansible_port"):
            args += ["-p", str(hv["ansible_port"])]
        try:
            slots = int(hv.get("gpuforge_execution_slots", 1))
        except (TypeError, ValueError):
            raise InputError(
                f"{EXECUTION_GROUP}: {name}: gpuforge_execution_slots "
                f"{hv.get('gpuforge_execution_slots')!r} is not a whole number"
            ) from None
        venv = str(hv.get("gpuforge_runner_venv") or DEFAULT_VENV)
        out.append(ExecutionHost(name, dest, venv=venv, slots=max(1, slots), ssh_args=tuple(args)))
    return out


def plan(listing: Mapping[str, Any], environ: Mapping[str, str]) -> ExecutionPlan | None:
    """The execution plan of a rollout, or None for one plain ``ansible-playbook`` run.

    Execution hosts in the inventory win; else ``GPUFORGE_EXECUTION=local[:N]`` asks for N
    (default 2) local workers; ``GPUFORGE_EXECUTION=off`` turns sharding off altogether.
    """
    mode = environ.get(MODE_ENV, "").strip()
    raw_size = environ.get(SHARD_HOSTS_ENV, "").strip()
    if raw_size and not raw_size.isdigit():
        raise InputError(f"{SHARD_HOSTS_ENV}={raw_size!r}: not a whole number")
    size = int(raw_size) if raw_size else None
    if mode == "off":
        return None
    listed = from_inventory(listing)
    if listed:
        return ExecutionPlan(tuple(listed), size)
    if not mode:
        return None
    kind, _, count = mode.partition(":")
    if kind != "local" or (count and not count.isdigit()):
        raise InputError(f"{MODE_ENV}={mode!r}: use local, local:N or off")
    return ExecutionPlan(tuple(local_hosts(int(count or 2))), size)
