"""file_sd target groups from the expanded cluster, one per node, with topology labels.

Every target carries the labels the alert rules and the fleet view group by: ``cluster``, ``su``,
``rack``, ``leaf``, ``node_type``, ``phase`` and ``node`` (the hostname). Targets are addressed by
management address, so Prometheus needs no DNS; the scrape config rewrites ``instance`` to
``<node>:<port>``. A label that does not apply (a service node has no SU and no leaf) is left
out, which is what Prometheus does with an empty label anyway.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuforge.topology.cluster import Cluster, Node

#: Labels of every target, in this order. ``leaf`` is the leaf of the node's first rail.
TOPOLOGY_LABELS = ("cluster", "su", "rack", "leaf", "node_type", "phase", "node")


@dataclass(frozen=True)
class Exporter:
    """One exporter the generated configuration scrapes: a job name, a port and its nodes."""

    job: str
    port: int
    gpu_only: bool

    def wanted(self, gpus: int) -> bool:
        """Whether a node with ``gpus`` GPUs runs this exporter."""
        return gpus > 0 if self.gpu_only else True


#: node_exporter (Debian's prometheus-node-exporter) on every node, dcgm-exporter on GPU nodes.
EXPORTERS = (
    Exporter("node", 9100, gpu_only=False),
    Exporter("dcgm", 9400, gpu_only=True),
)


def labels(cluster: Cluster, node: Node) -> dict[str, str]:
    """The topology labels of ``node``."""
    out = {"cluster": cluster.name}
    if node.su:
        out["su"] = str(node.su)
    out["rack"] = node.rack
    if node.rails:
        out["leaf"] = node.rails[0].leaf
    out["node_type"] = node.node_type
    out["phase"] = str(node.phase)
    out["node"] = node.hostname
    return out


def target_groups(
    cluster: Cluster, exporter: Exporter, node_labels: Mapping[str, dict[str, str]] | None = None
) -> list[dict[str, Any]]:
    """The file_sd target groups of one exporter: one group per node, in cluster order.

    ``node_labels``: every node's :func:`labels`, when the caller has them already.
    """
    gpus = {name: kind.gpus for name, kind in cluster.spec.node_types.items()}
    return [
        {
            "targets": [f"{node.mgmt_address}:{exporter.port}"],
            "labels": node_labels[node.hostname] if node_labels else labels(cluster, node),
        }
        for node in cluster.nodes
        if exporter.wanted(gpus[node.node_type])
    ]


#: ``json.dumps(..., separators=(",", ":"))`` without an encoder per target group.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))


def file_sd_text(groups: Iterable[dict[str, Any]]) -> str:
    """A file_sd JSON file: one target group per line, so a diff shows the nodes that changed."""
    encode = _COMPACT_JSON.encode
    return _lines([encode(g) for g in groups])


def _lines(groups: list[str]) -> str:
    return "[\n" + ",\n".join(groups) + "\n]\n"


def file_sd_files(cluster: Cluster) -> dict[str, str]:
    """``<job>.json`` -> text for every exporter: :func:`file_sd_text` of its
    :func:`target_groups`, each node's labels encoded once for all exporters."""
    encode = _COMPACT_JSON.encode
    gpus = {name: kind.gpus for name, kind in cluster.spec.node_types.items()}
    nodes = [(node, encode(labels(cluster, node))) for node in cluster.nodes]
    files = {}
    for e in EXPORTERS:
        lines = [
            f'{{"targets":[{encode(f"{node.mgmt_address}:{e.port}")}],"labels":{text}}}'
            for node, text in nodes
            if e.wanted(gpus[node.node_type])
        ]
        files[f"{e.job}.json"] = _lines(lines)
    return files
