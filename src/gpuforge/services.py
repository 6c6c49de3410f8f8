"""The services host: where the collector, the history and the admission record live.

The deploy installs gpuforge on the inventory's ``gpuforge_services`` group (by default the
Slurm controllers) and runs the collector there; the history store and the admission record it
writes are on that host, not on the admin host. A command run on the admin host that reads them
(``health history``, ``fleet status``, ``fleet risk --from-store``, ``conformance run``) finds
the host from the cluster directory and runs the same gpuforge command there over SSH
(:func:`run_there`), relaying its output and exit status (docs/health.md, "Where the tools run").

:class:`ServicesHost` is that host as the inventory gives it: its name, how SSH reaches it (the
inventory's connection variables, :class:`~gpuforge.ssh.SshTarget`), and where gpuforge, the
cluster directory copy, the state and the reports are on it (host variables, with the deploy's
defaults).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, Protocol

import click

from gpuforge.command import CommandResult, CommandRunner, SshRunner
from gpuforge.errors import GpuforgeError, InputError
from gpuforge.inventory.reader import InventoryDir, host_vars, list_inventory, read_generated_hosts
from gpuforge.ssh import SshTarget

#: The inventory group of the services host (its first member is the one the tools use).
GROUP = "gpuforge_services"
#: Set to the services host's name where a command runs on that host (the deploy's systemd
#: units, and every command :func:`run_there` starts): the command then runs where it is.
HOST_ENV = "GPUFORGE_SERVICES_HOST"

#: Where the deploy puts things on the services host (host variable: default).
DEFAULT_GPUFORGE = "/opt/gpuforge/venv/bin/gpuforge"
DEFAULT_CLUSTER_DIR = "/etc/gpuforge/cluster"
DEFAULT_STATE_DIR = "/var/lib/gpuforge/state"
DEFAULT_REPORT_DIR = "/var/lib/gpuforge/reports"
_HOSTVARS = {
    "gpuforge": ("gpuforge_services_gpuforge", DEFAULT_GPUFORGE),
    "cluster_dir": ("gpuforge_services_cluster_dir", DEFAULT_CLUSTER_DIR),
    "state_dir": ("gpuforge_services_state_dir", DEFAULT_STATE_DIR),
    "report_dir": ("gpuforge_services_report_dir", DEFAULT_REPORT_DIR),
}

#: Seconds a delegated command may run when its command does not say (``fleet status``, ...).
DEFAULT_TIMEOUT_S = 600.0
#: rc of ``sh`` when the command is not there (126: not executable).
_NOT_FOUND_RC = (126, 127)
#: A site-layer line that names the group (not in a comment): the site may change its members.
_NAMES_GROUP = re.compile(rf"^(?![ \t]*#).*\b{GROUP}\b", re.MULTILINE)


class ServicesUnreachable(GpuforgeError):  # noqa: N818 - reads as the outcome it reports
    """The services host could not be reached, or did not answer in time: exit 2.

    Nothing ran there (or the run was cut short); 2 is the CLI's "bad input or cut short", so a
    missing answer is never read as a check that failed (1) or passed (0).
    """

    exit_code = 2


class HasClusterDir(Protocol):
    """What :meth:`ServicesHost.of` reads of a command's context: its cluster directory."""

    @property
    def root(self) -> Path | None:
        """The cluster directory (generated/ and site/), or None."""
        ...


