"""Everything ``generated/monitoring/`` holds, rendered in one call (docs/monitoring.md)."""

from __future__ import annotations

from gpuforge.monitoring.prometheus import config_files
from gpuforge.monitoring.rules import RECORDS_FILE, records_file
from gpuforge.monitoring.targets import file_sd_files
from gpuforge.topology.cluster import Cluster

#: The directory under ``generated/`` (the prometheus role reads it through ``inventory_dir``).
MONITORING_DIR = "monitoring"


def monitoring_files(cluster: Cluster) -> dict[str, str]:
    """Relative path under ``generated/`` -> text: file_sd targets, Prometheus configs, and the
    recording rules only the spec knows (rack power budgets, expected rates, rail leaves), which
    the prometheus role installs beside the shipped alert rules."""
    files = {f"{MONITORING_DIR}/file_sd/{k}": v for k, v in file_sd_files(cluster).items()}
    files.update({f"{MONITORING_DIR}/{k}": v for k, v in config_files(cluster).items()})
    files[f"{MONITORING_DIR}/rules/{RECORDS_FILE}"] = records_file(cluster)
    return files
