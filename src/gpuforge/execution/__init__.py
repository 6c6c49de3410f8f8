"""Scale-out: a play on a batch runs as shards on execution hosts, through ansible-runner.

The API (S2's bench and the rollout call this)::

    from gpuforge.execution import ExecutionHost, run_sharded

    result = run_sharded(
        "site.yml",                 # a playbook under playbooks/
        Path("inventory/c1"),       # the cluster directory (generated/ + site/)
        hosts,                      # the batch
        [ExecutionHost("ex1", ssh="root@ex1"), ExecutionHost("ex2", ssh="root@ex2")],
        artifact_dir=Path("reports/run-7/provision"),
        max_hosts=None,             # shards: one per SU; or at most this many hosts each
    )  # -> ShardedResult: hosts, failed, unreachable, attempts, lost_executors, artifact_bytes

``executors=None`` runs local workers on the controller, through the same transmit / worker /
process path. See docs/scaleout.md.
"""

from __future__ import annotations

from gpuforge.execution.executors import LOCAL, ExecutionHost, local_hosts, preflight
from gpuforge.execution.sharded import ShardedResult, run_sharded

__all__ = ["LOCAL", "ExecutionHost", "ShardedResult", "local_hosts", "preflight", "run_sharded"]
