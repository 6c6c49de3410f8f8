"""How gpuforge reaches a node over OpenSSH: the inventory's connection settings, one command line.

:class:`gpuforge.command.SshRunner` (used by the validators and by Slurm control) builds its
``ssh`` calls here, so a host reached by Ansible is reached by gpuforge the same way: batch mode
(never a password prompt), a connect timeout, keep-alives that notice a dead peer.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class SshTarget:
    """How to reach one host: the inventory's ``ansible_*`` connection variables."""

    address: str
    user: str | None = None
    port: int | None = None
    key_file: str | None = None
    extra_args: tuple[str, ...] = ()

    @classmethod
    def from_hostvars(cls, host: str, hostvars: Mapping[str, object]) -> SshTarget:
        """Build from Ansible host variables (``ansible_host``, ``ansible_user``, ...)."""

        def first(*names: str) -> object:
            return next((hostvars[n] for n in names if hostvars.get(n)), None)

        port = first("ansible_port", "ansible_ssh_port")
        key = first("ansible_ssh_private_key_file", "ansible_private_key_file")
        user = first("ansible_user", "ansible_ssh_user")
        extra: list[str] = []
        for name in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
            extra += shlex.split(str(hostvars.get(name) or ""))
        return cls(
            address=str(hostvars.get("ansible_host") or host),
            user=str(user) if user else None,
            port=int(str(port)) if port else None,
            key_file=str(key) if key else None,
            extra_args=tuple(extra),
        )

    def command(self, remote: str, *, connect_timeout: int = 10, ssh: str = "ssh") -> list[str]:
        """The ``ssh`` argv that runs the shell line ``remote`` on this host."""
        argv = [
            ssh,
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={connect_timeout}",
            "-o",
            "ServerAliveInterval=5",
            "-o",
            "ServerAliveCountMax=3",
            "-o",
            "LogLevel=ERROR",
        ]
        if self.port:
            argv += ["-p", str(self.port)]
        if self.key_file:
            argv += ["-i", self.key_file]
        argv += list(self.extra_args)
        dest = f"{self.user}@{self.address}" if self.user else self.address
        return [*argv, dest, "--", remote]
