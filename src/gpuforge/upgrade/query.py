"""A quick query of what GPU nodes have installed, when the history store cannot say.

One shell line per node over the inventory's SSH settings (``gpuforge.command.SshRunner``),
under a hard timeout, many nodes at once: the driver from ``nvidia-smi``, packages from
``dpkg-query``, the kernel from ``uname -r``. :func:`parse_query` is pure; a node that did not
answer (unreachable, timed out, no output) is left out, so the plan treats it as unknown.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from gpuforge.command import CommandRunner
from gpuforge.upgrade.plan import Installed
from gpuforge.validate import catalogue, checks

QUERY = (
    "echo @@driver; nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null; "
    f"echo @@dpkg; {shlex.join(checks.DPKG_QUERY)} 2>/dev/null; echo @@kernel; uname -r"
)
"""The remote command line (POSIX sh); each section starts with a ``@@name`` marker line."""

PACKAGES: dict[str, tuple[str, ...]] = {
    **catalogue.VERSION_PACKAGES,
    "doca_ofed": ("doca-ofed", "doca-host"),
    "pmix": ("libpmix2", "libpmix2t64", "libpmix-dev"),
}
"""Component -> packages that carry its version: the check catalogue's (what the node's
``software.versions`` check reads), plus DOCA and PMIx."""


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("@@"):
            current = out.setdefault(line[2:].strip(), [])
        elif current is not None and line.strip():
            current.append(line.strip())
    return out


def parse_query(text: str) -> dict[str, str | None] | None:
    """The components ``QUERY``'s output shows; None when the output is not QUERY's."""
    parts = _sections(text)
    if not {"driver", "dpkg", "kernel"} <= set(parts):
        return None
    installed = checks.parse_installed("\n".join(parts["dpkg"]))
    drivers = sorted(set(parts["driver"]))
    versions: dict[str, str | None] = {"nvidia_driver": ",".join(drivers) or None}
    for component, names in PACKAGES.items():
        value = checks.package_version(installed, names)
        if value is not None or component in catalogue.VERSION_PACKAGES:
            versions[component] = value
    if parts["kernel"]:
        versions["kernel"] = parts["kernel"][0]
    return versions


def query_installed(
    runner: CommandRunner,
    hosts: Iterable[str],
    *,
    timeout: float = 30.0,
    parallel: int = 64,
) -> tuple[dict[str, Installed], list[str]]:
    """Ask every host; returns what answered and the hosts that did not (unreachable, hung)."""
    hosts = list(hosts)
    found: dict[str, Installed] = {}
    silent: list[str] = []

    def ask(host: str) -> tuple[str, dict[str, str | None] | None]:
        result = runner.run(host, QUERY, timeout=timeout)
        return host, parse_query(result.stdout) if not result.timed_out else None

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(hosts) or 1))) as pool:
        for host, versions in pool.map(ask, hosts):
            if versions is None:
                silent.append(host)
            else:
                found[host] = Installed(versions, "query")
    return found, silent
