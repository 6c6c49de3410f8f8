"""NCCL acceptance: per-node and multi-node all_reduce against floors, and culprit localization.

- :mod:`.plan`: which collectives a batch runs, from the topology (:func:`acceptance_plan`);
- :mod:`.localize`: who (or which link) is to blame when one underperforms (:class:`Localizer`);
- :mod:`.srun`: running nccl-tests, node-local and across nodes through ``srun``;
- :mod:`.fabric`: fabric findings named by switch or rail from ``topology.json``.
"""

from __future__ import annotations

from gpuforge.validate.nccl.findings import FabricMap, merge_findings
from gpuforge.validate.nccl.localize import (
    CollectiveRun,
    Group,
    Localization,
    Localizer,
    RunCollective,
    localization_results,
    run_bound,
)
from gpuforge.validate.nccl.plan import FabricNode, PlannedTest, acceptance_plan
from gpuforge.validate.nccl.srun import (
    CollectiveUnavailable,
    SrunCollective,
    judge_single_node,
    largest_busbw,
    single_node_command,
)

__all__ = [
    "CollectiveRun",
    "CollectiveUnavailable",
    "FabricMap",
    "FabricNode",
    "Group",
    "Localization",
    "Localizer",
    "PlannedTest",
    "RunCollective",
    "SrunCollective",
    "acceptance_plan",
    "judge_single_node",
    "largest_busbw",
    "localization_results",
    "merge_findings",
    "run_bound",
    "single_node_command",
]
