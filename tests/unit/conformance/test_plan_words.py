"""Why a node was not checked, in an operator's words: busy only when a job runs on it."""

from __future__ import annotations

import pytest

from gpuforge.conformance import plan
from gpuforge.slurm.control import SlurmNode


@pytest.mark.parametrize(
    ("node", "why"),
    [
        (SlurmNode("n", "ALLOCATED"), "busy (ALLOCATED)"),
        (SlurmNode("n", "MIXED", ("COMPLETING",)), "busy (MIXED+COMPLETING)"),
        (SlurmNode("n", "DOWN", ("NOT_RESPONDING",)), "down (DOWN+NOT_RESPONDING)"),
        (SlurmNode("n", "IDLE", ("NOT_RESPONDING",)), "down (IDLE+NOT_RESPONDING)"),
        (
            SlurmNode("n", "DOWN", ("NOT_RESPONDING",), fields={"SlurmdStartTime": "None"}),
            "not deployed yet (DOWN+NOT_RESPONDING)",
        ),
        (SlurmNode("n", "FUTURE"), "not deployed yet (FUTURE)"),
        (SlurmNode("n", "RESERVED"), "in a maintenance reservation (RESERVED)"),
        (SlurmNode("n", "IDLE", ("MAINT",)), "in a maintenance reservation (IDLE+MAINT)"),
    ],
)
def test_not_checked_reasons(node: SlurmNode, why: str) -> None:
    selection = plan.select(["n"], {"n": node})
    assert selection.idle == ()
    assert selection.skipped == {"n": why}


def test_idle_is_checked_and_absent_is_not_in_slurm() -> None:
    selection = plan.select(["a", "b"], {"a": SlurmNode("a", "IDLE")})
    assert selection.idle == ("a",)
    assert selection.skipped == {"b": "not in Slurm"}