@dataclass(frozen=True)
class ServicesHost:
    """The host that runs the cluster's services, and where the deploy put them there."""

    hostname: str
    target: SshTarget
    gpuforge: str = DEFAULT_GPUFORGE
    cluster_dir: str = DEFAULT_CLUSTER_DIR
    state_dir: str = DEFAULT_STATE_DIR
    report_dir: str = DEFAULT_REPORT_DIR
    #: Whether the host is also a Slurm controller (its Slurm commands then run locally).
    controller: bool = False

    @classmethod
    def from_hostvars(
        cls, hostname: str, hostvars: Mapping[str, object], *, controller: bool = False
    ) -> ServicesHost:
        """The host from its (merged) Ansible variables: connection and remote paths."""
        paths = {
            field: str(hostvars.get(var) or default) for field, (var, default) in _HOSTVARS.items()
        }
        target = SshTarget.from_hostvars(hostname, hostvars)
        return cls(hostname, target, controller=controller, **paths)

    @classmethod
    def of(cls, ctx: HasClusterDir) -> ServicesHost | None:
        """The services host the cluster directory of ``ctx`` names; None when it names none."""
        return cls.at(ctx.root)

    @classmethod
    def at(cls, root: Path | None) -> ServicesHost | None:
        """The services host of the cluster directory ``root`` (None: no directory, no group)."""
        found = services_hostname(root)
        if root is None or found is None:
            return None
        hostname, controller = found
        return cls.from_hostvars(hostname, host_vars(root, hostname), controller=controller)

    @classmethod
    def elsewhere(cls, root: Path | None) -> ServicesHost | None:
        """The services host of ``root`` when this process does not run on it, else None.

        The host's variables are read (one ``ansible-inventory --host`` run) only then.
        """
        found = services_hostname(root)
        if root is None or found is None or os.environ.get(HOST_ENV, "") == found[0]:
            return None
        return cls.at(root)

    def command_line(self, argv: Sequence[str]) -> str:
        """The shell line that runs ``gpuforge <argv>`` there, marked as run on this host."""
        words = ["env", f"{HOST_ENV}={self.hostname}", self.gpuforge, *argv]
        return shlex.join(words)


def services_hostname(root: Path | None) -> tuple[str, bool] | None:
    """The first host of the ``gpuforge_services`` group, and whether it is a controller.

    Read from ``generated/hosts.yml`` (milliseconds, no Ansible run); when the site layer names
    the group too, from ``ansible-inventory`` over both layers. None: not a cluster directory,
    or no such group (or an empty one).
    """
    if root is None or not (root / "generated" / "hosts.yml").is_file():
        return None
    try:
        inv = InventoryDir.open(root)
        if _site_names_group(inv):
            listing = list_inventory(inv)
            members = list(listing.get(GROUP, {}).get("hosts") or [])
            controllers = set(listing.get("slurm_controllers", {}).get("hosts") or [])
        else:
            groups = read_generated_hosts(inv).groups
            members = list(groups.get(GROUP) or [])
            controllers = set(groups.get("slurm_controllers") or [])
    except InputError:
        return None  # not a cluster directory: the command reports that itself
    if not members:
        return None
    return str(members[0]), members[0] in controllers


def _site_names_group(inv: InventoryDir) -> bool:
    if not inv.site.is_dir():
        return False
    for path in sorted(inv.site.rglob("*")):
        if path.is_file() and path.suffix in {".yml", ".yaml", ".json", ".ini", ""}:
            try:
                if _NAMES_GROUP.search(path.read_text(encoding="utf-8", errors="replace")):
                    return True
            except OSError:
                continue
    return False


def run_there(
    host: ServicesHost,
    argv: Sequence[str],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    runner: CommandRunner | None = None,
) -> NoReturn:
    """Run ``gpuforge <argv>`` on ``host``; relay its stdout, stderr and exit status.

    ``argv`` already names the host's cluster directory and state (the caller substitutes
    them). SSH failing, the host not answering within ``timeout_s`` or gpuforge missing there
    raise :class:`ServicesUnreachable` (one line, exit 2); otherwise this exits with the
    remote command's status.
    """
    line = host.command_line(argv)
    ssh = runner or SshRunner({host.hostname: host.target})
    result = ssh.run(host.hostname, line, timeout=timeout_s)
    _relay(result)
    problem = _failure(host, result, timeout_s)
    if problem:
        raise ServicesUnreachable(problem)
    raise SystemExit(result.rc)


def _relay(result: CommandResult) -> None:
    if result.stdout:
        click.echo(result.stdout, nl=False)
    if result.stderr and not (result.unreachable or result.rc in _NOT_FOUND_RC):
        click.echo(result.stderr, nl=False, err=True)


def _failure(host: ServicesHost, result: CommandResult, timeout_s: float) -> str | None:
    where = f"services host {host.hostname} ({host.target.address})"
    last = _last_line(result.stderr)
    if result.timed_out:
        return f"{where}: no answer within {timeout_s:.0f}s; what ran there was cut short"
    if result.unreachable:
        return f"{where} unreachable over SSH: {last or 'ssh exited 255'}"
    if result.rc in _NOT_FOUND_RC:
        return (
            f"{where}: cannot run {host.gpuforge} ({last or f'rc={result.rc}'}); deploy the "
            f"services there, or give --here to use this machine's state"
        )
    if result.rc is None:
        return f"{where}: ssh did not run ({last or 'no status'})"
    return None


def _last_line(text: str) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[-1] if lines else ""
