"""The check catalogue is the one list of checks: every path's names, thresholds and actions."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from gpuforge.node import config as cfg
from gpuforge.node import probes
from gpuforge.validate import catalogue, checks, flaps
from gpuforge.validate.parsers import dcgmi

VALIDATORS = Path(__file__).parents[3] / "validators"


def _validator_names() -> set[str]:
    """The check names the acceptance suite records, and those of its test functions."""
    names = set()
    for path in sorted(VALIDATORS.glob("test_*.py")):
        group = path.stem.removeprefix("test_")
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                names.add(f"{group}.{node.name.removeprefix('test_')}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "check"
                and node.args
            ):
                arg = node.args[0]
                if isinstance(arg, ast.Constant):
                    names.add(str(arg.value))
                elif isinstance(arg, ast.JoinedStr) and isinstance(arg.values[0], ast.Constant):
                    names.add(re.sub(r"\[$", "", str(arg.values[0].value)))
    return names


def test_every_acceptance_check_is_in_the_catalogue_and_runs_at_quick() -> None:
    names = _validator_names()
    assert "fabric.flaps" in names and "software.versions" in names  # the node checker's names
    for name in names:
        spec = catalogue.spec(name)
        assert spec is not None, name
        assert "quick" in spec.runs, name
    assert not {"fabric.link_flap", "software.driver", "software.service"} & names


def test_node_tiers_run_what_the_catalogue_says() -> None:
    assert list(cfg.CHECKS) == list(catalogue.node_checks())
    for tier, table in probes.TIERS.items():
        for name in table:
            assert tier in catalogue.BY_NAME[name].runs, (tier, name)
    for name, spec in catalogue.node_checks().items():
        for tier in set(spec.runs) & set(catalogue.NODE_TIERS):
            assert name in probes.TIERS[tier], (tier, name)
        defaults = cfg.CHECKS[name]
        assert (defaults.fail_after, defaults.pass_after, defaults.shadow) == (
            spec.fail_after,
            spec.pass_after,
            spec.shadow,
        )
        assert dict(defaults.params) == dict(spec.params)


def test_thresholds_have_one_source() -> None:
    p = catalogue.params("fabric.flaps")
    assert p["flaps"] == flaps.FLAP_CYCLES
    assert flaps.WINDOW.total_seconds() == p["window_h"] * 3600
    assert flaps.DROP_AFTER.total_seconds() == p["down_s"]
    assert catalogue.params("fabric.counters")["max"] == cfg.COUNTER_MAX


@pytest.mark.parametrize(
    ("name", "action"),
    [
        ("gpu.count", "reboot"),  # Xid 79's
        ("gpu.ecc_uncorrectable", "reset_gpu"),  # Xid 48's
        ("gpu.nvlink", "reboot"),  # Xid 74's
        ("fabric.flaps[3]", "inspect"),
        ("fabric.port[0]", "inspect"),
        ("fabric.counters", "inspect"),
        ("software.versions[nccl]", "quarantine"),
        ("software.services[slurmd]", "reboot"),
        ("burnin.gpu_burn.min_gflops", "quarantine"),
        ("not.in.catalogue", "quarantine"),
    ],
)
def test_one_action_per_check_whatever_the_instance(name: str, action: str) -> None:
    assert catalogue.action(name) == action
    assert catalogue.result_action(name, ok=True, warn=False) == ""
    assert catalogue.result_action(name, ok=False, warn=True) == "monitor"
    assert catalogue.result_action(name, ok=False, warn=False, named="rma") == "rma"


def test_the_node_and_the_acceptance_suite_give_a_failure_the_same_action() -> None:
    """The node's judged() and the suite's Recorder both call catalogue.result_action."""
    failing = checks.JudgeOutcome(False, 7, 8, "GPU missing or extra")
    node = probes.judged("gpu.count", failing, "")
    suite = catalogue.result_action("gpu.count", ok=False, warn=False, named=failing.action)
    assert (node.status, node.action) == ("fail", suite) == ("fail", "reboot")


@pytest.mark.parametrize(
    ("test", "action"),
    [
        ("Page Retirement/Row Remap", "reset_gpu"),
        ("GPU Memory", "reset_gpu"),
        ("Memory Bandwidth", "reset_gpu"),
        ("PCIe", "inspect"),
        ("Targeted Power", "reboot"),
        ("CUDA Main Library", "reboot"),
    ],
)
def test_dcgm_test_actions(test: str, action: str) -> None:
    assert catalogue.dcgm_action(test) == action


def test_dcgm_diag_action_is_the_strongest_failed_test() -> None:
    diag = dcgmi.DcgmDiag(
        format="json",
        completed=True,
        dcgm_version=None,
        driver_version=None,
        gpu_device_ids=(),
        tests=(
            dcgmi.DiagTest(
                "Integration",
                "PCIe",
                "Fail",
                (dcgmi.DiagGpuResult(2, "Fail"),),
                ("GPU 2 is running at PCI link generation 3",),
                (),
                (),
            ),
            dcgmi.DiagTest(
                "Hardware",
                "GPU Memory",
                "Fail",
                (dcgmi.DiagGpuResult(5, "Fail"),),
                ("Detected 2 volatile double-bit ECC error(s) in GPU 5.",),
                (),
                (),
            ),
        ),
        errors=(),
        warnings=(),
    )
    outcome = checks.dcgm_diag_passed(diag)
    assert not outcome.ok
    assert outcome.action == "inspect"  # PCIe's inspect outranks GPU Memory's reset_gpu
    assert [f.instance for f in checks.dcgm_failures(diag)] == ["pcie.gpu2", "gpu_memory.gpu5"]
