"""A complete health.yaml in docs/health.md's shape, to break one key at a time."""

from __future__ import annotations

import pytest

SAMPLE = """\
version: 1
node: gpu01
collector: {url: "http://10.231.0.1:9477", timeout_s: 2}
sysfs_root: /sys
expect:
  gpus: 8
  gpu_model: H100-SXM-80GB
  nvlink_links_per_gpu: 18
  pcie: {gen: 5, width: 16}
  rails: [{device: mlx5_0, port: 1, netdev: ib0, rate_gbps: 400, mtu: 4096}]
  versions: {driver: "550.90.07", cuda: "12.4", nccl: "2.21.5", dcgm: "3.3.6",
             fabricmanager: "550.90.07", slurm: "22.05"}
  services: [nvidia-persistenced, nvidia-fabricmanager, nvidia-dcgm, slurmd]
tiers:
  passive: {timeout_s: 10}
  prolog:  {timeout_s: 2}
  epilog:  {timeout_s: 60}
checks:
  gpu.xid:        {enabled: true, shadow: false, fail_after: 1, pass_after: 1}
  fabric.counters: {enabled: true, shadow: false, fail_after: 2, pass_after: 3, window_s: 3600,
                    max: {symbol_error: 10, link_downed: 1, port_rcv_errors: 10,
                          port_xmit_discards: 100}}
  fabric.flaps:   {enabled: true, down_s: 240, flaps: 3, window_h: 12}
"""


@pytest.fixture
def sample_yaml() -> str:
    """The example health.yaml of docs/health.md."""
    return SAMPLE
