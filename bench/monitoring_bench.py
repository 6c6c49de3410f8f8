"""Benchmark: monitoring files (file_sd, Prometheus configs, spec records) for the large examples.

Not a test: prints a table. The expanded cluster is built once per spec (``gpuforge inventory
generate`` has it already); each figure is the median of ``REPEAT`` runs (environment, default 3).
The target (issue 18): file_sd and prometheus.yml for 12,500 nodes in at most 2 s. The sharded
row renders the 100k example with four Prometheus servers and remote_write. Run with ``make bench``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuforge.monitoring.prometheus import config_files
from gpuforge.monitoring.rules import records_file
from gpuforge.monitoring.targets import file_sd_files
from gpuforge.topology import load_cluster
from gpuforge.topology.cluster import Cluster
from gpuforge.topology.expand import expand
from gpuforge.topology.load import load_spec

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "topologies"
REPEAT = int(os.environ.get("REPEAT", "3"))


def _median_s(work: Callable[[], Any]) -> float:
    runs = []
    for _ in range(REPEAT):
        started = time.perf_counter()
        work()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def _sharded(name: str) -> Cluster:
    topo = load_spec(EXAMPLES / f"{name}.yaml")
    data = topo.model_dump(mode="json")
    data["monitoring"] = {
        "servers": "slurm[01-02],login[01-02]",
        "federation": True,
        "remote_write": [{"name": "mimir", "url": "https://mimir.example/api/v1/push"}],
    }
    return expand(type(topo).model_validate(data))


def main() -> int:
    """Print one row per spec: nodes, file_sd s, configs s, spec records s, file_sd MB."""
    print(f"medians of {REPEAT} runs")  # noqa: T201
    print(  # noqa: T201
        f"{'spec':<24}{'nodes':>8}{'servers':>9}{'file_sd s':>11}{'configs s':>11}"
        f"{'records s':>11}{'file_sd MB':>12}"
    )
    rows = [
        ("cluster-10k", load_cluster(EXAMPLES / "cluster-10k.yaml")),
        ("cluster-100k", load_cluster(EXAMPLES / "cluster-100k.yaml")),
        ("cluster-100k, 4 shards", _sharded("cluster-100k")),
    ]
    for name, cluster in rows:
        sd = _median_s(lambda c=cluster: file_sd_files(c))
        cfg = _median_s(lambda c=cluster: config_files(c))
        rec = _median_s(lambda c=cluster: records_file(c))
        size = sum(len(t) for t in file_sd_files(cluster).values()) / 1e6
        servers = sum(1 for k in config_files(cluster) if not k.endswith("global.yml"))
        print(  # noqa: T201
            f"{name:<24}{len(cluster.nodes):>8,}{servers:>9}{sd:>11.2f}{cfg:>11.2f}"
            f"{rec:>11.2f}{size:>12.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
