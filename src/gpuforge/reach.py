"""Which nodes of a batch answer SSH, decided for the whole batch within one deadline.

Ansible tries an unanswering host one fork at a time (``timeout`` per attempt, several
attempts): against an sshd that accepts and never answers, preflight took 8 x 30 s per host, and
a batch larger than ``forks`` waits that long per round. Here every node's SSH port is opened at
once and must send its protocol banner (``SSH-2.0-...``, RFC 4253 section 4.2) before one shared
deadline, however many nodes there are. Only nodes that answered go on to the preflight play.

Nodes reached through something other than a direct SSH connection (a jump host, a proxy
command, a non-SSH connection plugin) are not probed here: their play decides. That includes
every node when an SSH client configuration this machine reads (``~/.ssh/config``,
``/etc/ssh/ssh_config``) or ``ANSIBLE_SSH_ARGS`` names a proxy, and when
``GPUFORGE_PREFLIGHT_PROBE=0``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEADLINE_S = 20.0
"""Every node of a batch answers within this, or is unreachable; far under preflight's 30 s."""

_BANNER_BYTES = 255  # RFC 4253: the identification line is at most 255 characters


@dataclass(frozen=True, slots=True)
class SshdEndpoint:
    """Where a node's sshd listens, as its inventory variables say."""

    host: str
    address: str
    port: int


def targets(hostvars: Mapping[str, Mapping[str, Any]], hosts: Iterable[str]) -> list[SshdEndpoint]:
    """The nodes of ``hosts`` to probe directly; the rest are left to Ansible (see the module)."""
    if os.environ.get("GPUFORGE_PREFLIGHT_PROBE", "1") == "0" or _proxied_by_client_config():
        return []
    found = []
    for host in hosts:
        variables = hostvars.get(host, {})
        connection = str(variables.get("ansible_connection", "ssh"))
        args = " ".join(
            str(variables.get(k, ""))
            for k in ("ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_args")
        )
        if connection not in ("ssh", "paramiko", "smart") or "Proxy" in args:
            continue
        address = str(variables.get("ansible_host") or host)
        port = int(variables.get("ansible_port") or variables.get("ansible_ssh_port") or 22)
        found.append(SshdEndpoint(host, address, port))
    return found


def probe(nodes: Iterable[SshdEndpoint], deadline_s: float | None = None) -> dict[str, str]:
    """Nodes that did not send an SSH banner within ``deadline_s``, each with the reason."""
    deadline_s = DEADLINE_S if deadline_s is None else deadline_s
    todo = list(nodes)
    if not todo:
        return {}
    slots = _raise_open_file_limit(len(todo) + 64) - 64
    return asyncio.run(_probe_all(todo, deadline_s, max(slots, 16)))


def _proxied_by_client_config() -> bool:
    """Whether SSH settings outside the inventory may route connections through a proxy."""
    files = [Path.home() / ".ssh" / "config", Path("/etc/ssh/ssh_config")]
    files += sorted(Path("/etc/ssh/ssh_config.d").glob("*.conf"))
    texts = [os.environ.get("ANSIBLE_SSH_ARGS", ""), os.environ.get("ANSIBLE_SSH_COMMON_ARGS", "")]
    for path in files:
        with contextlib.suppress(OSError):
            texts.append(path.read_text(errors="replace"))
    for text in texts:
        for line in text.splitlines():
            words = line.split("#", 1)[0].replace("=", " ").split()
            if any(w.lower() in ("proxyjump", "proxycommand", "-j") or "Proxy" in w for w in words):
                return True
    return False


async def _probe_all(nodes: list[SshdEndpoint], deadline_s: float, slots: int) -> dict[str, str]:
    # Beyond the open-file limit, nodes wait for a socket (answering nodes free theirs at once).
    gate = asyncio.Semaphore(slots)

    async def one(node: SshdEndpoint) -> str | None:
        async with gate:
            return await _probe_one(node, deadline_s)

    results = await asyncio.gather(*(one(n) for n in nodes))
    return {n.host: why for n, why in zip(nodes, results, strict=True) if why is not None}


async def _probe_one(node: SshdEndpoint, deadline_s: float) -> str | None:
    where = f"{node.address}:{node.port}"
    writer: asyncio.StreamWriter | None = None
    stage = "connecting to"
    try:
        async with asyncio.timeout(deadline_s):
            reader, writer = await asyncio.open_connection(node.address, node.port)
            stage = "waiting for the SSH banner from"
            while True:
                line = await reader.readline()
                if not line:
                    return f"{where} closed the connection before sending an SSH banner"
                # RFC 4253 allows other lines before the identification string.
                if line.startswith(b"SSH-"):
                    return None
                if len(line) > _BANNER_BYTES:
                    return f"{where} does not speak SSH"
    except TimeoutError:
        return f"no answer in {deadline_s:g} s {stage} {where} (host down or sshd hung)"
    except OSError as exc:
        return f"cannot connect to {where}: {exc.strerror or exc}"
    except ValueError:  # a line longer than the stream's limit
        return f"{where} does not speak SSH"
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def _raise_open_file_limit(wanted: int) -> int:
    """One socket per node: lift the soft limit of open files up to the hard one; return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return wanted
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    return target
