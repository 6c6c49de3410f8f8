"""A two-node lab plan written by hand."""

from __future__ import annotations

import pytest

from gpuforge.lab.plan import LabNode, LabPlan


@pytest.fixture
def plan() -> LabPlan:
    return LabPlan(
        name="t",
        domain="t.test",
        subnet="10.9.0.0/24",
        gateway="10.9.0.1",
        nodes=(
            LabNode("ctl01", "ctl01.t.test", "controller", "10.9.0.10"),
            LabNode("gpu01", "gpu01.t.test", "gpu", "10.9.0.11"),
        ),
    )
