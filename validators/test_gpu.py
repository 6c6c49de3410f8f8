"""GPU health and configuration: one fact per test, judged by gpuforge.validate.checks."""

from __future__ import annotations

from typing import Any

import pytest

from gpuforge.validate import checks
from gpuforge.validate.conformance import parse_or_inconclusive
from gpuforge.validate.parsers import nvidia_smi_csv, nvidia_smi_xml, nvlink

QUERY = f"nvidia-smi --query-gpu={checks.GPU_QUERY} --format=csv"
XML = "nvidia-smi -q -x"
NVLINK = "nvidia-smi nvlink -s"
KERNEL_LOG = "dmesg 2>/dev/null || journalctl -k -b --no-pager"


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


def test_pcie_link(node: Any, record: Any) -> None:
    report, ev = _xml(node)
    gen = node.node_type.get("pcie_gen")
    record.check("gpu.pcie_link", checks.pcie_link(report, gen=int(gen) if gen else None), ev)


def test_throttle(node: Any, record: Any) -> None:
    report, ev = _xml(node)
    record.check("gpu.throttle", checks.no_throttling(report), ev)


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
