"""Prometheus configurations from the expanded cluster: one per server (shard), plus a global one.

Each server named by the spec's ``monitoring.servers`` (default: the Slurm controllers) is one
shard. With more than one, every shard reads the same file_sd files and keeps the targets whose
``hashmod`` of ``cluster;rack`` is its index: a rack lives on one shard, so rack-level rules
(power against the rack budget) see the whole rack. Every shard sends alerts to every server's
Alertmanager, writes to the spec's long-term stores (``remote_write``) and, when
``monitoring.federation`` is set, a global Prometheus federates the shards' recording rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import hostlist
import yaml

from gpuforge.errors import InputError
from gpuforge.monitoring.targets import EXPORTERS
from gpuforge.topology.cluster import Cluster

#: Where the prometheus role puts the generated files on a server (Debian's /etc/prometheus).
CONFIG_DIR = "/etc/prometheus"
FILE_SD_DIR = f"{CONFIG_DIR}/file_sd"
RULES_DIR = f"{CONFIG_DIR}/rules"
PROMETHEUS_PORT = 9090
ALERTMANAGER_PORT = 9093
#: How often Prometheus re-reads the file_sd files (it also watches them with inotify).
FILE_SD_REFRESH = "5m"
#: Recording rules follow Prometheus' level:metric:operations naming; the global server
#: federates only those, never the raw per-GPU series.
FEDERATE_MATCH = '{__name__=~"[a-z_]+:[a-z_0-9]+(:[a-z_0-9]+)*"}'


@dataclass(frozen=True)
class Server:
    """One Prometheus server: its host, management address and shard index."""

    hostname: str
    address: str
    shard: int


def servers(cluster: Cluster) -> list[Server]:
    """The Prometheus servers in shard order (the spec's ``monitoring.servers`` order)."""
    expr = cluster.spec.monitoring.servers
    if expr is None:
        names = [n.hostname for n in cluster.nodes if n.role == "controller"]
    else:
        names = hostlist.expand_hostlist(expr)
    try:
        return [Server(n, cluster.node(n).mgmt_address, i) for i, n in enumerate(names)]
    except KeyError as exc:
        raise InputError(f"monitoring.servers: {exc.args[0]} is not a node of the spec") from exc


def _scrape_job(job: str, shards: int, shard: int) -> dict[str, Any]:
    relabel: list[dict[str, Any]] = [
        {
            # instance = <node>:<port>, as readable as a hostname target without needing DNS.
            "source_labels": ["node", "__address__"],
            "regex": r"(.+);.+:(\d+)",
            "target_label": "instance",
            "replacement": "${1}:${2}",
        }
    ]
    if shards > 1:
        relabel += [
            {
                "source_labels": ["cluster", "rack"],
                "modulus": shards,
                "target_label": "__tmp_shard",
                "action": "hashmod",
            },
            {"source_labels": ["__tmp_shard"], "regex": str(shard), "action": "keep"},
        ]
    return {
        "job_name": job,
        "file_sd_configs": [
            {"files": [f"{FILE_SD_DIR}/{job}.json"], "refresh_interval": FILE_SD_REFRESH}
        ],
        "relabel_configs": relabel,
    }


def _remote_write(cluster: Cluster) -> list[dict[str, Any]]:
    return [{"name": rw.name, "url": rw.url} for rw in cluster.spec.monitoring.remote_write]


def server_config(
    cluster: Cluster, server: Server, all_servers: Sequence[Server]
) -> dict[str, Any]:
    """The ``prometheus.yml`` of ``server`` as data."""
    mon = cluster.spec.monitoring
    shards = len(all_servers)
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": mon.scrape_interval,
            "evaluation_interval": mon.evaluation_interval,
            "external_labels": {
                "cluster": cluster.name,
                "prometheus": server.hostname,
                "shard": str(server.shard),
            },
        },
        "alerting": {
            "alertmanagers": [
                {
                    "static_configs": [
                        {"targets": [f"{s.address}:{ALERTMANAGER_PORT}" for s in all_servers]}
                    ]
                }
            ]
        },
        "rule_files": [f"{RULES_DIR}/*.yml"],
        "scrape_configs": [
            {
                "job_name": "prometheus",
                "static_configs": [
                    {
                        "targets": [f"localhost:{PROMETHEUS_PORT}"],
                        "labels": {"cluster": cluster.name, "node": server.hostname},
                    }
                ],
            },
            {
                "job_name": "alertmanager",
                "static_configs": [
                    {
                        "targets": [f"localhost:{ALERTMANAGER_PORT}"],
                        "labels": {"cluster": cluster.name, "node": server.hostname},
                    }
                ],
            },
            *(_scrape_job(e.job, shards, server.shard) for e in EXPORTERS),
        ],
    }
    remote = _remote_write(cluster)
    if remote:
        config["remote_write"] = remote
    return config


def global_config(cluster: Cluster, all_servers: Sequence[Server]) -> dict[str, Any]:
    """A global Prometheus that federates the shards' recording rules (``/federate``)."""
    mon = cluster.spec.monitoring
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": mon.scrape_interval,
            "evaluation_interval": mon.evaluation_interval,
            "external_labels": {"cluster": cluster.name, "prometheus": "global"},
        },
        "scrape_configs": [
            {
                "job_name": "federate",
                "honor_labels": True,
                "metrics_path": "/federate",
                "params": {"match[]": [FEDERATE_MATCH, '{__name__="up"}']},
                "static_configs": [
                    {
                        "targets": [f"{s.address}:{PROMETHEUS_PORT}"],
                        "labels": {"shard": str(s.shard)},
                    }
                    for s in all_servers
                ],
            }
        ],
    }
    remote = _remote_write(cluster)
    if remote:
        config["remote_write"] = remote
    return config


def _dump(data: dict[str, Any], title: str) -> str:
    return (
        f"# {title}\n# Generated by gpuforge from the topology spec; do not edit.\n"
        + yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=100)
    )


def config_files(cluster: Cluster) -> dict[str, str]:
    """``prometheus/<server>.yml`` per server and ``prometheus/global.yml`` if federated."""
    all_servers = servers(cluster)
    shards = len(all_servers)
    files = {
        f"prometheus/{s.hostname}.yml": _dump(
            server_config(cluster, s, all_servers),
            f"Prometheus {s.hostname}: shard {s.shard} of {shards} of cluster {cluster.name}",
        )
        for s in all_servers
    }
    if cluster.spec.monitoring.federation:
        files["prometheus/global.yml"] = _dump(
            global_config(cluster, all_servers),
            f"Global Prometheus of cluster {cluster.name}: federates {shards} shard(s)",
        )
    return files
