"""GPU health and configuration: one fact per test, judged by gpuforge.validate.checks."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpuforge.errors import InputError
from gpuforge.validate import checks, thresholds
from gpuforge.validate.acceptance import Inconclusive, parse_or_inconclusive
from gpuforge.validate.parsers import nvidia_smi_csv, nvidia_smi_xml, nvlink
from gpuforge.validate.result import excerpt

QUERY = f"nvidia-smi --query-gpu={checks.GPU_QUERY} --format=csv"
XML = "nvidia-smi -q -x"
NVLINK = "nvidia-smi nvlink -s"
KERNEL_LOG = "dmesg 2>/dev/null || journalctl -k -b --no-pager"
#: Samples, one second apart, that tell a GPU held at its power cap from one passing through it.
POWER_SAMPLE_COUNT = 3
POWER_SAMPLES = (
    f"for i in {' '.join(str(i) for i in range(POWER_SAMPLE_COUNT))}; do "
    f"nvidia-smi --query-gpu={checks.POWER_QUERY} --format=csv || exit $?; sleep 1; done"
)


def _gpu_sections(report: Any, evidence: str, detail: str) -> str:
    """What nvidia-smi said about the GPUs ``detail`` names, one line each, then the output."""
    lines = []
    for g in report.gpus:
        if g.pci_bus_id and g.pci_bus_id in detail:
            lines.append(
                f"{g.pci_bus_id}: PCIe gen {g.pcie_gen_current} (max {g.pcie_gen_max}) "
                f"x{g.pcie_width_current} (max x{g.pcie_width_max}); clocks event reasons "
                f"active: {', '.join(g.clocks_event_reasons_active) or 'none'}; "
                f"power {g.power_draw_w} W of {g.power_limit_w} W"
            )
    return "\n".join([*lines, evidence]) if lines else evidence


def _csv(node: Any) -> tuple[nvidia_smi_csv.NvidiaSmiCsv, str]:
    res = node.output(QUERY)
    return parse_or_inconclusive(nvidia_smi_csv.parse, res), res.evidence()


def _xml(node: Any) -> tuple[Any, str]:
    res = node.output(XML)
    return parse_or_inconclusive(nvidia_smi_xml.parse, res), res.evidence()


def _gpus(node: Any) -> int:
    return int(node.node_type.get("gpus") or 8)


def test_count(node: Any, record: Any) -> None:
    csv, ev = _csv(node)
    record.check("gpu.count", checks.gpu_count(csv, _gpus(node)), ev)


def test_model(node: Any, record: Any) -> None:
    model = str(node.node_type.get("gpu_model") or "")
    if not model:
        pytest.skip("no gpu_model in the inventory")
    csv, ev = _csv(node)
    record.check("gpu.model", checks.gpu_models(csv, model), ev)


def test_persistence_mode(node: Any, record: Any) -> None:
    report, ev = _xml(node)
    record.check("gpu.persistence_mode", checks.persistence_enabled(report), ev)


def test_ecc_enabled(node: Any, record: Any) -> None:
    report, ev = _xml(node)
    record.check("gpu.ecc_enabled", checks.ecc_enabled(report), ev)


def test_ecc_uncorrectable(node: Any, record: Any) -> None:
    report, ev = _xml(node)
    record.check("gpu.ecc_uncorrectable", checks.no_uncorrectable_ecc(report), ev)


def test_row_remap(node: Any, record: Any) -> None:
    report, ev = _xml(node)
    record.check("gpu.row_remap", checks.row_remap_healthy(report), ev)


def _pcie_expected(node: Any) -> tuple[int | None, int | None]:
    """The node type's PCIe generation and width (topology), else its GPU model's."""
    gen, width = node.node_type.get("pcie_gen"), node.node_type.get("pcie_width")
    model = str(node.node_type.get("gpu_model") or "")
    if model and not (gen and width):
        try:
            sku = thresholds.for_sku(model)
        except InputError:
            sku = None
        if sku is not None:
            gen, width = gen or sku.pcie_gen, width or sku.pcie_width
    return (int(gen) if gen else None, int(width) if width else None)


def test_pcie_link(node: Any, record: Any) -> None:
    report, ev = _xml(node)
    gen, width = _pcie_expected(node)
    outcome = checks.pcie_link(report, gen=gen, width=width)
    record.check("gpu.pcie_link", outcome, _gpu_sections(report, ev, outcome.detail))


def test_throttle(node: Any, record: Any) -> None:
    report, ev = _xml(node)
    outcome = checks.no_throttling(report)
    record.check("gpu.throttle", outcome, _gpu_sections(report, ev, outcome.detail))


def test_power_cap(node: Any, record: Any) -> None:
    res = node.output(POWER_SAMPLES, timeout=node.timeout + POWER_SAMPLE_COUNT)
    samples = [
        parse_or_inconclusive(nvidia_smi_csv.parse, replace(res, stdout=block))
        for block in checks.split_csv_samples(res.stdout)
    ]
    if len(samples) != POWER_SAMPLE_COUNT:
        raise Inconclusive(f"expected {POWER_SAMPLE_COUNT} samples, got {len(samples)}")
    outcome = checks.power_cap_held(samples)
    record.check("gpu.power_cap", outcome, excerpt(res.evidence(), [", Active,"]))


def test_nvlink(node: Any, record: Any) -> None:
    if not node.node_type.get("nvswitch", True) and not node.node_type.get("nvlink_links"):
        pytest.skip("node type without NVLink")
    res = node.output(NVLINK)
    status = parse_or_inconclusive(nvlink.parse, res)
    links = node.node_type.get("nvlink_links")
    outcome = checks.nvlink_all_up(
        status, gpus=_gpus(node), links_per_gpu=int(links) if links else None
    )
    record.check("gpu.nvlink", outcome, res.evidence())


def test_xid(node: Any, record: Any) -> None:
    res = node.output(KERNEL_LOG)
    outcome = checks.no_hardware_xids(res.stdout)
    record.check("gpu.xid", outcome, outcome.detail or res.evidence()[-400:])
