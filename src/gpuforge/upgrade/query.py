"""A quick query of what GPU nodes have installed, when the history store cannot say.

One shell line per node over the inventory's SSH settings (``gpuforge.command.SshRunner``),
under a hard timeout, many nodes at once: the driver from ``nvidia-smi``, packages from
``dpkg-query``, the kernel from ``uname -r``. :func:`parse_query` is pure; a node that did not
answer (unreachable, timed out, no output) is left out, so the plan treats it as unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

from gpuforge.command import CommandRunner
from gpuforge.topology.compat import release
from gpuforge.upgrade.plan import Installed

QUERY = (
    "echo @@driver; nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null; "
    "echo @@dpkg; dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Status}\\n' "
    "2>/dev/null; echo @@kernel; uname -r"
)
"""The remote command line (POSIX sh); each section starts with a ``@@name`` marker line."""

PACKAGES: dict[str, tuple[str, ...]] = {
    "fabricmanager": ("nvidia-fabricmanager-", "nvidia-fabricmanager"),
    "cuda": ("cuda-toolkit-",),
    "nccl": ("libnccl2",),
    "dcgm": ("datacenter-gpu-manager-4-core", "datacenter-gpu-manager"),
    "doca_ofed": ("doca-ofed", "doca-host"),
    "slurm": ("slurmd",),
    "pmix": ("libpmix2", "libpmix2t64", "libpmix-dev"),
}
"""Component -> packages that carry its version (a trailing ``-``: a prefix before digits),
the same names the node's ``software.versions`` check reads, plus DOCA and PMIx."""


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("@@"):
            current = out.setdefault(line[2:].strip(), [])
        elif current is not None and line.strip():
            current.append(line.strip())
    return out


def _package(installed: Mapping[str, str], names: Iterable[str]) -> str | None:
    for name in names:
        if name.endswith("-"):
            # Several CUDA toolkits may sit side by side: the newest is the one the pin moves.
            found = sorted(
                (
                    v
                    for k, v in installed.items()
                    if k.startswith(name) and k[len(name) : len(name) + 1].isdigit()
                ),
                key=release,
            )
            if found:
                return found[-1]
        elif name in installed:
            return installed[name]
    return None


def parse_query(text: str) -> dict[str, str | None] | None:
    """The components ``QUERY``'s output shows; None when the output is not QUERY's."""
    parts = _sections(text)
    if not {"driver", "dpkg", "kernel"} <= set(parts):
        return None
    installed: dict[str, str] = {}
    for line in parts["dpkg"]:
        fields = line.split("\t")
        if len(fields) >= 2 and fields[1] and (len(fields) < 3 or fields[2] == "installed"):
            installed[fields[0]] = fields[1]
    drivers = sorted(set(parts["driver"]))
    versions: dict[str, str | None] = {"nvidia_driver": ",".join(drivers) or None}
    for component, names in PACKAGES.items():
        value = _package(installed, names)
        if value is not None or component in ("fabricmanager", "cuda", "nccl", "dcgm", "slurm"):
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
