"""gpuforge.lab.plan: what a lab is made of, from a spec."""

from __future__ import annotations

import pytest

from gpuforge.errors import InputError
from gpuforge.lab.plan import LabNode, LabPlan, plan_from_cluster
from gpuforge.topology import load_cluster

from ..conftest import LAB


def test_plan_from_the_lab_spec_uses_management_addresses() -> None:
    plan = plan_from_cluster(load_cluster(LAB))
    assert plan.name == "lab"
    assert plan.subnet == "10.231.0.0/24"
    assert plan.gateway == "10.231.0.1"
    assert len(plan.nodes) == 9
    assert plan.nodes[0] == LabNode("ctl01", "ctl01.lab.gpuforge.test", "controller", "10.231.0.10")


def test_names_derive_from_the_lab_name(plan: LabPlan) -> None:
    assert plan.network == "gpuforge-t"
    assert plan.mirror_name == "t-mirror"
    assert plan.container("gpu01") == "t-gpu01"


def test_mirror_takes_the_highest_free_address(plan: LabPlan) -> None:
    assert plan.mirror_address == "10.9.0.254"
    crowded = LabPlan(
        "t", "t.test", "10.9.0.0/30", "10.9.0.1", (LabNode("a", "a.t", "gpu", "10.9.0.2"),)
    )
    with pytest.raises(InputError, match="no free address"):
        _ = crowded.mirror_address


@pytest.mark.parametrize("name", ["gpu01", "gpu01.t.test", "t-gpu01"])
def test_node_lookup_by_any_name(plan: LabPlan, name: str) -> None:
    assert plan.node(name).hostname == "gpu01"


def test_unknown_node_lists_the_known_ones(plan: LabPlan) -> None:
    with pytest.raises(InputError, match="nodes: ctl01, gpu01"):
        plan.node("gpu99")


def test_address_outside_the_subnet_is_refused() -> None:
    bad = LabPlan(
        "t", "t.test", "10.9.0.0/24", "10.9.0.1", (LabNode("a", "a.t", "gpu", "10.8.0.5"),)
    )
    with pytest.raises(InputError, match=r"outside 10\.9\.0\.0/24"):
        bad.validate()


def test_two_nodes_on_one_address_are_refused() -> None:
    node = LabNode("a", "a.t", "gpu", "10.9.0.5")
    bad = LabPlan(
        "t", "t.test", "10.9.0.0/24", "10.9.0.1", (node, LabNode("b", "b.t", "gpu", "10.9.0.5"))
    )
    with pytest.raises(InputError, match="share a management address"):
        bad.validate()
