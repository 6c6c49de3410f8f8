"""Monitoring generated from the topology: file_sd targets, Prometheus configs, shards.

:mod:`gpuforge.monitoring.targets` turns the expanded cluster into file_sd target groups with
topology labels; :mod:`gpuforge.monitoring.prometheus` renders one ``prometheus.yml`` per
Prometheus server (one shard each) and, when asked, a global one that federates them.
``gpuforge inventory generate`` writes both into ``generated/monitoring/`` (docs/monitoring.md).
"""

from __future__ import annotations
