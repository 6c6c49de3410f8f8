"""Everything ``generated/monitoring/`` holds, rendered in one call (docs/monitoring.md), and
the ``monitoring`` inventory group with its variables, which the generate step
(:mod:`gpuforge.generate`) hands to the inventory."""

from __future__ import annotations

from typing import Any

from gpuforge.monitoring.prometheus import config_files, servers
from gpuforge.monitoring.rules import RECORDS_FILE, records_file
from gpuforge.monitoring.targets import file_sd_files
from gpuforge.topology.cluster import Cluster

#: The directory under ``generated/`` (the prometheus role reads it through ``inventory_dir``).
MONITORING_DIR = "monitoring"
#: The Prometheus (and Alertmanager) servers: the spec's monitoring.servers, else the controllers.
MONITORING_GROUP = "monitoring"


def monitoring_files(cluster: Cluster) -> dict[str, str]:
    """Relative path under ``generated/`` -> text: file_sd targets, Prometheus configs, and the
    recording rules only the spec knows (rack power budgets, expected rates, rail leaves), which
    the prometheus role installs beside the shipped alert rules."""
    files = {f"{MONITORING_DIR}/file_sd/{k}": v for k, v in file_sd_files(cluster).items()}
    files.update({f"{MONITORING_DIR}/{k}": v for k, v in config_files(cluster).items()})
    files[f"{MONITORING_DIR}/rules/{RECORDS_FILE}"] = records_file(cluster)
    return files


def monitoring_group(cluster: Cluster) -> dict[str, list[str]]:
    """The inventory group of the Prometheus servers, in shard order."""
    return {MONITORING_GROUP: [s.hostname for s in servers(cluster)]}


def monitoring_vars(cluster: Cluster) -> dict[str, Any]:
    """``group_vars/monitoring.yml``: the spec's monitoring settings for the prometheus and
    alertmanager roles (the scrape configuration itself is in ``monitoring/``)."""
    mon = cluster.spec.monitoring
    return {
        "prometheus_retention": mon.retention,
        "alertmanager_routes": [route.model_dump() for route in mon.routes],
        "gpuforge_monitoring_servers": [s.hostname for s in servers(cluster)],
    }
