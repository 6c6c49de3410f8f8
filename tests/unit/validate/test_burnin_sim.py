"""Burn-in verdicts on the lab simulator's DCGM and gpu-burn output, fault by fault.

The faults DCGM alone used to catch (a PCIe link at a lower generation, HBM bandwidth at 70 %, a
GPU held at its power cap) must be drained under a name that says the test and the GPU, with
DCGM's own explanation in the message and in the evidence, within the evidence limit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from simlab import SimRunner, state

from gpuforge.admission import verdict_reason
from gpuforge.validate import burnin
from gpuforge.validate.result import EVIDENCE_MAX, Status, decide
from gpuforge.validate.thresholds import for_sku

H100 = for_sku("H100-SXM-80GB")


def _dcgm(tmp_path: Path, faults: list[dict[str, object]]) -> list[burnin.CheckResult]:
    runner = SimRunner({"gpu001": state(faults, "gpu001", tmp_path)})
    return burnin.dcgm_diag(runner, "gpu001", level=3)


@pytest.mark.parametrize(
    ("fault", "check", "explanation", "action"),
    [
        (
            {"kind": "pcie_downtrained", "gpu": 2, "gen": 3, "width": 16},
            "gpu.dcgm_diag[pcie.gpu2]",
            "GPU 2 is running at PCI link generation 3",
            "inspect",  # reseat, as gpu.pcie_link
        ),
        (
            {"kind": "hbm_degraded", "gpu": 5, "factor": 0.8},
            "gpu.dcgm_diag[memory_bandwidth.gpu5]",
            "GPU 5 only achieved a memory bandwidth of",
            "reset_gpu",  # Xid 48's
        ),
        (
            {"kind": "throttle", "gpu": 6, "reason": "power"},
            "gpu.dcgm_diag[targeted_power.gpu6]",
            "GPU 6 Max power of",
            "reboot",  # the catalogue's default for a DCGM test
        ),
    ],
)
def test_dcgm_failure_is_named_and_explained(
    tmp_path: Path, fault: dict[str, object], check: str, explanation: str, action: str
) -> None:
    results = _dcgm(tmp_path, [{"node": "gpu001", **fault}])
    failed = {r.check: r for r in results if r.status is Status.FAIL}
    assert check in failed, [r.check for r in results]
    r = failed[check]
    assert r.action == action
    assert r.message.startswith(explanation)
    assert explanation in r.evidence  # cut around the explanation, not at the start
    assert len(r.evidence) <= EVIDENCE_MAX
    verdict = decide("gpu001", results)
    assert check in verdict.reasons
    more = f"+{len(verdict.reasons) - 1}" if len(verdict.reasons) > 1 else ""
    assert verdict_reason(verdict) == f"gpuforge:{verdict.reasons[0]}{more}:quarantine"
    assert "gpu.dcgm_diag" not in verdict.reasons


def test_dcgm_healthy_is_one_pass(tmp_path: Path) -> None:
    [r] = _dcgm(tmp_path, [])
    assert (r.check, r.status) == ("gpu.dcgm_diag", Status.PASS)


def test_dcgm_two_gpus_in_one_test(tmp_path: Path) -> None:
    faults = [
        {"node": "gpu001", "kind": "pcie_downtrained", "gpu": 1, "gen": 4, "width": 16},
        {"node": "gpu001", "kind": "pcie_downtrained", "gpu": 6, "gen": 5, "width": 8},
    ]
    failed = [r for r in _dcgm(tmp_path, faults) if r.status is Status.FAIL]
    assert [r.check for r in failed] == ["gpu.dcgm_diag[pcie.gpu1,gpu6]"]
    assert "generation 4" in failed[0].message
    assert "width 8X" in failed[0].message


def test_slow_gpu_burn_fails_the_sku_floor(tmp_path: Path) -> None:
    faults = [{"node": "gpu001", "kind": "throttle", "gpu": 3, "reason": "power"}]
    runner = SimRunner({"gpu001": state(faults, "gpu001", tmp_path)})
    results = burnin.gpu_burn_check(
        runner, "gpu001", seconds=10, gpus=8, min_gflops=H100.gpu_burn_min_gflops
    )
    by = {r.check: r for r in results}
    assert by["burnin.gpu_burn"].status is Status.PASS  # every GPU computed correctly
    low = by["burnin.gpu_burn.min_gflops"]
    assert low.status is Status.FAIL
    assert low.message.startswith("GPU 3: ")
    assert "below the SKU floor" in low.message
    assert low.expected == f">= {H100.gpu_burn_min_gflops:g} Gflop/s (SKU floor)"


def test_healthy_gpu_burn_clears_the_sku_floor(tmp_path: Path) -> None:
    runner = SimRunner({"gpu001": state([], "gpu001", tmp_path)})
    results = burnin.gpu_burn_check(
        runner, "gpu001", seconds=10, gpus=8, min_gflops=H100.gpu_burn_min_gflops
    )
    assert {r.check: r.status for r in results}["burnin.gpu_burn.min_gflops"] is Status.PASS


def test_gpu_with_locked_clocks_is_only_caught_by_the_gpu_burn_floor(tmp_path: Path) -> None:
    """37 % below its siblings, no fault reason anywhere: the SKU floor names it."""
    faults = [{"node": "gpu001", "kind": "clocks_locked", "gpu": 5, "factor": 0.63}]
    runner = SimRunner({"gpu001": state(faults, "gpu001", tmp_path)})
    [dcgm] = burnin.dcgm_diag(runner, "gpu001", level=3)
    assert dcgm.status is Status.PASS
    results = burnin.gpu_burn_check(
        runner, "gpu001", seconds=10, gpus=8, min_gflops=H100.gpu_burn_min_gflops
    )
    low = {r.check: r for r in results}["burnin.gpu_burn.min_gflops"]
    assert low.status is Status.FAIL
    assert low.message.startswith("GPU 5: ")
    # before, without a floor, a 4-node batch passed it ("within peers", no peers compared)
    unjudged = burnin.gpu_burn_check(runner, "gpu001", seconds=10, gpus=8)
    assert {r.check: r.status for r in unjudged}["burnin.gpu_burn.min_gflops"] is Status.PASS
