"""Specs no role could deploy fail at load, from the same rules the roles' preflight asserts."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuforge.resources import project_path
from gpuforge.topology import SpecError, load_spec
from gpuforge.topology.spec_rules import spec_rules

Data = dict[str, Any]


def _nvl72(d: Data) -> None:
    """Two nodes of four GPUs per NVLink domain: Slurm's topology/block plugin."""
    d["node_types"]["h100-sxm"]["nvlink_domain"] = 16


CASES: dict[str, tuple[Callable[[Data], None], str, str]] = {
    "cuda without patch": (
        lambda d: d["versions"].update(cuda="12.8"),
        "versions.cuda",
        "'12.8' is not a form the roles accept for cuda_toolkit_version",
    ),
    "nccl with a suffix": (
        lambda d: d["versions"].update(nccl="2.26.2-1"),
        "versions.nccl",
        "not a form the roles accept for nccl_version",
    ),
    "slurm older than configless": (
        lambda d: d["versions"].update(slurm="20.02.7"),
        "versions.slurm",
        "older than 20.11",
    ),
    "block plugin on slurm 22.05": (
        lambda d: (_nvl72(d), d["versions"].update(slurm="22.05.8")),
        "versions.slurm",
        "topology/block plugin (NVLink domains span nodes), which Slurm 22.05.8 lacks",
    ),
    "gpu model without thresholds": (
        lambda d: d["node_types"]["h100-sxm"].update(gpu_model="RTX-6000-Ada"),
        "node_types.h100-sxm.gpu_model",
        "no validation thresholds for 'RTX-6000-Ada'",
    ),
    "gateway is the network address": (
        lambda d: d["addressing"]["management"].update(gateway="10.231.0.0"),
        "addressing.management.gateway",
        "10.231.0.0 is the network address of 10.231.0.0/24",
    ),
    "gateway is the broadcast address": (
        lambda d: d["addressing"]["management"].update(gateway="10.231.0.255"),
        "addressing.management.gateway",
        "10.231.0.255 is the broadcast address of 10.231.0.0/24",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_spec_a_role_would_reject_fails_at_load(
    case: str, lab_data: Data, write_spec: Callable[[Data], Path]
) -> None:
    mutate, field, message = CASES[case]
    mutate(lab_data)
    spec = write_spec(lab_data)
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    text = str(caught.value)
    assert f": {field}: " in text and message in text, text


def test_block_plugin_is_fine_on_a_slurm_that_has_it(
    lab_data: Data, write_spec: Callable[[Data], Path]
) -> None:
    _nvl72(lab_data)
    lab_data["versions"]["slurm"] = "24.11.5"
    load_spec(write_spec(lab_data))


def test_every_role_preflight_takes_its_version_pattern_from_the_rules_file() -> None:
    """No role keeps a literal copy of a version pattern that could drift from the spec check."""
    rules = spec_rules()
    preflights = {
        p.parent.parent.name: p.read_text()
        for p in project_path("roles").glob("*/tasks/preflight.yml")
    }
    for field, rule in rules.versions.items():
        users = [
            role
            for role, text in preflights.items()
            if re.search(rf"__{role}_spec_rules\.versions\.{field}\.pattern", text)
        ]
        assert users, f"no role's preflight asserts versions.{field} ({rule.variable})"
    variables = "|".join(re.escape(r.variable) for r in rules.versions.values())
    literal = re.compile(rf"\b({variables}|fabric_manager_version) is match\('")
    copies = [role for role, text in preflights.items() if literal.search(text)]
    assert copies == [], f"literal version patterns in {copies}"
    for role, text in preflights.items():
        if f"__{role}_spec_rules" in text:
            role_vars = project_path("roles", role, "vars", "main.yml").read_text()
            assert "_common/vars/spec_rules.yml" in role_vars, role
