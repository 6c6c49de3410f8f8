"""Split a batch into shards, each with an inventory of only its hosts and the infrastructure.

A shard is the unit one ansible-runner worker runs: its inventory holds the shard's hosts plus
the infrastructure nodes (controllers, login, storage: the hosts the roles look up, e.g. the
Slurm controller's address), so ``ansible-playbook`` on an execution host loads a few hundred
hosts, not the fleet. The shard inventory is the generated layer cut down with the renderer's
own :func:`~gpuforge.inventory.render.hosts_yml_text`, beside a copy of the rest of that layer
(group_vars, slurm/, hosts, topology.json); the site layer goes along as it is.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuforge.errors import InputError
from gpuforge.inventory.reader import GENERATED, SITE, GeneratedHosts, InventoryDir
from gpuforge.inventory.render import ROLE_GROUPS, hosts_yml_text

#: Inventory groups whose hosts every shard's inventory holds (not the GPU nodes).
INFRA_GROUPS = tuple(g for role, g in ROLE_GROUPS.items() if role != "gpu")
NO_SU = "no_su"
"""The shard key of hosts in no scalable unit (infrastructure nodes, small clusters)."""


@dataclass(frozen=True, slots=True)
class Shard:
    """Hosts one worker provisions; ``key`` names it (an SU group, or ``<su>.<n>``)."""

    key: str
    hosts: tuple[str, ...]


def su_of(generated: GeneratedHosts) -> dict[str, str]:
    """host -> its scalable-unit group (``su_01``...), from the generated groups."""
    out: dict[str, str] = {}
    for group, members in generated.groups.items():
        if group.startswith("su_"):
            for host in members:
                out.setdefault(host, group)
    return out


def infra_hosts(generated: GeneratedHosts) -> list[str]:
    """The infrastructure nodes of the cluster, in inventory order."""
    seen = {h for g in INFRA_GROUPS for h in generated.groups.get(g, [])}
    return [h for h in generated.hostvars if h in seen]


def split(
    hosts: Sequence[str], su: Mapping[str, str], *, max_hosts: int | None = None
) -> list[Shard]:
    """Shards of ``hosts``: one per SU (in first-seen order), each cut to ``max_hosts`` at most.

    ``max_hosts`` alone (every host in one SU or none) gives shards of that size.
    """
    if max_hosts is not None and max_hosts < 1:
        raise InputError(f"shard size {max_hosts}: must be at least 1 host")
    by_su: dict[str, list[str]] = {}
    for host in dict.fromkeys(hosts):
        by_su.setdefault(su.get(host, NO_SU), []).append(host)
    shards: list[Shard] = []
    for key, members in by_su.items():
        size = max_hosts or len(members)
        chunks = [members[i : i + size] for i in range(0, len(members), size)]
        for n, chunk in enumerate(chunks, 1):
            shards.append(Shard(key if len(chunks) == 1 else f"{key}.{n}", tuple(chunk)))
    return shards


def write_shard_inventory(
    inv: InventoryDir, generated: GeneratedHosts, hosts: Sequence[str], out: Path
) -> list[Path]:
    """Write ``out/generated`` (the shard's hosts and the infrastructure) and ``out/site``.

    Returns the inventory sources in Ansible's order. ``out`` must not exist yet.
    """
    keep = set(hosts) | set(infra_hosts(generated))
    unknown = sorted(set(hosts) - set(generated.hostvars))
    if unknown:
        raise InputError(f"{inv.generated}/hosts.yml: no host {', '.join(unknown[:5])}")
    shard_generated = out / GENERATED
    shutil.copytree(inv.generated, shard_generated, ignore=shutil.ignore_patterns("hosts.yml"))
    hostvars = {h: v for h, v in generated.hostvars.items() if h in keep}
    groups = {g: [h for h in m if h in keep] for g, m in generated.groups.items()}
    (shard_generated / "hosts.yml").write_text(hosts_yml_text(hostvars, groups), encoding="utf-8")
    sources = [shard_generated]
    if inv.site.is_dir():
        shutil.copytree(inv.site, out / SITE)
        sources.append(out / SITE)
    return sources
