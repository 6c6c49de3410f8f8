"""Slurm configuration derived from the cluster: nodes.conf (nodes, partitions) and topology.conf.

The generate step (:mod:`gpuforge.generate`) writes what :func:`slurm_files` returns under
``generated/slurm/``; the slurm role installs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby

from jinja2 import Environment, PackageLoader, StrictUndefined

from gpuforge.topology.cluster import Cluster, Node, compress, su_tag

_ENV = Environment(  # noqa: S701 - renders Slurm files, not HTML
    loader=PackageLoader("gpuforge.slurm", "templates"),
    undefined=StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)


@dataclass(frozen=True, slots=True)
class NodeLine:
    """One NodeName line: nodes with identical attributes."""

    nodes: str
    cpus: int
    sockets: int
    cores_per_socket: int
    threads_per_core: int
    real_memory: int
    gres: str
    features: str


@dataclass(frozen=True, slots=True)
class SwitchLine:
    """One SwitchName (tree) or BlockName (block) line."""

    name: str
    nodes: str = ""
    switches: str = ""


def node_lines(cluster: Cluster) -> list[NodeLine]:
    """GPU nodes grouped by node type and rack (which implies the SU), in cluster order."""
    lines = []
    types = cluster.spec.node_types
    gpu = [n for n in cluster.nodes if n.role == "gpu"]
    for (type_name, rack, su), members in groupby(gpu, key=lambda n: (n.node_type, n.rack, n.su)):
        kind = types[type_name]
        lines.append(
            NodeLine(
                nodes=compress([n.hostname for n in members]),
                cpus=kind.sockets * kind.cores_per_socket * kind.threads_per_core,
                sockets=kind.sockets,
                cores_per_socket=kind.cores_per_socket,
                threads_per_core=kind.threads_per_core,
                real_memory=kind.memory_mb,
                gres=f"gpu:{kind.slurm_gres_type}:{kind.gpus}",
                features=f"{su_tag(cluster, su)},{rack}",
            )
        )
    return lines


def nodes_conf(cluster: Cluster) -> str:
    """The NodeName and PartitionName lines for slurm.conf to include."""
    gpu = [n.hostname for n in cluster.nodes if n.role == "gpu"]
    return _ENV.get_template("nodes.conf.j2").render(
        cluster=cluster.name, lines=node_lines(cluster), partition_nodes=compress(gpu)
    )


def tree_switches(cluster: Cluster) -> list[SwitchLine]:
    """Tree plugin switches, lowest level first.

    Rail-optimized: the nodes of an SU share one set of leaves (one per rail), so Slurm sees
    one lowest-level switch per SU (``leaf-su01``). Otherwise each physical leaf is one.
    Above: one switch per three-tier pod, and one top switch.
    """
    plan = cluster.fabric
    gpu = [n for n in cluster.nodes if n.role == "gpu"]
    lines: list[SwitchLine] = []
    lowest: list[tuple[str, int]] = []  # (switch name, pod)

    def group_key(n: Node) -> str:
        return f"leaf-{su_tag(cluster, n.su)}" if plan.rail_optimized else n.rails[0].leaf

    for name, members in groupby(gpu, key=group_key):
        nodes = list(members)
        lines.append(SwitchLine(name, nodes=compress([n.hostname for n in nodes])))
        pod = (nodes[0].su - 1) // plan.sus_per_pod + 1 if plan.tiers == 3 else 0
        lowest.append((name, pod))
    if plan.tiers == 2:
        lines.append(SwitchLine("spine", switches=compress([name for name, _ in lowest])))
        return lines
    width = max(2, len(str(plan.pods)))
    pods = []
    for pod, in_pod in groupby(lowest, key=lambda item: item[1]):
        pod_name = f"spine-p{pod:0{width}d}"
        pods.append(pod_name)
        lines.append(SwitchLine(pod_name, switches=compress([name for name, _ in in_pod])))
    lines.append(SwitchLine("core", switches=compress(pods)))
    return lines


def nvlink_blocks(cluster: Cluster) -> list[SwitchLine]:
    """Block plugin: one block per multi-node NVLink domain (an NVL72 rack)."""
    gpu = [n for n in cluster.nodes if n.role == "gpu"]
    width = max(3, len(str(gpu[-1].nvlink_block if gpu else 0)))
    return [
        SwitchLine(f"nvl{block:0{width}d}", nodes=compress([n.hostname for n in members]))
        for block, members in groupby(gpu, key=lambda n: n.nvlink_block)
    ]


def block_sizes(cluster: Cluster, blocks: int, base: int) -> list[int]:
    """Base block size, then its power-of-two multiples that the cluster can fill."""
    del cluster
    sizes, size = [], base
    while size <= base * blocks:
        sizes.append(size)
        size *= 2
    return sizes


def topology_conf(cluster: Cluster) -> str:
    """topology.conf for the tree plugin, or the block plugin for NVL72-style domains."""
    if cluster.topology_plugin == "block":
        blocks = nvlink_blocks(cluster)
        base = len([n for n in cluster.nodes if n.nvlink_block == 1])
        return _ENV.get_template("topology-block.conf.j2").render(
            cluster=cluster.name,
            blocks=blocks,
            sizes=",".join(str(s) for s in block_sizes(cluster, len(blocks), base)),
        )
    return _ENV.get_template("topology-tree.conf.j2").render(
        cluster=cluster.name, switches=tree_switches(cluster), tiers=cluster.fabric.tiers
    )


def slurm_files(cluster: Cluster) -> dict[str, str]:
    """Relative path under ``generated/`` -> text: ``slurm/nodes.conf``, ``slurm/topology.conf``."""
    return {"slurm/nodes.conf": nodes_conf(cluster), "slurm/topology.conf": topology_conf(cluster)}
